"""The autotune against measurement: for each regime, `rlinf_mini.autotune` profiles and ranks; then every candidate
it ranked is measured with the real runner (benchmarks/pipeline.py's `measure`: all runners in one cluster, one
warm-up step, then rounds of one training step, the candidates in turn within a round). Reported per regime: the
grid of measured step times beside the predictions, the pick, the pick's measured step time against the grid's best
(goal: within 5 %), and its predicted step time against its measured one (goal: within 20 %).

    python -m benchmarks.autotune_check                     # about 5 minutes on 2 cores
    python -m benchmarks.autotune_check --out benchmarks/autotune_check.json
    python -m benchmarks.autotune_check --regimes math --out benchmarks/autotune_check.json   # the reasoning half only

--out keeps the regimes already in the file that this run did not measure (each regime records its date, commit and
load average).

Regimes: configs/embodied_mlp.yaml (the fake reach env, the MLP) with the latency knobs set env-bound
(env.train.step_latency_s 4 ms a sub-step, rollout.policy_latency_s 0.5 ms a call), policy-bound (0.5 ms, 4 ms) and
balanced (2 ms, 2 ms); and configs/metaworld_reach.yaml, MetaWorld's own costs. The knobs are waits per call, not per
sub-env: splitting the envs into stages does not shorten them, which the autotune has to find out by measuring.
The reasoning regime, configs/math.yaml: rollout -> reward -> actor, stages = chunks a step. Its candidates are
measured REASONING_GROUP runners at a time in one cluster (all of them would not fit in memory beside the other work
of a shared machine), the groups one after the other, the pick in every group as the anchor between groups
(measure_reasoning). Where the grid's best is not the pick, the two are measured again side by side with twice the
rounds (confirm), and the goal is judged on that: with many close candidates, the grid's minimum favours a lucky one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.pipeline import measure

REGIMES = {  # name -> (config, key=value's)
    "env-bound": ("configs/embodied_mlp.yaml", ["env.train.step_latency_s=0.004", "rollout.policy_latency_s=0.0005"]),
    "policy-bound": ("configs/embodied_mlp.yaml",
                     ["env.train.step_latency_s=0.0005", "rollout.policy_latency_s=0.004"]),
    "balanced": ("configs/embodied_mlp.yaml", ["env.train.step_latency_s=0.002", "rollout.policy_latency_s=0.002"]),
    "metaworld": ("configs/metaworld_reach.yaml", []),
    "math": ("configs/math.yaml", []),
}
REASONING_GROUP = 8  # reasoning runners (3 to 5 processes each) alive at once, the pick among them


@dataclass(frozen=True)
class Candidate:
    tag: str  # names the runner's groups in the one cluster
    index: int  # its rank in the autotune's table


def check(name: str, config: str, overrides: list[str], reps: int) -> dict:
    from rlinf_mini.autotune.__main__ import autotune, table
    from rlinf_mini.autotune.profile import layout_config, quiet_config
    from rlinf_mini.config import load_config

    source = f"{config} + command line" if overrides else config
    cfg = load_config(["--config", config, *overrides])
    t = time.perf_counter()
    result = autotune(cfg, source, progress=False)
    autotune_s = time.perf_counter() - t
    print(f"\n=== {name}: {source} ({autotune_s:.0f} s to profile and rank)\n{table(result)}", flush=True)
    ranked = [r for r in result.rows if not r.refusal]
    cases = [Candidate(f"{name[:3]}{i}", i) for i in range(len(ranked))]

    def make_config(case: Candidate, log_path: str):
        return quiet_config(layout_config(cfg, ranked[case.index].layout), log_path, case.tag)

    if cfg.runner.task_type == "reasoning":
        times = measure_reasoning(cfg, ranked, cases, reps, source)
    else:
        times, _ = measure(cases, 0, reps, make_config=make_config)
    grid = []
    for case in cases:
        row = ranked[case.index]
        measured = statistics.median(t["step_s"] for t in times[case])
        grid.append({"placement": row.layout.placement(), "stages": row.layout.stages,
                     "predicted_step_s": row.prediction.step_s, "measured_step_s": measured,
                     "rounds_step_s": [t["step_s"] for t in times[case]],
                     **({"rounds_raw_step_s": [t["raw_step_s"] for t in times[case]]} if "raw_step_s" in times[case][0]
                        else {}),
                     "predicted_rollout_s": row.prediction.generate_s,
                     "measured_rollout_s": statistics.median(t["generate_s"] for t in times[case])})
    best = min(g["measured_step_s"] for g in grid)
    pick = grid[0]
    report = {"regime": name, "config": config, "overrides": overrides, "autotune_s": autotune_s,
              "costs": {"hop_s": result.costs.hop_s, "fixed_s": result.costs.fixed_s}, "grid": grid,
              "pick_vs_best": pick["measured_step_s"] / best - 1,
              "predicted_vs_measured": pick["predicted_step_s"] / pick["measured_step_s"] - 1}
    if cfg.runner.task_type == "reasoning" and pick["measured_step_s"] > best:
        report["pick_vs_best_in_grid"] = report["pick_vs_best"]
        report |= confirm(cfg, ranked, grid.index(next(g for g in grid if g["measured_step_s"] == best)), reps,
                          source)
        print(f"the grid's best re-measured beside the pick ({2 * reps} rounds, one cluster): pick vs it "
              f"{report['pick_vs_best']:+.1%} (in the grid: {report['pick_vs_best_in_grid']:+.1%})", flush=True)
    print(f"\n{'#':>2}  {'placement':44} {'stages':>6} {'predicted s':>11} {'measured s':>10} {'error':>7}  "
          f"rollout s predicted / measured")
    for i, g in enumerate(grid):
        desc = " | ".join(f"{k}: {v}" for k, v in g["placement"].items())
        err = g["predicted_step_s"] / g["measured_step_s"] - 1
        mark = "  <- pick" if i == 0 else ("  <- measured best" if g["measured_step_s"] == best else "")
        print(f"{i + 1:>2}  {desc:44} {g['stages']:>6} {g['predicted_step_s']:>11.4f} {g['measured_step_s']:>10.4f} "
              f"{err:>+7.0%}  {g['predicted_rollout_s']:.4f} / {g['measured_rollout_s']:.4f}{mark}")
    print(f"pick's measured step vs the best{' (re-measured)' if 'confirm' in report else ''}: "
          f"{report['pick_vs_best']:+.1%} (goal within 5 %: "
          f"{'met' if report['pick_vs_best'] <= 0.05 else 'MISSED'}); pick's predicted vs measured: "
          f"{report['predicted_vs_measured']:+.1%} (goal within 20 %: "
          f"{'met' if abs(report['predicted_vs_measured']) <= 0.2 else 'MISSED'})", flush=True)
    return report


def measure_reasoning(cfg, ranked: list, cases: list[Candidate], reps: int, source: str) -> dict:
    """Each case's rounds of {"step_s", "generate_s", "raw_step_s"} (time/step; time/rollout, the slowest rollout
    rank's generation), REASONING_GROUP runners at a time (profile.measure_steps: one warm-up step, then rounds).
    The pick (cases[0]) runs in every group as the anchor: a case's step_s is its own time/step scaled by the pick's
    median over all groups / the pick's in its group, so a load that changes between groups (other work on the
    machine) scales every case alike; raw_step_s is the unscaled figure."""
    from rlinf_mini.autotune.profile import measure_steps
    from rlinf_mini.autotune.reasoning import layout_config

    pick, others = cases[0], cases[1:]
    groups = [others[i:i + REASONING_GROUP - 1] for i in range(0, len(others), REASONING_GROUP - 1)] or [[]]
    raw, anchor = {}, []
    for n, group in enumerate(groups):
        rounds = measure_steps({c.tag: layout_config(cfg, ranked[c.index].layout) for c in [pick, *group]}, reps,
                               source, rounds=True)
        anchor.append(statistics.median(t["time/step"] for t in rounds[pick.tag]))
        for c in [pick, *group]:
            raw.setdefault(c, []).extend((n, t) for t in rounds[c.tag])
        print(f"  measured {1 + sum(map(len, groups[:n + 1]))} of {len(cases)} candidates", flush=True)
    overall = statistics.median(t["time/step"] for _, t in raw[pick])
    return {c: [{"step_s": t["time/step"] * overall / anchor[n], "raw_step_s": t["time/step"],
                 "generate_s": t["time/rollout"]} for n, t in raw[c]] for c in cases}


def confirm(cfg, ranked: list, best: int, reps: int, source: str) -> dict:
    """The pick and the grid's measured best, again, side by side in one cluster with twice the rounds: the best of
    many noisy medians is biased toward a lucky round (when the candidates are close, the grid's minimum is mostly
    noise), so the goal is judged on this head-to-head; the grid's figure is kept as pick_vs_best_in_grid."""
    from rlinf_mini.autotune.profile import measure_steps
    from rlinf_mini.autotune.reasoning import layout_config

    rounds = measure_steps({"pick": layout_config(cfg, ranked[0].layout),
                            "best": layout_config(cfg, ranked[best].layout)}, 2 * reps, source, rounds=True)
    med = {tag: statistics.median(t["time/step"] for t in r) for tag, r in rounds.items()}
    return {"confirm": {"best_index": best, "pick_step_s": med["pick"],
                                                       "best_step_s": med["best"]},
            "pick_vs_best": med["pick"] / med["best"] - 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.autotune_check", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="measured rounds per candidate (after one warm-up)")
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated, of: " + ", ".join(REGIMES))
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = args.regimes.split(",")
    unknown = [n for n in names if n not in REGIMES]
    if unknown:
        parser.error(f"--regimes: unknown {unknown[0]!r}; known: {', '.join(REGIMES)}")
    t = time.perf_counter()
    reports = [check(n, *REGIMES[n], args.reps) for n in names]
    print("\nsummary: regime, pick vs best measured, pick predicted vs measured")
    for r in reports:
        print(f"  {r['regime']:13} {r['pick_vs_best']:+7.1%} {r['predicted_vs_measured']:+7.1%}")
    print(f"({time.perf_counter() - t:.0f} s)")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        stamp = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                 "cpus": len(os.sched_getaffinity(0)), "load_average_at_end": os.getloadavg(), "reps": args.reps}
        out = Path(args.out)
        kept = json.loads(out.read_text()) if out.exists() else {}
        stamp_old = {k: v for k, v in kept.items() if k != "regimes"}
        regimes = [r | ({} if "date" in r else stamp_old) for r in kept.get("regimes", [])
                   if r["regime"] not in names]  # each kept regime keeps the stamp of the run that measured it
        out.write_text(json.dumps(stamp | {"regimes": regimes + [r | stamp for r in reports]}, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the guard matters: our workers are spawned processes that re-import the main module
    sys.exit(main())
