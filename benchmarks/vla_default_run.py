"""The default run (configs/embodied.yaml, the tiny VLA on PixelReach-v0): wall time, eval success curve, and whether
the trained model follows the words.

    python -m benchmarks.vla_default_run                              # trains (minutes), then the word-swap check
    python -m benchmarks.vla_default_run --run-dir results/embodied   # only the checks, on an existing run
    python -m benchmarks.vla_default_run --out results/bench_vla.json

Training: `rlinf_mini.train.main` with configs/embodied.yaml in this process (its workers are spawned processes), into
a temporary log folder; wall seconds from the call to its return (worker start-up and evaluations included).

Word swap: the final checkpoint's HF folder is loaded with `from_pretrained` and run greedily (eval mode) on
N eval episodes (the config's eval seed), twice on the same reset states: once with the asked instruction, once with
the other colour's instruction shown to the model. Success is always judged on the block the episode asked for.
A model that reads the words succeeds with the asked instruction and, with the swapped one, walks to the other block
(its success on the asked block falls to chance or below). The untrained initial model and a uniformly random policy
give the chance level on the same episodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIG = "configs/embodied.yaml"


def swap_colour(text: str) -> str:
    return text.replace("red", "\0").replace("blue", "red").replace("\0", "blue")


@torch.no_grad()
def word_swap_eval(policy, eval_cfg, chunks: int, n: int = 256) -> dict[str, float]:
    """Greedy success on the asked block with the asked / swapped instruction, and how often the swapped run reaches
    the block its (swapped) words name. policy: None = uniformly random actions."""
    from rlinf_mini.envs import make_env

    out = {}
    for swapped in (False, True):
        env = make_env(eval_cfg, torch.arange(n), chunks)
        obs = env.reset()
        success = torch.zeros(n, dtype=torch.bool)
        reached_named = torch.zeros(n, dtype=torch.bool)
        gen = torch.Generator().manual_seed(0)
        for _ in range(eval_cfg.max_steps_per_rollout_epoch // chunks):
            if swapped:
                obs["task_descriptions"] = [swap_colour(t) for t in obs["task_descriptions"]]
            if policy is None:
                actions = torch.randint(-1, 2, (n, chunks, 2), generator=gen).float()
            else:
                actions = policy.predict_action_batch(policy.prepare_inputs(obs), None, mode="eval")["actions"]
            obs, _, term, _, _ = env.chunk_step(actions)
            success |= term.any(dim=1)
            other = env.blocks[torch.arange(n), 1 - env.target]  # the block the swapped words name
            reached_named |= (env.agent == other).all(dim=1) & ~env.finished
        key = "swapped" if swapped else "asked"
        out[f"success_{key}"] = success.float().mean().item()
        if swapped:
            out["reached_named_block_swapped"] = reached_named.float().mean().item()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vla_default_run", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="an existing run folder (skips training)")
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument("--episodes", type=int, default=256)
    args = parser.parse_args(argv)

    from rlinf_mini.config import load_config
    from rlinf_mini.models.tiny_vla import TinyVLAPolicy
    from rlinf_mini.train import main as train_main

    report: dict = {"config": CONFIG}
    if args.run_dir:
        run_dir = Path(args.run_dir)
        init_dir = Path(load_config(["--config", str(run_dir / "config.yaml")]).actor.model.model_path)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench_vla_"))
        init_dir = tmp / "tiny_vla"
        start = time.monotonic()
        rc = train_main(["--config", CONFIG, "--runner.logger.log-path", str(tmp), "--actor.model.model-path",
                         str(init_dir), "--runner.no-progress-bar"])
        report["train_wall_s"] = round(time.monotonic() - start, 1)
        if rc != 0:
            print(f"training failed with exit code {rc}", file=sys.stderr)
            return 1
        run_dir = tmp / "embodied"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    report["eval_success_curve"] = [(r["step"], round(r["eval/success_once"], 3)) for r in rows
                                    if "eval/success_once" in r]
    cfg = load_config(["--config", str(run_dir / "config.yaml")])
    final = max((run_dir / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    chunks = cfg.actor.model.num_action_chunks
    trained = TinyVLAPolicy.from_pretrained(final / "actor" / "model").eval()
    report["checkpoint"] = str(final)
    report["trained"] = word_swap_eval(trained, cfg.env.eval, chunks, args.episodes)
    if init_dir.is_dir():
        report["untrained"] = word_swap_eval(TinyVLAPolicy.from_pretrained(init_dir).eval(), cfg.env.eval, chunks,
                                             args.episodes)
    report["random_policy"] = word_swap_eval(None, cfg.env.eval, chunks, args.episodes)

    print(f"\n{'policy':<14}{'success (asked words)':>24}{'success (swapped words)':>26}{'reached named block':>22}")
    for name in ("trained", "untrained", "random_policy"):
        if name in report:
            r = report[name]
            print(f"{name:<14}{r['success_asked']:>24.3f}{r['success_swapped']:>26.3f}"
                  f"{r['reached_named_block_swapped']:>22.3f}")
    if "train_wall_s" in report:
        print(f"\ntraining wall time: {report['train_wall_s']} s")
    print("eval success by step:", " ".join(f"{s}:{v:.2f}" for s, v in report["eval_success_curve"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
