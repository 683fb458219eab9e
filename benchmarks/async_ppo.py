"""Async PPO vs synchronous PPO, env steps/s of a whole training step, on the real runners (issue 36, item 4).

    python -m benchmarks.async_ppo               # 3 repetitions, writes benchmarks/async_ppo.json
    python -m benchmarks.async_ppo --reps 1 --out /tmp/x.json
    python -m benchmarks.async_ppo --efficiency 3   # learning curves over 3 seeds: benchmarks/async_ppo_efficiency.json

configs/embodied_mlp.yaml's hybrid placement (env on device 0, rollout on 1, the actor on both), 2 pipeline stages,
with the three latency knobs, all sleeps (the core stays free, as when a simulator, a GPU policy and a GPU update do
the work): env.train.step_latency_s (E per chunk step of all envs), rollout.policy_latency_s (P) and
actor.train_latency_s (U per update). One batch's rollout takes about n x 2 max(E/2, P/2) = G; a synchronous step G
+ U; an async one (staleness_threshold 1) max(G, U): the ideal is the slowest stage's rate. Each repetition runs
sync, staleness 1 and staleness 2 in turn, and reads the median `time/step` of the steps after the warm-up ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.measure import Row
from benchmarks.table import format_table

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/embodied_mlp.yaml"
NUM_ENVS, N_STEPS = 32, 8  # envs, chunk steps per rollout epoch
E, P, U = 0.040, 0.020, 0.400  # a full batch's env chunk step, policy call; one update (s)
STEPS, WARMUP = 8, 3  # training steps per run; the first WARMUP are not timed (process start, first calls)


def _config(log_path: str, name: str, staleness: int | None):
    from rlinf_mini.config import load_config

    argv = ["--config", CONFIG, "--runner.logger.log-path", log_path, "--runner.logger.experiment-name", name,
            "--runner.no-progress-bar", "--runner.log-interval", "1000", "--runner.val-check-interval", "-1",
            "--runner.save-interval", "-1", "--runner.max-epochs", str(STEPS), "--rollout.pipeline-stage-num", "2",
            "--env.train.total-num-envs", str(NUM_ENVS), "--env.train.max-steps-per-rollout-epoch", str(N_STEPS),
            "--actor.global-batch-size", str(NUM_ENVS * N_STEPS), "--actor.micro-batch-size",
            str(NUM_ENVS * N_STEPS // 2), "--algorithm.update-epoch", "1",
            "--env.train.step-latency-s", repr(E / 2), "--rollout.policy-latency-s", repr(P / 2),
            "--actor.train-latency-s", repr(U)]
    if staleness is not None:
        argv += ["--algorithm.loss-type", "decoupled_actor_critic", "--algorithm.staleness-threshold", str(staleness)]
    cfg = load_config(argv)
    logger = dataclasses.replace(cfg.runner.logger, logger_backends=[])
    return dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, logger=logger))


def step_seconds(staleness: int | None) -> float:
    """The median time/step of one run's steps after the warm-up."""
    from rlinf_mini.train import RunPlan, build_and_run

    with tempfile.TemporaryDirectory(prefix="bench_async_") as log_path:
        cfg = _config(log_path, f"s{staleness}", staleness)
        history = build_and_run(cfg, RunPlan(cfg, CONFIG))
    return statistics.median(h["time/step"] for h in history[WARMUP:])


def measure(reps: int) -> tuple[list[Row], list[dict]]:
    env_steps = NUM_ENVS * N_STEPS
    generate_s = N_STEPS * 2 * max(E / 2, P / 2)  # G: the pipelined rollout's ideal (2 stages)
    ideal = env_steps / max(generate_s, U)  # the slowest stage's rate
    raw = []
    for _ in range(reps):
        raw.append({name: step_seconds(s) for name, s in (("sync", None), ("s1", 1), ("s2", 2))})
    rows = []
    for name in ("s1", "s2"):
        reps_ = [{"ours": env_steps / r[name], "baseline": env_steps / r["sync"], "limit": ideal,
                  "ratio": r["sync"] / r[name]} for r in raw]
        of_ideal = statistics.median(env_steps / r[name] / ideal for r in raw)
        rows.append(Row.from_reps(
            f"async PPO staleness {name[1]} vs sync, hybrid, 2 stages (E={E * 1e3:g} ms, P={P * 1e3:g} ms, "
            f"U={U * 1e3:g} ms)", "env steps/s", reps_, baseline_name="sync", limit_name="ideal: slowest stage",
            ratio_of="speedup", target=">= 1.5", note=f"{of_ideal:.2f} of the ideal (target >= 0.9)"))
    return rows, raw


def learning_run(staleness: int | None, seed: int, recompute: bool = False) -> dict:
    """configs/embodied_mlp.yaml as shipped (no latency knobs), seed k added to actor.seed and env.train.seed: its
    eval success_once by step, and the training seconds (time/step + time/eval summed) until the first eval >= 0.9."""
    from rlinf_mini.config import load_config
    from rlinf_mini.train import RunPlan, build_and_run

    with tempfile.TemporaryDirectory(prefix="bench_async_eff_") as log_path:
        argv = ["--config", CONFIG, "--runner.logger.log-path", log_path, "--runner.logger.logger-backends",
                "--runner.no-progress-bar", "--runner.log-interval", "1000", "--actor.seed", str(1234 + seed),
                "--env.train.seed", str(seed)]
        if staleness is not None:
            argv += ["--algorithm.loss-type", "decoupled_actor_critic", "--algorithm.staleness-threshold",
                     str(staleness)] + (["--rollout.recompute-logprobs"] if recompute else [])
        cfg = load_config(argv)
        history = build_and_run(cfg, RunPlan(cfg, CONFIG))
    evals, elapsed, to_09 = [], 0.0, None
    for h in history:
        elapsed += h.get("time/step", 0.0) + h.get("time/eval", 0.0)
        if "eval/success_once" in h:
            evals.append((h["step"], h["eval/success_once"]))
            if to_09 is None and h["eval/success_once"] >= 0.9:
                to_09 = elapsed
    return {"evals": evals, "seconds_to_0.9": to_09, "final": evals[-1][1]}


def efficiency(seeds: int) -> dict:
    """Sync, staleness 1 and 2 (interpolated anchor; "r": recomputed) over `seeds` seeds, in turn per seed."""
    runs = (("sync", None, False), ("s1", 1, False), ("s2", 2, False), ("s1r", 1, True), ("s2r", 2, True))
    return {f"seed {k}": {name: learning_run(s, k, r) for name, s, r in runs} for k in range(seeds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/async_ppo.json")
    parser.add_argument("--efficiency", type=int, metavar="SEEDS", default=0,
                        help="instead: learning curves of sync / staleness 1 / 2 over SEEDS seeds")
    args = parser.parse_args(argv)
    if args.efficiency:
        out = ROOT / "benchmarks/async_ppo_efficiency.json" if args.out == parser.get_default("out") else args.out
        result = efficiency(args.efficiency)
        for seed, runs in result.items():
            for name, r in runs.items():
                print(f"{seed} {name:4s} to 0.9: {r['seconds_to_0.9']} s, final {r['final']:.2f}, evals {r['evals']}")
        out.write_text(json.dumps({"load_avg": os.getloadavg(), "config": CONFIG, "runs": result}, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    rows, raw = measure(args.reps)
    print(format_table(rows, markdown=False))
    args.out.write_text(json.dumps({"load_avg": os.getloadavg(), "knobs": {"E": E, "P": P, "U": U},
                                    "num_envs": NUM_ENVS, "n_steps": N_STEPS, "step_seconds": raw,
                                    "rows": [dataclasses.asdict(r) for r in rows]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
