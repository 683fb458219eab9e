"""Create the warm-started tiny GPT-2 folder that actor.model.model_path names (reasoning).

    python -m rlinf_mini.models.make_tiny_lm --config configs/math.yaml              # to actor.model.model_path
    python -m rlinf_mini.models.make_tiny_lm --config configs/math.yaml --out DIR --sft-steps 0   # untrained

Sizes come from actor.model (hidden_dim, num_layers), the data from data.train_data_paths[0] (written first when
data.dataset_name is 'arithmetic'). The train entry runs this when the folder is missing. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from rlinf_mini.config import ConfigError, TrainConfig, load_config, max_new_tokens

SFT_STEPS = 3000  # at most: the pass stops at WARM_START_ACCURACY (configs/math.yaml, seed 1234: 300 steps)
SFT_BATCH_SIZE = 64
SFT_LR = 3e-3
# Stop when greedy exact match on the first WARM_START_CHECK train prompts (seen ones: no held-out prompt is read)
# reaches this. A fixed step count stopped mid-way up a steep rise: the same 550 steps gave held-out 0.09 to 0.52
# from one seed or CPU to the next (AVX2 vs AVX-512 rounding); a level gives the same start for every one.
WARM_START_ACCURACY = 0.4  # zero-padded sums: held-out 0.38-0.45 after it (0.5 left 0.50-0.62: above 0.55)
WARM_START_CHECK = 256


def ensure_arithmetic_data(cfg: TrainConfig) -> None:
    """Write the arithmetic train/val files when data.dataset_name is 'arithmetic' and they are missing."""
    from pathlib import Path

    from rlinf_mini.data.arithmetic import write_arithmetic_jsonl

    train, val = cfg.data.train_data_paths[0], cfg.data.val_data_paths[0]
    if cfg.data.dataset_name == "arithmetic" and not (Path(train).is_file() and Path(val).is_file()):
        write_arithmetic_jsonl(cfg.data, train, val)


def warm_start_examples(cfg: TrainConfig, tokenizer) -> tuple[list[str], list[str]]:
    """The supervised pass's (prompts, first accepted answers): the train files' rows only (data.train_data_paths),
    read as the run reads them (rlinf_mini/data: any format, the same checks and errors), never a held-out one; for
    the arithmetic task no held-out problem is in them in either order (tests/test_reasoning.py)."""
    from rlinf_mini.data.prompt_dataset import PromptDataset

    train = PromptDataset.from_files(cfg.data.train_data_paths, cfg.data, tokenizer)
    return train.prompts, [refs[0] for refs in train.answers]


def greedy_accuracy(model, tokenizer, prompts: list[str], answers: list[str], max_new: int) -> float:
    """Share of `prompts` whose greedy completion (HF generate, to <eos>) is exactly its answer: the warm start's
    stopping measure on train sums. Not the verifier: rlinf_mini/ imports nothing from stages/ (tutorial 00), and an
    arithmetic answer is its digits either way."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)  # left-padded
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == a for t, a in zip(texts, answers, strict=True)) / len(prompts)


def create_tiny_lm(cfg: TrainConfig, out: str, sft_steps: int = SFT_STEPS,
                   stop_accuracy: float = WARM_START_ACCURACY) -> list[float]:
    """Build the tiny GPT-2 from cfg.actor.model and actor.seed, warm-start it on the train prompts (until greedy
    exact match on train prompts reaches stop_accuracy, at most sft_steps steps; 0: all of them), save to `out`.
    Returns the supervised losses."""
    from rlinf_mini.models.tiny_lm import build_char_tokenizer, save_causal_lm, supervised_warm_start, tiny_gpt2

    ensure_arithmetic_data(cfg)
    tokenizer = build_char_tokenizer()
    prompts, answers = warm_start_examples(cfg, tokenizer)
    m = cfg.actor.model
    model = tiny_gpt2(len(tokenizer), m.hidden_dim, m.num_layers, n_positions=max(64, cfg.runner.seq_length),
                      seed=cfg.actor.seed)
    threads = torch.get_num_threads()
    # one thread: at this size a second one only waits, and on busy cores its spinning slows the first one down
    torch.set_num_threads(1)

    def right_often_enough(model) -> bool:
        return greedy_accuracy(model, tokenizer, prompts[:WARM_START_CHECK], answers[:WARM_START_CHECK],
                               max_new_tokens(cfg)) >= stop_accuracy

    try:
        losses = supervised_warm_start(model, tokenizer, prompts, answers, sft_steps, SFT_BATCH_SIZE, SFT_LR,
                                       seed=cfg.actor.seed, stop=right_often_enough if stop_accuracy > 0 else None)
    finally:
        torch.set_num_threads(threads)
    save_causal_lm(model, tokenizer, out)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/math.yaml", help="sizes, seed and data come from here")
    parser.add_argument("--out", default="", help="folder to create (default: the config's actor.model.model_path)")
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS,
                        help="supervised warm-start steps at most (it stops at WARM_START_ACCURACY)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(["--config", args.config])
        start = time.monotonic()
        losses = create_tiny_lm(cfg, args.out or cfg.actor.model.model_path, args.sft_steps)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = f", last loss {losses[-1]:.3f}" if losses else ""
    print(f"wrote {args.out or cfg.actor.model.model_path} ({len(losses)} supervised steps in "
          f"{time.monotonic() - start:.1f} s{last})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
