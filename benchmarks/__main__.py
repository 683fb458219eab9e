"""Every performance figure of rlinf_mini, as a ratio against the physical limit and the obvious alternative,
measured side by side in one run: each ratio is the median of repetitions in which ours, the baseline and the limit
run in turn. Prints one table (ratio as "median [min-max]") and writes JSON with every repetition and the load average
(and, with --markdown, the table of docs/performance.md).

    python -m benchmarks                   # everything, CartPole vs SB3 included, 5 repetitions
    python -m benchmarks --quick           # aims at <= 2 minutes on 2 quiet cores: 3 repetitions, fewer cases
    python -m benchmarks --markdown        # also print the table as markdown (docs/performance.md)
    python -m benchmarks --device cuda     # the GPU figures (benchmarks/gpu.py); exits 0 with a message without one
    python -m benchmarks --only channel,pipeline --out results/x.json

Rows (see docs/performance.md for what each means): channel large / small, weight sync 10M / 100M, group call round
trip, the actor's all-reduce on 2 CPU ranks (shm vs gloo), pipeline on the real runner (stage_num 2, 4 x hybrid /
disaggregated / collocated, E = P and E != P), the whole step hybrid 2 stages vs collocated 1 stage, end to end runner
vs a plain loop, tracing overhead, CartPole vs SB3.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.table import format_table

GROUPS = ("channel", "weights", "group_call", "all_reduce", "pipeline", "runner", "cartpole", "backends", "ray")

REPS = {"full": 5, "quick": 3, "tiny": 1}  # repetitions of every ratio, measured in turn; the row shows their median

SIZES = {  # per mode: message counts, parameter counts, steps (runner: MLP and VLA steps with the tracer on, and off)
    "full": {"large": 400, "small": 5000, "rtt": 1000, "weights": [10_000_000, 100_000_000], "calls": 300,
             # pipeline: chunk steps per rollout, E = P, the stage_nums of each placement, an E = 2P set too
             "pipeline": (24, 0.040, {"hybrid": (1, 2, 4), "disaggregated": (1, 2, 4), "collocated": (1, 2, 4)},
                          True), "runner": (60, 20)},
    "quick": {"large": 200, "small": 2000, "rtt": 400, "weights": [10_000_000, 100_000_000], "calls": 200,
              "pipeline": (12, 0.040, {"hybrid": (1, 2, 4)}, False), "runner": (20, 12)},
    "tiny": {"large": 8, "small": 50, "rtt": 20, "weights": [1_000_000], "calls": 5,
             "pipeline": (3, 0.002, {"hybrid": (1, 2)}, False), "runner": (2, 2)},
}


def loadavg() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages (/proc/loadavg): how busy it was while a figure ran."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:  # not Linux
        return []


def run(mode: str, groups: list[str], out_dir: Path, load: list) -> list:
    """The rows of `groups`; appends {"group", "when", "loadavg"} to `load` before and after each group."""
    from benchmarks import measure as m

    s, reps = SIZES[mode], REPS[mode]
    rows = []
    hosts = m.Hosts() if {"channel", "weights", "group_call"} & set(groups) else None
    try:
        for group in groups:
            start = time.monotonic()
            load.append({"group": group, "when": "start", "loadavg": loadavg()})
            if group == "channel":
                rows += m.channel_large(hosts, s["large"], reps) + m.channel_small(hosts, s["small"], s["rtt"], reps)
            elif group == "weights":
                for numel in s["weights"]:
                    rows += m.weight_sync(hosts, numel, reps)
            elif group == "group_call":
                rows += m.group_call(hosts, s["calls"], reps)
            elif group == "pipeline":
                from benchmarks.pipeline import Case

                n_steps, latency, placements, extra = s["pipeline"]
                sets = [[Case(p, n, latency, latency) for n in stage_nums] for p, stage_nums in placements.items()]
                # a VLA on a GPU beside a CPU simulator (docs/performance.md); waits of tens of ms keep the figures
                # readable on a machine busy with other jobs, where each wake-up can take a few ms
                env_s, policy_s = latency, latency / 2
                vla = {k: Case(p, n, env_s, policy_s, per_call=True) for k, (p, n) in
                       {"c1": ("collocated", 1), "h1": ("hybrid", 1), "h2": ("hybrid", 2)}.items()}
                if mode == "tiny":  # one cluster: the E = P pair and the whole-step pair
                    sets = [sets[0] + [vla["c1"], vla["h2"]]]
                else:
                    sets.append(list(vla.values()))
                if extra:  # E != P with both waits per env: the ideal speedup is (E + P) / max(E, P) = 1.5
                    sets.append([Case("hybrid", n, 2 * latency, latency) for n in (1, 2)])
                rows += m.pipeline(n_steps, reps, out_dir, sets)
            elif group == "runner":
                # the MLP run: tiny work per message, so the runtime's per-message cost shows; the default VLA run:
                # the work this project ships, where inference dominates and the pipeline can hide the env
                # (MLP steps vary by ~10 % from step to step, in the actor's update: many steps make its on/off stable)
                rows += m.runner_and_tracing(s["runner"][0], "configs/embodied_mlp.yaml", reps)
                if mode != "tiny":
                    rows += m.runner_and_tracing(s["runner"][1], "configs/embodied.yaml", reps)
            elif group == "all_reduce":  # the actor's gradient all-reduce on 2 CPU ranks: shm against gloo
                from benchmarks import backends as bk

                rows += bk.all_reduce(80_000, {"full": 300, "quick": 100, "tiny": 10}[mode], reps)
            elif group == "backends":  # local and inline side by side, each beside the layer below
                from benchmarks import backends as bk

                n = {"full": (300, 3000, 200), "quick": (100, 1000, 60), "tiny": (5, 20, 4)}[mode]
                rows += bk.calls_and_channels(*n, reps=reps)
                rows += bk.rank_start(4, reps)
                rows += bk.runner_rollout("configs/embodied_mlp.yaml", {"full": 10, "quick": 4, "tiny": 1}[mode], reps)
                if mode == "full":
                    rows += bk.runner_rollout("configs/embodied.yaml", 3, reps)
            elif group == "ray":  # the Ray backend (pip install -e ".[ray]"): benchmarks/ray_backend.py
                try:
                    from benchmarks.ray_backend import ray_rows
                except ImportError as e:
                    print(f"ray: skipped ({e}; pip install -e '.[ray]')", file=sys.stderr)
                    continue
                rows += ray_rows(mode)
            elif group == "cartpole":
                if mode != "full":
                    print("cartpole: skipped in --quick / --tiny (run without --quick, or python -m "
                          "benchmarks.cartpole_vs_sb3)", file=sys.stderr)
                    continue
                rows += m.cartpole(quick=False)
            load.append({"group": group, "when": "end", "loadavg": loadavg()})
            print(f"[{group}: {time.monotonic() - start:.1f} s, load {load[-1]['loadavg']}]", file=sys.stderr,
                  flush=True)
    finally:
        if hosts is not None:
            hosts.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="<= 2 minutes on 2 cores; no CartPole")
    parser.add_argument("--tiny", action="store_true", help="smoke run for the tests: tiny counts, meaningless figures")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(GROUPS)} (default: all; "
                        "--quick leaves out ray, ~55 s with its Ray session: --quick --only ray runs it)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: the GPU figures instead")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks.json"), help="JSON results file")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        from benchmarks import gpu

        return gpu.main(args.out.with_name(args.out.stem + "_gpu.json"), quick=args.quick or args.tiny)
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    if not groups:  # the optional Ray backend's rows keep --quick within its 2 minutes only when asked for
        groups = [g for g in GROUPS if not (args.quick and g == "ray")]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        print(f"--only: unknown benchmark group(s) {unknown}; choose from {','.join(GROUPS)}", file=sys.stderr)
        return 2
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)  # this process copies with one thread, like every benchmark child
    start = time.monotonic()
    load: list[dict] = []
    rows = run(mode, groups, args.out.parent, load)
    print(format_table(rows, markdown=False))
    if args.markdown:
        print()
        print(format_table(rows, markdown=True))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    report = {"mode": mode, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or None, "seconds": time.monotonic() - start,
              "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                          "torch": torch.__version__, "platform": platform.platform()},
              "repetitions": REPS[mode], "load": load,  # /proc/loadavg before and after each group
              "rows": [dataclasses.asdict(r) | {"met": r.met, "spread": r.spread} for r in rows]}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":  # the guard matters: benchmark children are spawned processes that re-import this module
    sys.exit(main())
