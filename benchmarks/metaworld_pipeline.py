"""The pipeline on a real simulator: configs/metaworld_reach.yaml's rollout phase (16 MetaWorld sub-envs, the MLP)
under each placement and pipeline depth, with MetaWorld's own step cost (no latency knob), beside the ideal.

    python -m benchmarks.metaworld_pipeline                 # about 3 minutes on 2 cores
    python -m benchmarks.metaworld_pipeline --out benchmarks/metaworld_pipeline.json

Rows are measured as benchmarks/pipeline.py measures its rows: every case's runner in one cluster, one warm-up step,
then rounds of one training step each, the cases in turn within a round; a row's figure is the median over rounds of
env steps per second in the runner's `time/generate_rollouts`. The ideal comes from the two costs measured alone in
this process right before: E, one chunk step of a stage's sub-envs (MetaWorldVectorEnv.chunk_step), and P, one
inference over them (the policy's predict_action_batch): with S stages the env and the policy of different stages
overlap, so a chunk step of all stages takes at best S x max(E_S, P_S) (S = 1: E_1 + P_1), where E_S and P_S are
the costs at 16 / S sub-envs. Across env ranks (`ranks2`: two ranks of each, one per core) the ideal halves E again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.pipeline import PLACEMENTS, Case, measure

CONFIG = "configs/metaworld_reach.yaml"
N_STEPS = 128  # chunk steps per rollout epoch (the config's)


def solo_costs(num_envs: int, reps: int = 64) -> tuple[float, float]:
    """(E, P): seconds of one chunk step of `num_envs` MetaWorld sub-envs, and of one policy inference over them."""
    import torch

    from rlinf_mini.config import load_config
    from rlinf_mini.envs import make_env
    from rlinf_mini.models import build_policy

    cfg = load_config(["--config", CONFIG])
    env = make_env(cfg.env.train, torch.arange(num_envs), 1)
    policy = build_policy(cfg.actor.model, env.spec.obs_dim, env.spec.action_dim, False).eval()
    torch.set_num_threads(1)  # a rank's torch threads: cluster.threads_per_device
    obs = env.reset()
    env_s, policy_s = [], []
    with torch.no_grad():
        for _ in range(reps):
            t = time.perf_counter()
            out = policy.predict_action_batch(obs, torch.rand(num_envs, 4), mode="train")
            policy_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            obs, *_ = env.chunk_step(out["actions"])
            env_s.append(time.perf_counter() - t)
    env.close()
    return statistics.median(env_s), statistics.median(policy_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_pipeline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="measured rounds (after one warm-up)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    num_envs = 16
    costs = {n: solo_costs(n) for n in (16, 8, 4)}  # sub-envs per call: 16 (S=1), 8 (S=2 or 2 ranks), 4 (both)
    cases = [Case(p, s, 0.0, 0.0) for p in ("collocated", "hybrid", "ranks2") for s in (1, 2)]
    times, _ = measure(cases, N_STEPS, args.reps, config=CONFIG, num_envs=num_envs)

    def ideal(c: Case) -> float:
        """Env steps/s if the env and the policy of different stages overlapped perfectly."""
        ranks = 2 if c.placement == "ranks2" else 1
        e, p = costs[num_envs // ranks // c.stage_num]
        step = e + p if c.stage_num == 1 else c.stage_num * max(e, p)
        return num_envs / step  # the ranks step their halves side by side

    rows = []
    for c in cases:
        rates = [num_envs * N_STEPS / t["generate_s"] for t in times[c]]
        rows.append({"placement": c.placement, "placement_spec": PLACEMENTS[c.placement][1], "stage_num": c.stage_num,
                     "env_steps_per_s": statistics.median(rates), "rounds": rates, "ideal_env_steps_per_s": ideal(c),
                     "of_ideal": statistics.median(rates) / ideal(c)})
    base = next(r for r in rows if (r["placement"], r["stage_num"]) == ("collocated", 1))["env_steps_per_s"]
    print(f"\nMetaWorld reach-v3 rollout phase, {num_envs} sub-envs x {N_STEPS} steps (median of {args.reps} rounds); "
          f"E = one chunk step, P = one inference, alone: "
          + ", ".join(f"{n} envs E {e * 1e3:.2f} ms P {p * 1e3:.2f} ms" for n, (e, p) in costs.items()))
    print(f"{'placement':12} {'stages':>6} {'env steps/s':>12} {'ideal':>8} {'of ideal':>9} {'vs collocated 1':>16}")
    for r in rows:
        print(f"{r['placement']:12} {r['stage_num']:>6} {r['env_steps_per_s']:>12.0f} "
              f"{r['ideal_env_steps_per_s']:>8.0f} {r['of_ideal']:>9.2f} {r['env_steps_per_s'] / base:>16.2f}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report = {"config": CONFIG, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                  "cpus": len(os.sched_getaffinity(0)), "load_average_at_end": os.getloadavg(),
                  "solo_costs_s": {str(n): {"env": e, "policy": p} for n, (e, p) in costs.items()}, "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the guard matters: our workers are spawned processes that re-import the main module
    sys.exit(main())
