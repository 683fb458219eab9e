"""The measurements behind `python -m benchmarks`: each function returns table rows, ours next to the obvious
alternative and the physical limit, measured side by side in this process's run.

Transfers run between two child processes forked from the fork server, as ranks are (the channel server, as in a
training run, lives in this driver process); every process uses one torch thread, so a figure compares transports,
not how many cores a copy may use.
A row is the median of repetitions measured in turn (ours, baseline, limit), each after a warm-up (first-touch page
faults and connection set-up are start-up costs, not throughput); the limit's memcpy is the best of three bursts.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks import bench_workers as bw
from rlinf_mini.scheduler import local, shm, tracer
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.local import ChannelServer, KernelQueues


@dataclass
class Row:
    name: str
    unit: str
    ours: float
    baseline: float | None = None
    baseline_name: str = ""
    limit: float | None = None
    limit_name: str = ""
    ratio: float | None = None  # the figure the target is about
    ratio_of: str = ""  # what the ratio divides: "ours/limit", "ours/baseline", "speedup/ideal", ...
    target: str = ""  # e.g. ">= 0.35"
    note: str = ""
    reps: list[dict] = field(default_factory=list)  # every repetition's {"ours", "baseline", "limit", "ratio"}

    @classmethod
    def from_reps(cls, name: str, unit: str, reps: list[dict], **kw) -> Row:
        """A row whose figures are the medians over `reps` (repetitions measured in turn: ours, baseline, limit)."""
        med = {k: statistics.median(r[k] for r in reps) if reps and reps[0].get(k) is not None else None
               for k in ("ours", "baseline", "limit", "ratio")}
        return cls(name, unit, med["ours"], med["baseline"], limit=med["limit"], ratio=med["ratio"], reps=reps, **kw)

    @property
    def spread(self) -> tuple[float, float] | None:
        """(min, max) of the ratio over the repetitions."""
        ratios = [r["ratio"] for r in self.reps if r.get("ratio") is not None]
        return (min(ratios), max(ratios)) if len(ratios) > 1 else None

    @property
    def met(self) -> bool | None:
        if not self.target or self.ratio is None:
            return None
        op, value = self.target.split()
        return self.ratio >= float(value) if op == ">=" else self.ratio <= float(value)


def median_call_s(call, n: int) -> float:
    """Median wall seconds of `n` calls of `call()` (a group call with its wait, a bare Ray call, ...)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def started_runner(config: str, *overrides: str):
    """A runner of `config` to measure: no eval, no checkpoints, no progress bar, a temporary run folder, its worker
    groups launched (not yet initialized); the cluster is shut down on exit. Yields (cfg, plan, runner)."""
    from rlinf_mini.config import load_config
    from rlinf_mini.scheduler.cluster import Cluster
    from rlinf_mini.train import RunPlan, launch

    with tempfile.TemporaryDirectory(prefix="bench_runner_") as log_path:
        cfg = load_config(["--config", config, "--runner.logger.log_path", log_path, "--runner.no-progress-bar",
                           "--runner.log_interval", "1000", "--runner.val_check_interval", "-1",
                           "--runner.save_interval", "-1", *overrides])
        if cfg.actor.model.model_path:  # the VLA's initial folder: made here, not in the user's results/tiny_vla
            cfg.actor.model.model_path = str(Path(log_path) / "model")
        plan = RunPlan(cfg, config)
        plan.run_dir.mkdir(parents=True)
        cluster = Cluster(cfg.cluster)
        try:
            yield cfg, plan, launch(cfg, plan, cluster)
        finally:
            cluster.shutdown()


def runner_rollout_rate(config: str, steps: int, *overrides: str) -> float:
    """The runner's rollout env steps/s (env steps / time/generate_rollouts), median over `steps` steps after a
    warm-up step, tracer off."""
    with started_runner(config, "--runner.no-trace", *overrides) as (cfg, _, runner):
        runner.init_workers()
        runner.max_steps = steps + 1
        history = runner.run()[1:]  # the first step warms up
    train = cfg.env.train
    env_steps = train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch
    return env_steps / statistics.median(h["time/generate_rollouts"] for h in history)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hosts:
    """Two long-lived child processes (pinned to cores 0 and 1 where there are two) that run bench_workers
    functions on command, plus a channel server in this process whose segments carry this run's id."""

    def __init__(self):
        self.run_id = f"{os.getpid()}-bench{secrets.token_hex(2)}"
        self.saved = os.environ.get("RLINF_MINI_RUN_ID")
        os.environ["RLINF_MINI_RUN_ID"] = self.run_id  # inherited by the hosts: every segment is swept at the end
        self.server = ChannelServer()
        # the local backend's fork server (torch imported once), as ranks start: a spawned host imported torch
        # itself, ~2.3 s of CPU each; torch.multiprocessing's context, so "tq" shares its tensors as a torch queue
        ctx = local._mp_context()
        self.shared = {"tq": ctx.Queue(4), "q": ctx.Queue(64), "q_in": ctx.Queue(), "q_out": ctx.Queue(),
                       "done": ctx.Event(), "handle_q": ctx.Queue(), "ack_q": ctx.Queue()}
        cores = sorted(os.sched_getaffinity(0))
        self.conns, self.procs = [], []
        for i in range(2):
            parent, child = ctx.Pipe()
            core = cores[i] if len(cores) >= 2 else None
            p = ctx.Process(target=bw.host_main, args=(i, core, self.shared, child, dict(os.environ)), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def channel(self, maxsize: int) -> Channel:
        name = f"bench{secrets.token_hex(3)}"
        self.server.create(name, maxsize)
        return Channel(name, KernelQueues(name, self.server.address, self.server.authkey, 120.0), 120.0)

    def submit(self, host: int, fn: str, *args) -> None:
        self.conns[host].send((fn, args))

    def result(self, host: int, timeout: float = 300.0):
        if not self.conns[host].poll(timeout):
            raise RuntimeError(f"benchmark host {host} did not answer within {timeout:g} s")
        status, value = self.conns[host].recv()
        if status != "ok":
            raise RuntimeError(f"benchmark host {host} failed:\n{value}")
        return value

    def both(self, cmd0: tuple, cmd1: tuple) -> tuple:
        """Run one command on each host at the same time; returns both results."""
        self.submit(0, *cmd0)
        self.submit(1, *cmd1)
        return self.result(0), self.result(1)

    def close(self) -> None:
        from rlinf_mini.scheduler import codec
        from rlinf_mini.scheduler.local import close_transport_resources

        for conn in self.conns:
            conn.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(2)
        for q in self.shared.values():
            if hasattr(q, "cancel_join_thread"):
                q.cancel_join_thread()
        self.server.close()
        close_transport_resources()
        codec.close_process_resources()
        shm.sweep(self.run_id)
        if self.saved is None:
            os.environ.pop("RLINF_MINI_RUN_ID", None)
        else:
            os.environ["RLINF_MINI_RUN_ID"] = self.saved


def memcpy_gbps(nbytes: int, reps: int) -> float:
    """numpy copy between two preallocated buffers of `nbytes`: the machine's single-core memory-copy speed."""
    a, b = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            np.copyto(b, a)
        best = min(best, (time.perf_counter() - start) / reps)
    return nbytes / best / 1e9


# ---------------------------------------------------------------------------------------------------------------------
# Channel


def channel_large(h: Hosts, n: int, reps: int) -> list[Row]:
    """Two rows, on 786 KB batches. The headline (the channel's own cost): ours takes each batch with channel.empty()
    and writes it in place (here: an 8-byte stamp the consumer checks), so the put sends only the segment's name;
    the baseline puts a ready batch, which the put copies into a shared segment (RLinf's and our copying put);
    torch.mp.Queue in the note. Built: the producer also copies each batch in from a source frame, as a renderer
    that draws elsewhere would; that copy is the producer's work under any transport, and it bounds the row. Limit
    of both: memcpy of 786 KB between two hot buffers, one core."""
    nbytes = 64 * 3 * 64 * 64

    def stream(producer: str, *args, stamped: bool = False, count: int = n) -> tuple:  # host 0 puts, host 1 gets
        ch = h.channel(maxsize=4)
        produced, seconds = h.both((producer, ch, count, *args), ("channel_consumer", ch, count, "k", stamped))
        return nbytes * (count - 1) / seconds / 1e9, produced  # GB/s, and what the producer returned

    zero, built = [], []
    for _ in range(reps):  # every column in turn: a busy spell hits one round, not one column
        # 10 n zero-copy messages (~30 us each): a stream of a few ms would be one scheduler hiccup away from noise
        in_place, in_place_cpu = stream("channel_producer_zero_copy", stamped=True, count=10 * n)
        put_ready, _ = stream("channel_producer", "large")
        built_in_place, built_cpu = stream("channel_producer_built", True)
        copying, copying_cpu = stream("channel_producer_built", False)
        h.shared["done"].clear()
        _, seconds = h.both(("queue_producer", "@tq", n, "large", True, "@done"),
                            ("queue_consumer", "@tq", n, "@done"))
        queue = nbytes * (n - 1) / seconds / 1e9
        limit = memcpy_gbps(nbytes, 200)
        # CPU per message (thread_time): what each side costs while it has a core, the busy machine's waits left out
        zero.append({"ours": in_place, "baseline": put_ready, "limit": limit, "ratio": in_place / limit,
                     "torch_mp_queue": queue, "producer_cpu_us": in_place_cpu * 1e6, "memcpy_us": nbytes / limit / 1e3})
        built.append({"ours": built_in_place, "baseline": copying, "limit": limit, "ratio": built_in_place / limit,
                      "producer_cpu_us": built_cpu * 1e6, "copying_producer_cpu_us": copying_cpu * 1e6,
                      "memcpy_us": nbytes / limit / 1e3})
    row = Row.from_reps("channel, large (64x3x64x64 uint8, 786 KB)", "GB/s", zero, baseline_name="copying put",
                        limit_name="memcpy", ratio_of="ours/limit", target=">= 0.6")
    med = {k: statistics.median(r[k] for r in zero) for k in zero[0]}
    row.note = (f"zero-copy put: each batch taken with Channel.empty and written in place, the put sends its "
                f"segment's name; the copying put copies a ready batch; ours/copying put = "
                f"{row.ours / row.baseline:.2f}, ours/torch.mp.Queue = {row.ours / med['torch_mp_queue']:.1f}; "
                f"producer CPU per batch {med['producer_cpu_us']:.0f} us, memcpy {med['memcpy_us']:.0f} us")
    second = Row.from_reps("channel, large: each batch copied in from a source frame first", "GB/s", built,
                           baseline_name="copying put", limit_name="memcpy", ratio_of="ours/limit")
    med = {k: statistics.median(r[k] for r in built) for k in built[0]}
    second.note = (f"the producer copies each batch in (in Channel.empty: ours; in its own tensor, then a copying "
                   f"put: baseline); ours/copying put = {second.ours / second.baseline:.2f}; producer CPU per batch "
                   f"{med['producer_cpu_us']:.0f} us (copying put {med['copying_producer_cpu_us']:.0f} us), of "
                   f"which the copy in is the producer's own work, memcpy {med['memcpy_us']:.0f} us")
    return [row, second]


def channel_small(h: Hosts, n: int, n_rtt: int, reps: int) -> list[Row]:
    stream, rtt = [], []
    for _ in range(reps):
        ch = h.channel(maxsize=64)
        _, seconds = h.both(("channel_producer", ch, n, "small"), ("channel_consumer", ch, n))
        ours = (n - 1) / seconds
        h.shared["done"].clear()
        _, seconds = h.both(("queue_producer", "@q", n, "small", False, "@done"),
                            ("queue_consumer", "@q", n, "@done"))
        queue = (n - 1) / seconds
        stream.append({"ours": ours, "baseline": queue, "ratio": ours / queue})
        ch = h.channel(maxsize=4)
        _, ours_rtt = h.both(("channel_echo", ch, n_rtt), ("channel_pinger", ch, n_rtt))
        _, queue_rtt = h.both(("queue_echo", "@q_out", "@q_in", n_rtt), ("queue_pinger", "@q_in", "@q_out", n_rtt))
        rtt.append({"ours": ours_rtt * 1e6, "baseline": queue_rtt * 1e6, "ratio": ours_rtt / queue_rtt})
    return [
        Row.from_reps("channel, small (dict of 4 scalars)", "msg/s", stream, baseline_name="pickled mp.Queue",
                      ratio_of="ours/baseline", target=">= 1.0"),
        Row.from_reps("channel, small: round trip", "us", rtt, baseline_name="pickled mp.Queue",
                      ratio_of="ours/baseline", note="put + get each way"),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Weight sync


def weight_sync(h: Hosts, numel: int, reps: int) -> list[Row]:
    """Per round: a rollout host receives a warm-up version and a timed one; then a gloo broadcast (warm-up, timed)
    between the two hosts; then memcpy of the same bytes."""
    from stages.sync import WeightSender

    nbytes = numel * 4
    model = bw.FlatModel(numel)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    rounds = []
    for _ in range(reps):
        h.submit(1, "weight_receiver", numel, 2, "@handle_q", "@ack_q")
        handle = h.shared["handle_q"].get(timeout=120)
        sender, times = WeightSender(), []
        for v in range(2):  # version 0 is the warm-up: attaching and first-touch page faults
            start = time.perf_counter()
            sender.send(model, [handle], v)
            h.shared["ack_q"].get(timeout=120)  # the rollout saw the stamp: it holds version v
            times.append(time.perf_counter() - start)
        sender.close()
        h.result(1)
        ours = nbytes / times[1] / 1e9
        port = _free_port()
        seconds, _ = h.both(("gloo_broadcast", 0, port, numel, 1), ("gloo_broadcast", 1, port, numel, 1))
        gloo = nbytes / seconds / 1e9
        limit = memcpy_gbps(nbytes, 2 if numel > 20_000_000 else 5)
        rounds.append({"ours": ours, "baseline": gloo, "limit": limit, "ratio": ours / limit})
    del model
    row = Row.from_reps(f"weight sync, {numel / 1e6:g}M float32 ({nbytes / 1e6:.0f} MB)", "GB/s", rounds,
                        baseline_name="gloo broadcast", limit_name="memcpy", ratio_of="ours/limit", target=">= 0.5")
    row.note = f"ours/gloo = {row.ours / row.baseline:.1f}; actor -> rollout buffer, until the rollout sees the stamp"
    return [row]


# ---------------------------------------------------------------------------------------------------------------------
# Group calls and the pipeline (real Cluster, WorkerGroup and Channel)


def _cluster(num_devices: int = 2):
    from rlinf_mini.config import ClusterConfig
    from rlinf_mini.scheduler.cluster import Cluster

    return Cluster(ClusterConfig(num_devices=num_devices, timeout_s=120.0))


def _strategy(name: str, devices: list[tuple[int, ...]]):
    from stages.placement import PlacementStrategy, ProcessPlacement

    return PlacementStrategy(name, tuple(ProcessPlacement(r, d) for r, d in enumerate(devices)))


def group_call(h: Hosts, n: int, reps: int) -> list[Row]:
    rounds = {1: [], 4: []}
    cluster = _cluster()
    try:
        group = bw.NoopWorker.create_group(None).launch(cluster, _strategy("noop", [(r % 2,) for r in range(4)]))
        group.noop().wait()  # start-up
        for _ in range(reps):
            _, queue_rtt = h.both(("queue_echo", "@q_out", "@q_in", n), ("queue_pinger", "@q_in", "@q_out", n))
            for ranks in (1, 4):
                call = group.execute_on(0).noop if ranks == 1 else group.noop
                rtt = median_call_s(lambda call=call: call().wait(), n) * 1e6
                rounds[ranks].append({"ours": rtt, "baseline": queue_rtt * 1e6, "ratio": rtt})
    finally:
        cluster.shutdown()
    rows = []
    for ranks, reps_of in rounds.items():
        row = Row.from_reps(f"group call round trip, no-op on {ranks} rank{'s' * (ranks > 1)}", "us", reps_of,
                            baseline_name="pickled mp.Queue RTT", ratio_of="us (absolute)", target="<= 500")
        row.note = f"ours/queue = {row.ours / row.baseline:.1f}; median of {n} calls per round"
        rows.append(row)
    return rows


def pipeline(n_steps: int, reps: int, out_dir: Path, sets: list[list]) -> list[Row]:
    """The pipeline rows and the whole-step row (benchmarks/pipeline.py): each set of cases runs in its own cluster,
    in turn per round. The hybrid stage_num 2 case with equal latencies is the target row; its timeline is drawn.
    A set holding collocated stage_num 1 and hybrid stage_num 2 with a per-call policy gives the whole-step row."""
    from benchmarks import pipeline as pl

    rows = []
    for cases in sets:
        target = next((c for c in cases if c.placement == "hybrid" and c.stage_num == 2 and c.env_s == c.policy_s
                       and not c.per_call), None)
        times, spans = pl.measure(cases, n_steps, reps, trace=target)
        png = None
        steps = sorted((s for s in spans if s[2] == "env_step"), key=lambda s: s[4])
        if target is not None and steps:
            mid = len(steps) // 2  # a few chunk steps from the middle of the rollout: the pipeline at its steady state
            t0, t1 = steps[max(0, mid - 4)][4], steps[min(len(steps) - 1, mid + 3)][5]
            window = [(*s[:4], max(s[4], t0), min(s[5], t1)) for s in spans if s[5] >= t0 and s[4] <= t1]
            png = tracer.write_timeline_png(window, out_dir / "pipeline_stage2_timeline.png",
                                            title=f"real runner, hybrid, pipeline_stage_num=2, E=P="
                                                  f"{target.env_s * 1e3:g} ms (chunk steps from mid-rollout)")
        rows += pl.pipeline_rows(cases, times, n_steps, Row, target, png)
        fast = next((c for c in cases if c.placement == "hybrid" and c.stage_num == 2 and c.per_call), None)
        slow = next((c for c in cases if c.placement == "collocated" and c.stage_num == 1 and c.per_call), None)
        if fast is not None and slow is not None:
            rows.append(pl.whole_step_row(fast, slow, times, Row, pl.NUM_ENVS * n_steps))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# End to end: the full runner vs a plain loop; the tracer's overhead


LOOP_REPS = 5  # timed passes of the plain loop per round (their median)


def plain_loop_steps_per_s(config: str, n_steps: int, batches: int = 1, bootstrap: bool = True) -> float:
    """One process, one thread: the same envs, the same policy, the same noise, env.chunk_step after each
    predict_action_batch, and (`bootstrap`, as the rollout does under algorithm.bootstrap_type) the value of the
    final obs a chunk step kept, asked of the next action call as the rollout asks it (bootstrap_obs): what the
    rollout phase would cost with no runtime at all.

    batches: the envs split into this many vector envs of consecutive ids, stepped one after the other. With the
    runner's split (env ranks x pipeline stages) the loop makes exactly the runner's calls, so the ratio is the
    runtime's cost and the pipeline's gain; with 1 it also counts what smaller batches cost (fixed costs per call).
    """
    from rlinf_mini.config import load_config
    from rlinf_mini.envs import get_env_spec, make_env
    from rlinf_mini.models import build_policy
    from rlinf_mini.train import RunPlan
    from rlinf_mini.utils.seeding import counter_uniform
    from stages.rollout import final_obs_of

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_loop_") as log_path:
        cfg = load_config(["--config", config, "--runner.logger.log_path", log_path])
        if cfg.actor.model.model_path:  # here, not in the user's results/tiny_vla
            cfg.actor.model.model_path = str(Path(log_path) / "model")
        RunPlan(cfg, config).prepare()  # creates the VLA's model folder when the config names one
        train, chunks = cfg.env.train, cfg.actor.model.num_action_chunks
        spec = get_env_spec(train)
        n = train.total_num_envs // batches
        envs = [make_env(train, torch.arange(b * n, (b + 1) * n), chunks, key="env.train") for b in range(batches)]
        policy = build_policy(cfg.actor.model, spec.obs_dim, spec.action_dim, spec.discrete,
                              image_shape=spec.image_shape).eval()
    for env in envs:
        env.final_obs_of = final_obs_of(cfg) if bootstrap else "none"
    obs = [env.reset() for env in envs]
    finals = [None] * batches  # the final obs batch the last chunk step of batch b kept, or None

    def loop_seconds(steps: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for t in range(steps):
                for b, env in enumerate(envs):
                    noise = counter_uniform(cfg.actor.seed, env.env_ids, t, policy.noise_width)
                    final = None if finals[b] is None else policy.prepare_inputs(finals[b])
                    out = policy.predict_action_batch(policy.prepare_inputs(obs[b]), noise, bootstrap_obs=final)
                    obs[b], *_ = env.chunk_step(out["actions"])
                    finals[b] = None if env.final_obs is None else env.final_obs[1]
        return time.perf_counter() - start

    # as the runner's figure: a warm-up (first calls allocate), then the median of repetitions (one pass of a few ms
    # is one scheduler hiccup away from noise)
    loop_seconds(max(1, n_steps // 4))
    seconds = statistics.median(loop_seconds(n_steps) for _ in range(LOOP_REPS))
    for env in envs:
        env.close()
    return n_steps * chunks * train.total_num_envs / seconds


def runner_and_tracing(steps: int, config: str, reps: int = 1) -> list[Row]:
    """`config` (no eval, no checkpoints) in one cluster, in `reps` rounds. A round: `steps / reps` steps with the
    tracer on, interleaved with as many with it off (interleaving cancels the drift of a shared machine); then, in
    this process while the workers wait, the plain loops (same calls, one batch). (reps defaults to 1 for
    benchmarks/gpu.py, which calls it with (steps, config).)"""
    per_round = max(1, steps // reps)
    rounds, span_counts = [], []
    with started_runner(config) as (cfg, plan, runner):
        train = cfg.env.train
        batches = plan.world_sizes["env"] * cfg.rollout.pipeline_stage_num
        loop_steps = train.max_steps_per_rollout_epoch * 4
        try:
            runner.write_trace = lambda: None  # the files are not what is measured here
            runner.init_workers()
            for rnd in range(reps + 1):  # round 0: one warm-up step
                on, off, gen, gen_on = [], [], [], []
                for i in range(1 if rnd == 0 else 2 * per_round):
                    trace = (i % 2 == 1) != (i // 2 % 2 == 1)  # pairs off-on, on-off, ...: a drift cancels
                    cfg.runner.trace = trace
                    tracer.enable(trace)
                    for g in (runner.env, runner.rollout, runner.actor):
                        g.trace_enable(trace).wait()
                    runner.max_steps = runner.global_step + 1
                    kept = len(runner.trace_spans)
                    last = runner.run()[-1]
                    if trace and len(runner.trace_spans) > kept:  # (the runner keeps the first 20 steps' spans)
                        span_counts.append(len(runner.trace_spans) - kept)
                    (on if trace else off).append(last["time/step"])
                    (gen_on if trace else gen).append(last["time/generate_rollouts"])
                if rnd == 0:
                    continue
                same_calls = plain_loop_steps_per_s(config, loop_steps, batches)
                one_batch = plain_loop_steps_per_s(config, loop_steps, 1) if batches > 1 else same_calls
                no_bootstrap = plain_loop_steps_per_s(config, loop_steps, batches, bootstrap=False)
                # each pair's on / off, its median: a step's time moves from step to step (the actor's update)
                rounds.append({"gen": statistics.median(gen), "gen_on": statistics.median(gen_on),
                               "on": statistics.median(on), "off": statistics.median(off),
                               "pairs": statistics.median(a / b for a, b in zip(on, off, strict=True)),
                               "gen_pairs": statistics.median(a / b for a, b in zip(gen_on, gen, strict=True)),
                               "same_calls": same_calls, "one_batch": one_batch, "no_bootstrap": no_bootstrap})
            spans_per_step = statistics.median(span_counts)
        finally:
            tracer.enable(False)
            tracer.drain()
    env_steps_per_step = train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch
    tracer.enable()  # the estimate: spans per step x the cost of one span
    start = time.perf_counter()
    for _ in range(20000):
        with tracer.span("x"):
            pass
    span_s = (time.perf_counter() - start) / 20000
    tracer.drain()
    tracer.enable(False)
    label = Path(config).stem
    split = f"{batches} x {train.total_num_envs // batches} envs"
    rate = [env_steps_per_step / r["gen"] for r in rounds]
    same = Row.from_reps(f"end to end ({label}): runner rollout env steps/s", "steps/s",
                         [{"ours": x, "baseline": r["same_calls"], "ratio": x / r["same_calls"]}
                          for x, r in zip(rate, rounds, strict=True)],
                         baseline_name=f"plain 1-process loop, same calls ({split})", ratio_of="ours/baseline",
                         target=">= 0.8")
    step_s_off = statistics.median(r["off"] for r in rounds)
    no_bootstrap = statistics.median(x / r["no_bootstrap"] for x, r in zip(rate, rounds, strict=True))
    same.note = (f"whole step incl. training: {env_steps_per_step / step_s_off:.0f} env steps/s; against the loop "
                 f"without the bootstrap values' calls: {no_bootstrap:.2f}")
    one = Row.from_reps(f"end to end ({label}): vs a loop over one batch", "steps/s",
                        [{"ours": x, "baseline": r["one_batch"], "ratio": x / r["one_batch"]}
                         for x, r in zip(rate, rounds, strict=True)],
                        baseline_name=f"plain 1-process loop, 1 x {train.total_num_envs} envs",
                        ratio_of="ours/baseline")
    one.note = f"the {split} split alone: {same.baseline / one.baseline:.2f}x the one-batch loop's speed"
    tracing = Row.from_reps(f"tracing overhead ({label}): step time, trace on / off", "ms",
                            [{"ours": r["on"] * 1e3, "baseline": r["off"] * 1e3, "ratio": r["pairs"]}
                             for r in rounds], baseline_name="trace off", ratio_of="on/off", target="<= 1.03")
    gen_ratio = statistics.median(r["gen_pairs"] for r in rounds)
    tracing.note = (f"per round the median on/off of {per_round} adjacent pairs of steps; the rollout phase alone "
                    f"(most spans, least noise): {gen_ratio:.3f}; estimate: {spans_per_step:.0f} spans/step x "
                    f"{span_s * 1e6:.2f} us = {spans_per_step * span_s / step_s_off:.2%} of a step")
    return [same, one, tracing]


def cartpole(quick: bool) -> list[Row]:
    from benchmarks import cartpole_vs_sb3 as cp

    ours = cp.run_ours("configs/cartpole.yaml", 1, max_epochs=5 if quick else None)
    sb3 = cp.run_sb3(1, max_env_steps=4_096 if quick else 200_000)
    if "skipped" in sb3:
        sb3 = {"wall_s_to_target": None, "env_steps_to_target": None}
    o, b = ours["wall_s_to_target"], sb3["wall_s_to_target"]
    os_, bs = ours["env_steps_to_target"], sb3["env_steps_to_target"]
    nan = float("nan")
    return [
        Row("CartPole: wall s to return 475", "s", o or nan, b, "SB3 PPO defaults",
            ratio=(o / b) if (o and b) else None, ratio_of="ours/SB3", target="<= 1.0",
            note="--quick: 5 steps only, target not reached" if quick else ""),
        Row("CartPole: env steps to return 475", "steps", os_ or nan, bs, "SB3 PPO defaults",
            ratio=(os_ / bs) if (os_ and bs) else None, ratio_of="ours/SB3"),
    ]
