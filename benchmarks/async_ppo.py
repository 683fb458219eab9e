"""Async PPO vs synchronous PPO, env steps/s of a whole training step, on the real runners (issue 36, item 4).

    python -m benchmarks.async_ppo               # 3 repetitions, writes benchmarks/async_ppo.json
    python -m benchmarks.async_ppo --reps 1 --out /tmp/x.json
    python -m benchmarks.async_ppo --efficiency 3   # learning curves over 3 seeds: benchmarks/async_ppo_efficiency.json
    python -m benchmarks.async_ppo --efficiency 3 --knobs --runs sync,s1,s2              # ..._efficiency_knobs.json
    python -m benchmarks.async_ppo --efficiency 3 --knobs --metaworld --runs sync,s1,s2  # ..._metaworld_knobs.json
    python -m benchmarks.async_ppo --cpu-bound 20 --knobs --metaworld --runs sync,s1r  # CPU limit: ..._cpu_bound.json
    taskset -c 0 python -m benchmarks.async_ppo --cpu-bound 20 ...                     # the same on one core
    python -m benchmarks.async_ppo --efficiency 6 --metaworld --runs sync,s1r-w2 --parallel 3  # evals only, 3 at once
    CUDA_VISIBLE_DEVICES= python -m benchmarks.async_ppo --efficiency 3 --knobs --metaworld --runs sync,s1r-w2 \
        --parallel 3 --cores-per-run 4   # a 16-core machine: 3 runs at once, each on 4 cores of its own

configs/embodied_mlp.yaml's hybrid placement (env on device 0, rollout on 1, the actor on both), 2 pipeline stages,
with the three latency knobs, all sleeps (the core stays free, as when a simulator, a GPU policy and a GPU update do
the work): env.train.step_latency_s (E per chunk step of all envs), rollout.policy_latency_s (P) and
actor.train_latency_s (U per update). One batch's rollout takes about n x 2 max(E/2, P/2) = G; a synchronous step G
+ U; an async one (staleness_threshold 1) max(G, U): the ideal is the slowest stage's rate. Each repetition runs
sync, staleness 1 and staleness 2 in turn, and reads the median `time/step` of the steps after the warm-up ones.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
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


METAWORLD = "configs/metaworld_reach.yaml"
# the shipped budget (80 steps), evaluated every 10 steps (the config: every 40), so the time to 0.9 is read to 10
# steps; key=value ranks below --key value, so --cpu-bound's and --flags' settings still win (e.g. --runner.max-epochs
# 100, as the earlier JSONs' extra_flags say)
METAWORLD_FLAGS = ("runner.val_check_interval=10",)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The latency knobs of a learning run, as set on the keys (s): a sleep per env sub-step of each env object
    (env.train.step_latency_s), per policy call (rollout.policy_latency_s), per update (actor.train_latency_s)."""

    step: float
    policy: float
    train: float

    def argv(self) -> list[str]:
        return ["--env.train.step-latency-s", repr(self.step), "--rollout.policy-latency-s", repr(self.policy),
                "--actor.train-latency-s", repr(self.train)]


# per config, balanced as on a GPU box with a simulator: one batch's rollout about as long as one update (the case
# async PPO is for); the values and what they make are in docs/async_ppo.md
DEFAULT_KNOBS = {CONFIG: Knobs(0.010, 0.005, 0.600), METAWORLD: Knobs(0.002, 0.001, 0.4)}


@dataclasses.dataclass(frozen=True)
class Run:
    """One learning run's schedule: sync (staleness None) or async PPO at that bound, with the recomputed anchor
    (rollout.recompute_logprobs) or the interpolated one, and algorithm.behave_weight_threshold (None: the key's
    default, no cap)."""

    staleness: int | None
    recompute: bool = False
    behave_weight_threshold: float | None = None


def logged_run(config: str, run: Run, flags: list[str], mark) -> tuple[list, list]:
    """One run of `config` as shipped plus `flags` (sync where run.staleness is None, else async PPO at that bound,
    the recomputed anchor if run.recompute, the behaviour-weight cap if set), everything it writes in a temporary
    folder: its history and `mark()` taken at each of the runner's logged lines, in history order."""
    from rlinf_mini.config import load_config
    from rlinf_mini.runners.base import Runner
    from rlinf_mini.train import RunPlan, build_and_run

    marks: list = []
    log = Runner._log

    def marked_log(self, metrics, step, bar=None):
        marks.append(mark())
        log(self, metrics, step, bar)

    with tempfile.TemporaryDirectory(prefix="bench_async_") as log_path:
        argv = ["--config", config, "--runner.logger.log-path", log_path, "--runner.logger.logger-backends",
                "--runner.no-progress-bar", "--runner.log-interval", "1000"] + flags
        if run.staleness is not None:
            argv += ["--algorithm.loss-type", "decoupled_actor_critic", "--algorithm.staleness-threshold",
                     str(run.staleness)] + (["--rollout.recompute-logprobs"] if run.recompute else [])
        if run.behave_weight_threshold is not None:
            argv += ["--algorithm.behave-weight-threshold", repr(run.behave_weight_threshold)]
        cfg = load_config(argv)
        Runner._log = marked_log  # the runner's own line-logging, marked (restored below)
        try:
            history = build_and_run(cfg, RunPlan(cfg, config))
        finally:
            Runner._log = log
    return history, marks


def learning_run(run: Run, seed: int, config: str = CONFIG, knobs: Knobs | None = None,
                 extra: tuple[str, ...] = ()) -> dict:
    """`config` as shipped (plus the latency knobs, if given), seed k added to actor.seed and env.train.seed: its
    eval success_once by step, and the seconds until the first eval >= 0.9: `seconds_to_0.9` the time/step and
    time/eval timers summed; `wall_to_0.9` the driver's clock from the step-0 eval's line to that eval's line (what
    the timers leave out, e.g. a group call between steps that waits behind a batch in flight, counts here).
    `extra`: more flags for every run (e.g. a longer budget: --runner.max-epochs 100)."""
    flags = ["--actor.seed", str(1234 + seed), "--env.train.seed", str(seed)] + (knobs.argv() if knobs else [])
    history, clock = logged_run(config, run, flags + list(extra), time.monotonic)
    evals, elapsed, to_09, wall_to_09 = [], 0.0, None, None
    for h, t in zip(history, clock, strict=True):
        elapsed += h.get("time/step", 0.0) + h.get("time/eval", 0.0)
        if "eval/success_once" in h:
            evals.append((h["step"], h["eval/success_once"]))
            if to_09 is None and h["eval/success_once"] >= 0.9:
                to_09, wall_to_09 = elapsed, t - clock[0]
    return {"evals": evals, "seconds_to_0.9": to_09, "wall_to_0.9": wall_to_09, "final": evals[-1][1],
            "seconds_total": elapsed, "wall_total": clock[-1] - clock[0], "cores": sorted(os.sched_getaffinity(0))}


def machine_busy() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine since boot, from /proc/stat's first line (idle and iowait are
    not busy): two readings give the share of the machine's cores that were busy in between."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def cpu_run(run: Run, config: str, knobs: Knobs | None, steps: int, extra: tuple[str, ...] = ()) -> dict:
    """`steps` training steps of `config` with no evaluation: the wall time from the first step's log line to the
    last, the CPU time the whole machine spent in between (/proc/stat: so the machine must be otherwise quiet) and
    the share of this process's cores (its affinity: `taskset -c 0` runs it on one) that time fills. cpu_s / those
    cores is the least wall time that work can take on them, however well it overlaps."""
    flags = ["--runner.max-epochs", str(steps + 1), "--runner.val-check-interval", "0"] + \
        (knobs.argv() if knobs else []) + list(extra)
    history, marks = logged_run(config, run, flags, lambda: (time.monotonic(), *machine_busy()))
    (t0, b0, n0), (t1, b1, n1) = marks[0], marks[-1]  # from the end of step 1: start-up and warm-up left out
    cpu_s = (b1 - b0) / (n1 - n0) * (os.cpu_count() or 1) * (t1 - t0)
    timers = ("time/step", "time/rollout/generate", "time/actor_training")  # a stage's time, alone or beside others
    return {"steps": len(marks) - 1, "wall_s": t1 - t0, "cpu_s": cpu_s,
            "busy_share": cpu_s / len(os.sched_getaffinity(0)) / (t1 - t0),
            "median_s": {k: statistics.median(h[k] for h in history[1:]) for k in timers}}


def cpu_bound(names: list[str], config: str, knobs: Knobs | None, steps: int, extra: tuple[str, ...] = ()) -> dict:
    """Each run of `names` (as RUNS) for `steps` steps, one at a time: its wall time ÷ sync's, and the CPU limit —
    its CPU time / cores ÷ sync's wall time (its busy share x its wall ÷ sync's wall), the ratio it could reach if
    every tick of its work overlapped."""
    runs = {name: cpu_run(RUNS[name], config, knobs, steps, extra) for name in names}
    sync_wall = runs["sync"]["wall_s"]
    for r in runs.values():
        r["wall_ratio_to_sync"] = r["wall_s"] / sync_wall
        r["cpu_limit_ratio"] = r["busy_share"] * r["wall_s"] / sync_wall
    # each stage on cores of its own: a step takes the slower stage's time, the synchronous one the sum of both
    rollout, update = (runs["sync"]["median_s"][k] for k in ("time/rollout/generate", "time/actor_training"))
    runs["sync"]["overlap_limit_ratio"] = max(rollout, update) / (rollout + update)
    return runs


RUNS = {"sync": Run(None), "s1": Run(1), "s2": Run(2), "s1r": Run(1, True), "s2r": Run(2, True),
        "s1r-w2": Run(1, True, 2.0), "s2r-w2": Run(2, True, 2.0)}


def core_sets(available: list[int], parallel: int, cores_per_run: int) -> list[list[int]]:
    """`parallel` disjoint sets of `cores_per_run` of the `available` cores (this process's affinity), one per run
    going on at once, so that each run has its cores to itself and its seconds mean what a lone run's would on a
    machine of that size; cores_per_run 0: every run gets them all (they share)."""
    if cores_per_run == 0:
        return [list(available)] * parallel
    if parallel * cores_per_run > len(available):
        raise SystemExit(f"--parallel {parallel} x --cores-per-run {cores_per_run} needs "
                         f"{parallel * cores_per_run} cores; this process may use {len(available)}")
    return [available[i * cores_per_run:(i + 1) * cores_per_run] for i in range(parallel)]


def efficiency(seeds: int, names: list[str], config: str = CONFIG, knobs: Knobs | None = None, first_seed: int = 0,
               done=lambda result: None, extra: tuple[str, ...] = (), parallel: int = 1,
               cores_per_run: int = 0) -> dict:
    """The runs `names` (RUNS: sync; s1, s2 the interpolated anchor; s1r, s2r recomputed; -w2 with RLinf's
    recommended behave_weight_threshold 2.0) over `seeds` seeds from `first_seed`, one at a time, the runs in turn per
    seed; `done(result so far)` after each run. parallel > 1: that many runs at once, each in a child process
    (`--learning-run`); the evals are the same (a run's schedule of versions does not depend on the load). Their
    seconds are worth reading only with cores_per_run > 0: each child then runs pinned to its own cores (core_sets),
    and its ranks within them (the Cluster places ranks on the cores it was given)."""
    jobs = [(k, name) for k in range(first_seed, first_seed + seeds) for name in names]
    result: dict = {f"seed {k}": {} for k in range(first_seed, first_seed + seeds)}
    free: queue.Queue = queue.Queue()
    for cores in core_sets(sorted(os.sched_getaffinity(0)), parallel, cores_per_run):
        free.put(cores)

    def one(job: tuple[int, str]) -> tuple[int, str, dict]:
        k, name = job
        if parallel == 1 and cores_per_run == 0:  # in the main thread: the runner's Ctrl-C handling needs it
            return k, name, learning_run(RUNS[name], k, config, knobs, extra)
        cores = free.get_nowait()  # one per pool thread: never empty
        try:
            with tempfile.TemporaryDirectory(prefix="bench_async_run_") as tmp:
                out = Path(tmp) / "run.json"
                argv = [sys.executable, "-m", "benchmarks.async_ppo", "--learning-run", name, str(k), "--config",
                        config, "--out", str(out), f"--flags={shlex.join(extra)}"] + \
                    ([f"--knobs={','.join(map(repr, dataclasses.astuple(knobs)))}"] if knobs else []) + \
                    (["--pin", ",".join(map(str, cores))] if cores_per_run else [])
                subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
                return k, name, json.loads(out.read_text())
        finally:
            free.put(cores)

    def record(runs) -> None:  # in job order: the JSON's order does not depend on timing
        for k, name, run in runs:
            result[f"seed {k}"][name] = run
            done(result)

    if parallel == 1 and cores_per_run == 0:
        record(map(one, jobs))
    else:
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:  # threads that wait on child processes
            record(pool.map(one, jobs))
    return result


def summary(result: dict) -> dict:
    """Per run: seconds to 0.9 over the seeds, its ratio to sync's per seed (None where either never reached 0.9) and
    of the seeds' sums (None unless all reached it), the final evals (their mean and standard deviation over the
    seeds), each seed's mean of its last 3 evals, and whether every final eval lies within the synchronous finals'
    [min, max]."""
    sync_finals = [r["sync"]["final"] for r in result.values()]
    out = {}
    for name in next(iter(result.values())):
        ratios = []
        for runs in result.values():
            a, b = runs[name]["seconds_to_0.9"], runs["sync"]["seconds_to_0.9"]
            ratios.append(a / b if a is not None and b is not None else None)
        finals = [runs[name]["final"] for runs in result.values()]
        seconds = [runs[name]["seconds_to_0.9"] for runs in result.values()]
        sync_seconds = [runs["sync"]["seconds_to_0.9"] for runs in result.values()]
        of_sums = sum(seconds) / sum(sync_seconds) if None not in seconds + sync_seconds else None
        walls = [runs[name].get("wall_to_0.9") for runs in result.values()]
        sync_walls = [runs["sync"].get("wall_to_0.9") for runs in result.values()]
        wall_ratios = [a / b if a is not None and b is not None else None
                       for a, b in zip(walls, sync_walls, strict=True)]
        last3 = [statistics.fmean(e for _, e in runs[name]["evals"][-3:]) for runs in result.values()]
        out[name] = {"seconds_to_0.9": seconds, "ratio_to_sync": ratios, "ratio_of_sums": of_sums, "finals": finals,
                     "finals_mean": statistics.fmean(finals),
                     "finals_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                     "mean_of_last_3_evals": last3, "mean_of_last_3_evals_mean": statistics.fmean(last3),
                     "wall_to_0.9": walls, "wall_ratio_to_sync": wall_ratios,
                     "wall_ratio_of_sums": sum(walls) / sum(sync_walls) if None not in walls + sync_walls else None,
                     "finals_within_sync_spread": all(min(sync_finals) <= f <= max(sync_finals) for f in finals)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/async_ppo.json")
    parser.add_argument("--efficiency", type=int, metavar="SEEDS", default=0,
                        help="instead: learning curves of sync / staleness 1 / 2 over SEEDS seeds")
    parser.add_argument("--metaworld", action="store_true", help=f"--efficiency on {METAWORLD} (not {CONFIG})")
    parser.add_argument("--knobs", nargs="?", const="default", metavar="STEP,POLICY,TRAIN",
                        help="--efficiency with the latency knobs (seconds, as the keys take them; no value: the "
                             "config's balanced default, DEFAULT_KNOBS)")
    parser.add_argument("--runs", default="sync,s1,s2,s1r,s2r",
                        help="--efficiency: which runs (sync, s1, s2; s1r, s2r: the recomputed anchor; s1r-w2, "
                             "s2r-w2: and behave_weight_threshold 2.0)")
    parser.add_argument("--first-seed", type=int, default=0, help="--efficiency: seeds from this one")
    parser.add_argument("--flags", default="", metavar="'FLAG VALUE ...'",
                        help="--efficiency: more flags for every run, e.g. '--runner.max-epochs 100'")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="--efficiency: N runs at once, in child processes (same evals; the seconds mean nothing "
                             "unless --cores-per-run gives each its own cores)")
    parser.add_argument("--cores-per-run", type=int, default=0, metavar="K",
                        help="--efficiency: each run (--parallel N of them at once) pinned to K cores of its own, "
                             "so that the seconds mean what they would on a K-core machine (N x K cores needed)")
    parser.add_argument("--pin", default="", metavar="CORES", help="--learning-run: run on these cores only")
    parser.add_argument("--learning-run", nargs=2, metavar=("RUN", "SEED"),
                        help="instead: one learning run (as --efficiency's), its result as JSON in --out")
    parser.add_argument("--config", default=None, help="--learning-run: the config (default: --metaworld's choice)")
    parser.add_argument("--cpu-bound", type=int, metavar="STEPS", default=0,
                        help="instead: STEPS steps of each of --runs with no evals, wall and CPU time (quiet machine)")
    args = parser.parse_args(argv)
    config = METAWORLD if args.metaworld else CONFIG  # --cpu-bound and --efficiency
    knobs = None
    if args.knobs:
        knobs = DEFAULT_KNOBS[config] if args.knobs == "default" else Knobs(*map(float, args.knobs.split(",")))
    extra = (METAWORLD_FLAGS if args.metaworld else ()) + tuple(shlex.split(args.flags))
    if args.learning_run:  # a child of --parallel: no --metaworld, its --flags are the parent's whole `extra`
        name, seed = args.learning_run
        if args.pin:  # before the run starts anything: its fork server and ranks inherit it
            os.sched_setaffinity(0, [int(c) for c in args.pin.split(",")])
        run = learning_run(RUNS[name], int(seed), args.config or config, knobs, extra)
        args.out.write_text(json.dumps(run) + "\n")
        return 0
    load_before = os.getloadavg()
    if args.cpu_bound:
        out = ROOT / "benchmarks/async_ppo_cpu_bound.json" if args.out == parser.get_default("out") else args.out
        runs = cpu_bound(args.runs.split(","), config, knobs, args.cpu_bound, extra)
        cores = len(os.sched_getaffinity(0))
        print(f"{config}, {args.cpu_bound} steps, knobs {knobs}, {cores} of the machine's {os.cpu_count()} cores")
        print(f"{'run':5} {'wall s':>7} {'CPU s':>7} {'busy':>5} {'wall/sync':>9} {'CPU limit/sync':>14}")
        for name, r in runs.items():
            print(f"{name:5} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['busy_share']:5.2f} "
                  f"{r['wall_ratio_to_sync']:9.2f} {r['cpu_limit_ratio']:14.2f}")
        sync = runs["sync"]
        print(f"each stage on cores of its own (sync's medians: rollout {sync['median_s']['time/rollout/generate']:.2f}"
              f" s, update {sync['median_s']['time/actor_training']:.2f} s): {sync['overlap_limit_ratio']:.2f}")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                                   "cores": cores, "machine_cores": os.cpu_count(), "load_avg_before": load_before,
                                   "load_avg": os.getloadavg(), "config": config, "steps": args.cpu_bound,
                                   "extra_flags": list(extra), "knobs": dataclasses.asdict(knobs) if knobs else None,
                                   "runs": runs}, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    if args.efficiency:
        default = "benchmarks/async_ppo_efficiency" + ("_metaworld" if args.metaworld else "") + \
            ("_knobs" if knobs else "") + ".json"
        out = ROOT / default if args.out == parser.get_default("out") else args.out

        def write(result: dict, final: bool = False) -> None:  # after every run: a long run's figures are kept
            table = summary(result) if final and "sync" in names else None  # summary compares with sync
            out.write_text(json.dumps({"load_avg_before": load_before, "load_avg": os.getloadavg(), "config": config,
                                       "extra_flags": list(extra), "parallel": args.parallel,
                                       "cores_per_run": args.cores_per_run, "machine_cores": os.cpu_count(),
                                       "knobs": dataclasses.asdict(knobs) if knobs else None, "complete": final,
                                       "summary": table, "runs": result}, indent=1) + "\n")

        names = args.runs.split(",")
        result = efficiency(args.efficiency, names, config, knobs, args.first_seed, write, extra, args.parallel,
                            args.cores_per_run)
        for seed, runs in result.items():
            for name, r in runs.items():
                print(f"{seed} {name:4s} to 0.9: {r['seconds_to_0.9']} s, final {r['final']:.2f}, evals {r['evals']}")
        write(result, final=True)
        table = summary(result) if "sync" in names else {}
        for name, row in table.items():
            print(f"{name:4s} ratio to sync {row['ratio_to_sync']} (of the sums {row['ratio_of_sums']}), finals "
                  f"{row['finals']} (mean {row['finals_mean']:.3f} sd {row['finals_sd']:.3f}; last 3 evals' mean "
                  f"{row['mean_of_last_3_evals_mean']:.3f}), within the sync spread: "
                  f"{row['finals_within_sync_spread']}")
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
