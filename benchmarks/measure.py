"""The measurements behind `python -m benchmarks`: each function returns table rows, ours next to the obvious
alternative and the physical limit, measured side by side in this process's run.

Transfers run between two spawned child processes (the channel server, as in a training run, lives in this driver
process); every process uses one torch thread, so a figure compares transports, not how many cores a copy may use.
Each figure is the best of a few repetitions after a warm-up (first-touch page faults and connection set-up are
start-up costs, not throughput).
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks import bench_workers as bw
from rlinf_mini.scheduler import shm, tracer
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.local import ChannelServer, KernelQueues

_ctx = multiprocessing.get_context("spawn")


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

    @property
    def met(self) -> bool | None:
        if not self.target or self.ratio is None:
            return None
        op, value = self.target.split()
        return self.ratio >= float(value) if op == ">=" else self.ratio <= float(value)


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
        self.shared = {"tq": torch.multiprocessing.get_context("spawn").Queue(4), "q": _ctx.Queue(64),
                       "q_in": _ctx.Queue(), "q_out": _ctx.Queue(), "done": _ctx.Event(), "handle_q": _ctx.Queue(),
                       "ack_q": _ctx.Queue()}
        cores = sorted(os.sched_getaffinity(0))
        self.conns, self.procs = [], []
        for i in range(2):
            parent, child = _ctx.Pipe()
            core = cores[i] if len(cores) >= 2 else None
            p = _ctx.Process(target=bw.host_main, args=(i, core, self.shared, child), daemon=True)
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


def channel_large(h: Hosts, n: int) -> list[Row]:
    nbytes = 64 * 3 * 64 * 64
    ch = h.channel(maxsize=4)
    _, seconds = h.both(("channel_producer", ch, n, "large"), ("channel_consumer", ch, n))
    ours = nbytes * (n - 1) / seconds / 1e9
    h.shared["done"].clear()
    _, seconds = h.both(("queue_producer", "@tq", n, "large", True, "@done"), ("queue_consumer", "@tq", n, "@done"))
    queue = nbytes * (n - 1) / seconds / 1e9
    limit = memcpy_gbps(nbytes, 200)
    return [Row("channel, large (64x3x64x64 uint8, 786 KB)", "GB/s", ours, queue, "torch.mp.Queue", limit,
                "memcpy", ours / limit, "ours/limit", ">= 0.35",
                note=f"ours/torch.mp.Queue = {ours / queue:.2f}")]


def channel_small(h: Hosts, n: int, n_rtt: int) -> list[Row]:
    ch = h.channel(maxsize=64)
    _, seconds = h.both(("channel_producer", ch, n, "small"), ("channel_consumer", ch, n))
    ours = (n - 1) / seconds
    ch = h.channel(maxsize=4)
    _, ours_rtt = h.both(("channel_echo", ch, n_rtt), ("channel_pinger", ch, n_rtt))
    h.shared["done"].clear()
    _, seconds = h.both(("queue_producer", "@q", n, "small", False, "@done"), ("queue_consumer", "@q", n, "@done"))
    queue = (n - 1) / seconds
    _, queue_rtt = h.both(("queue_echo", "@q_out", "@q_in", n_rtt), ("queue_pinger", "@q_in", "@q_out", n_rtt))
    ours_rtt, queue_rtt = ours_rtt * 1e6, queue_rtt * 1e6
    return [
        Row("channel, small (dict of 4 scalars)", "msg/s", ours, queue, "pickled mp.Queue", ratio=ours / queue,
            ratio_of="ours/baseline", target=">= 1.0"),
        Row("channel, small: round trip", "us", ours_rtt, queue_rtt, "pickled mp.Queue", ratio=ours_rtt / queue_rtt,
            ratio_of="ours/baseline", note="put + get each way"),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Weight sync


def weight_sync(h: Hosts, numel: int, reps: int) -> list[Row]:
    from stages.sync import WeightSender

    nbytes = numel * 4
    h.submit(1, "weight_receiver", numel, reps + 1, "@handle_q", "@ack_q")
    handle = h.shared["handle_q"].get(timeout=120)
    model = bw.FlatModel(numel)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    sender, times = WeightSender(), []
    for v in range(reps + 1):  # version 0 is the warm-up: attaching and first-touch page faults
        start = time.perf_counter()
        sender.send(model, [handle], v)
        h.shared["ack_q"].get(timeout=120)  # the rollout saw the stamp: it holds version v
        times.append(time.perf_counter() - start)
    sender.close()
    h.result(1)
    del model
    ours = nbytes / min(times[1:]) / 1e9
    port = _free_port()
    seconds, _ = h.both(("gloo_broadcast", 0, port, numel, reps), ("gloo_broadcast", 1, port, numel, reps))
    gloo = nbytes / seconds / 1e9
    limit = memcpy_gbps(nbytes, 2 if numel > 20_000_000 else 5)
    label = f"{numel / 1e6:g}M"
    return [Row(f"weight sync, {label} float32 ({nbytes / 1e6:.0f} MB)", "GB/s", ours, gloo, "gloo broadcast",
                limit, "memcpy", ours / limit, "ours/limit", ">= 0.5",
                note=f"ours/gloo = {ours / gloo:.1f}; actor -> rollout buffer, until the rollout sees the stamp")]


# ---------------------------------------------------------------------------------------------------------------------
# Group calls and the pipeline (real Cluster, WorkerGroup and Channel)


def _cluster(num_devices: int = 2):
    from rlinf_mini.config import ClusterConfig
    from rlinf_mini.scheduler.cluster import Cluster

    return Cluster(ClusterConfig(num_devices=num_devices, timeout_s=120.0))


def _strategy(name: str, devices: list[tuple[int, ...]]):
    from stages.placement import PlacementStrategy, ProcessPlacement

    return PlacementStrategy(name, tuple(ProcessPlacement(r, d) for r, d in enumerate(devices)))


def group_call(h: Hosts, n: int) -> list[Row]:
    _, queue_rtt = h.both(("queue_echo", "@q_out", "@q_in", n), ("queue_pinger", "@q_in", "@q_out", n))
    queue_rtt *= 1e6
    rows = []
    cluster = _cluster()
    try:
        group = bw.NoopWorker.create_group(None).launch(cluster, _strategy("noop", [(r % 2,) for r in range(4)]))
        group.noop().wait()  # start-up
        for ranks in (1, 4):
            call = group.execute_on(0).noop if ranks == 1 else group.noop
            times = []
            for _ in range(n):
                start = time.perf_counter()
                call().wait()
                times.append(time.perf_counter() - start)
            rtt = statistics.median(times) * 1e6
            rows.append(Row(f"group call round trip, no-op on {ranks} rank{'s' * (ranks > 1)}", "us", rtt, queue_rtt,
                            "pickled mp.Queue RTT", ratio=rtt, ratio_of="us (absolute)", target="<= 500",
                            note=f"ours/queue = {rtt / queue_rtt:.1f}; median of {n}"))
    finally:
        cluster.shutdown()
    return rows


def pipeline(env_s: float, infer_s: float, n_steps: int, out_dir: Path, stage_nums=(1, 2, 4),
             modes=("collocated", "disaggregated"), reps: int = 2) -> list[Row]:
    """Env with a fixed CPU cost E per step and a policy with inference cost P, through the real runtime
    (Cluster, WorkerGroup, Channel), in one cluster of 2 devices: the env on device 0; a rollout on device 0
    (collocated: they share a core) and one on device 1 (disaggregated); an idle actor over devices 0-1, as in the
    hybrid placement of configs/embodied_mlp.yaml (during the rollout, hybrid = disaggregated)."""
    rows = []
    ideal = (env_s + infer_s) / max(env_s, infer_s)
    cluster = _cluster()
    try:
        env = bw.SimEnvWorker.create_group(None).launch(cluster, _strategy("env", [(0,)]), name="SimEnv")
        rollouts = {mode: bw.SimRolloutWorker.create_group(None).launch(
            cluster, _strategy("rollout", [(0,) if mode == "collocated" else (1,)]), name=f"SimRollout_{mode}")
            for mode in modes}
        bw.NoopWorker.create_group(None).launch(cluster, _strategy("actor", [(0, 1)]), name="Actor")
        for g in (env, *rollouts.values()):
            g.trace_enable().wait()
        for mode, rollout in rollouts.items():
            seconds = {}
            for rep, stages in [(rep, stages) for rep in range(reps) for stages in stage_nums]:  # interleaved
                rc = Channel.create(f"Rollout{mode}{stages}.{rep}", cluster, maxsize=stages + 1)
                ec = Channel.create(f"Env{mode}{stages}.{rep}", cluster, maxsize=stages + 1)
                env.trace_drain().wait()
                rollout.trace_drain().wait()
                r = rollout.run(rc, ec, n_steps, stages, infer_s, (32, 2))
                took = env.run(rc, ec, n_steps, stages, env_s, (32, 10)).wait()[0]
                seconds[stages] = min(took, seconds.get(stages, took))  # best of `reps`: a busy machine only adds
                r.wait()
                spans = [s for g in (env, rollout) for per_rank in g.trace_drain().wait() for s in per_rank]
                if stages == 2 and mode == "disaggregated" and took == seconds[stages]:
                    t_end = max(s[5] for s in spans)
                    t0 = t_end - int(4 * (env_s + infer_s) * 1e9)  # the last few steps, clipped to that window
                    window = [(*s[:4], max(s[4], t0), s[5]) for s in spans if s[5] >= t0]
                    png = tracer.write_timeline_png(window, out_dir / "pipeline_stage2_timeline.png",
                                                    title=f"pipeline_stage_num=2, E=P={env_s * 1e3:g} ms, "
                                                          f"env and rollout on separate cores")
            for stages in stage_nums:
                speedup = seconds[1] / seconds[stages] if 1 in seconds else float("nan")
                target = ">= 0.9" if stages == 2 and mode != "collocated" else ""
                note = "one core for both: no overlap possible (limit 1.0)" if mode == "collocated" else ""
                if stages == 2 and mode == "disaggregated":
                    note = f"timeline: {png.name}"
                name = "disaggregated / hybrid" if mode == "disaggregated" else mode
                rows.append(Row(f"pipeline {name}, stage_num {stages}", "steps/s", n_steps / seconds[stages],
                                n_steps / seconds[1] if 1 in seconds else None, "stage_num 1",
                                ideal * n_steps / seconds[1] if 1 in seconds else None, "ideal",
                                ratio=speedup / ideal, ratio_of="speedup/ideal", target=target, note=note))
    finally:
        cluster.shutdown()
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# End to end: the full runner vs a plain loop; the tracer's overhead


def plain_loop_steps_per_s(config: str, n_steps: int, batches: int = 1) -> float:
    """One process, one thread: the same envs, the same policy, the same noise, env.chunk_step after each
    predict_action_batch: what the rollout phase would cost with no runtime at all.

    batches: the envs split into this many vector envs of consecutive ids, stepped one after the other. With the
    runner's split (env ranks x pipeline stages) the loop makes exactly the runner's calls, so the ratio is the
    runtime's cost and the pipeline's gain; with 1 it also counts what smaller batches cost (fixed costs per call).
    """
    from rlinf_mini.config import load_config
    from rlinf_mini.envs import get_env_spec, make_env
    from rlinf_mini.models import build_policy
    from rlinf_mini.train import RunPlan
    from rlinf_mini.utils.seeding import counter_uniform

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_loop_") as log_path:
        cfg = load_config(["--config", config, "--runner.logger.log_path", log_path])
        RunPlan(cfg, config)  # creates the VLA's model folder when the config names one that does not exist yet
        train, chunks = cfg.env.train, cfg.actor.model.num_action_chunks
        spec = get_env_spec(train)
        n = train.total_num_envs // batches
        envs = [make_env(train, torch.arange(b * n, (b + 1) * n), chunks, key="env.train") for b in range(batches)]
        policy = build_policy(cfg.actor.model, spec.obs_dim, spec.action_dim, spec.discrete,
                              image_shape=spec.image_shape).eval()
    obs = [env.reset() for env in envs]
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(n_steps):
            for b, env in enumerate(envs):
                noise = counter_uniform(cfg.actor.seed, env.env_ids, t, policy.noise_width)
                out = policy.predict_action_batch(policy.prepare_inputs(obs[b]), noise)
                obs[b], *_ = env.chunk_step(out["actions"])
    seconds = time.perf_counter() - start
    for env in envs:
        env.close()
    return n_steps * chunks * train.total_num_envs / seconds


def runner_and_tracing(steps: int, config: str = "configs/embodied_mlp.yaml") -> list[Row]:
    """`config` (no eval, no checkpoints) in one cluster: `steps` steps with the tracer on,
    interleaved with `steps` steps with it off (interleaving cancels the drift of a shared machine)."""
    from rlinf_mini.config import load_config
    from rlinf_mini.scheduler.cluster import Cluster
    from rlinf_mini.train import RunPlan, launch

    on, off, gen, gen_on, span_counts = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench_runner_") as log_path:
        cfg = load_config(["--config", config, "--runner.logger.log_path", log_path,
                           "--runner.no-progress-bar", "--runner.log_interval", "1000",
                           "--runner.val_check_interval", "-1", "--runner.save_interval", "-1"])
        plan = RunPlan(cfg, config)
        plan.run_dir.mkdir(parents=True)
        cluster = Cluster(cfg.cluster)
        try:
            runner = launch(cfg, plan, cluster)
            runner.write_trace = lambda: None  # the files are not what is measured here
            runner.init_workers()
            for i in range(2 * steps + 1):
                trace = i % 2 == 1
                cfg.runner.trace = trace
                tracer.enable(trace)
                for g in (runner.env, runner.rollout, runner.actor):
                    g.trace_enable(trace).wait()
                runner.max_steps = runner.global_step + 1
                kept = len(runner.trace_spans)
                last = runner.run()[-1]
                if trace and len(runner.trace_spans) > kept:  # (the runner keeps the first 20 steps' spans)
                    span_counts.append(len(runner.trace_spans) - kept)
                if i == 0:
                    continue  # warm-up
                (on if trace else off).append(last["time/step"])
                (gen_on if trace else gen).append(last["time/generate_rollouts"])
            spans_per_step = statistics.median(span_counts)
        finally:
            tracer.enable(False)
            tracer.drain()
            cluster.shutdown()
    train = cfg.env.train
    env_steps_per_step = train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch
    step_s_on, step_s_off = statistics.median(on), statistics.median(off)
    runner_rate = env_steps_per_step / statistics.median(gen)
    batches = plan.world_sizes["env"] * cfg.rollout.pipeline_stage_num
    loop_steps = train.max_steps_per_rollout_epoch * 4
    same_calls = plain_loop_steps_per_s(config, loop_steps, batches)
    one_batch = plain_loop_steps_per_s(config, loop_steps, 1) if batches > 1 else same_calls
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
    return [
        Row(f"end to end ({label}): runner rollout env steps/s", "steps/s", runner_rate, same_calls,
            f"plain 1-process loop, same calls ({split})", ratio=runner_rate / same_calls, ratio_of="ours/baseline",
            target=">= 0.8", note=f"whole step incl. training: {env_steps_per_step / step_s_off:.0f} env steps/s"),
        Row(f"end to end ({label}): vs a loop over one batch", "steps/s", runner_rate, one_batch,
            f"plain 1-process loop, 1 x {train.total_num_envs} envs", ratio=runner_rate / one_batch,
            ratio_of="ours/baseline",
            note=f"the {split} split alone: {same_calls / one_batch:.2f}x the one-batch loop's speed"),
        Row(f"tracing overhead ({label}): step time, trace on / off", "ms", step_s_on * 1e3, step_s_off * 1e3,
            "trace off",
            ratio=step_s_on / step_s_off, ratio_of="on/off", target="<= 1.03",
            note=f"medians of {len(on)} steps each; the rollout phase alone (most spans, least noise): "
                 f"{statistics.median(gen_on) / statistics.median(gen):.3f}; estimate: {spans_per_step:.0f} "
                 f"spans/step x {span_s * 1e6:.2f} us = {spans_per_step * span_s / step_s_off:.2%} of a step"),
    ]


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
