"""Create the initial tiny VLA folder (config.json, model.safetensors, tokenizer) that actor.model.model_path names.

    python -m rlinf_mini.models.make_tiny_vla --out results/tiny_vla                       # defaults of embodied.yaml
    python -m rlinf_mini.models.make_tiny_vla --config configs/embodied.yaml --out DIR     # sizes from a config

The train entry does the same when actor.model.model_path does not exist yet. Nothing is downloaded: the weights are
drawn from actor.seed and the word-level tokenizer is built locally (rlinf_mini/models/tiny_vla.py).
"""

from __future__ import annotations

import argparse
import sys

import torch

from rlinf_mini.config import ConfigError, TrainConfig, load_config


def create_tiny_vla(cfg: TrainConfig, out: str) -> None:
    """Write a freshly initialised tiny VLA for cfg.actor.model and cfg.env.train's spaces to the folder `out`."""
    from rlinf_mini.envs import get_env_spec
    from rlinf_mini.models.tiny_vla import TinyVLAPolicy, tiny_vla_config

    spec = get_env_spec(cfg.env.train, "env.train")
    if len(spec.image_shape) != 3 or spec.discrete:
        raise ValueError("actor.model.model_type: 'tiny_vla' needs an env with images and a Box action space")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.actor.seed)
        config = tiny_vla_config(cfg.actor.model, spec.action_dim, spec.image_shape, state_dim=spec.obs_dim)
        TinyVLAPolicy(config).save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to create")
    parser.add_argument("--config", default="configs/embodied.yaml", help="model sizes and env spaces come from here")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(["--config", args.config, "--actor.model.model-type", "tiny_vla"])
        create_tiny_vla(cfg, args.out)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
