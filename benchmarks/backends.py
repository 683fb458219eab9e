"""Per backend (scheduler/backend.py): a group call's round trip, channel throughput, and the runner's rollout speed,
each beside the raw figure of the layer below it (for inline: a direct call, a queue.Queue, a tensor clone).

    python -m benchmarks --only backends       # local and inline (ray: benchmarks/ray_backend.py)

Every figure is the median of `reps` repetitions, the backends interleaved (local, inline, local, ...), so that a
machine's drift hits both alike; the table shows the spread of the ratio and the JSON keeps every repetition.
"""

from __future__ import annotations

import queue
import time

import torch

from benchmarks.measure import Row, median_call_s, runner_rollout_rate
from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.placement import PlacementStrategy, ProcessPlacement
from rlinf_mini.scheduler.worker import Worker

BACKENDS = ("local", "inline")
LARGE = (64, 3, 64, 64)  # uint8, 786 KB: a batch of camera images
SMALL = {"a": 1.0, "b": 2, "c": "x", "d": (1, 2)}


class BenchWorker(Worker):
    def noop(self) -> None:
        return None

    def join(self) -> None:
        self.init_collective(60.0)

    def all_reduce_s(self, numel: int, n: int) -> float:
        """Median seconds of one all-reduce of `numel` float32 over the group (every rank calls it n times)."""
        t = torch.randn(numel)
        for _ in range(10):  # the segment made, the ranks in step
            self.all_reduce(t)
        return median_call_s(lambda: self.all_reduce(t), n)

    def produce(self, ch: Channel, n: int, large: bool) -> None:
        item = torch.randint(0, 255, LARGE, dtype=torch.uint8) if large else dict(SMALL)
        for _ in range(n):
            ch.put(item, key="k")


def _strategy(ranks: int) -> PlacementStrategy:
    return PlacementStrategy("bench", tuple(ProcessPlacement(r, (r % 2,)) for r in range(ranks)))


def _call_us(group, ranks: int, n: int) -> float:
    call = group.execute_on(0).noop if ranks == 1 else group.noop
    return median_call_s(lambda: call().wait(), n) * 1e6


def _channel_rate(cluster, group, n: int, large: bool) -> float:
    """Items/s from a rank to the driver over a channel (the first item pays the start, it is not counted)."""
    ch = Channel.create(f"bench{time.monotonic_ns()}", cluster, maxsize=4)
    fut = group.execute_on(0).produce(ch, n + 1, large)
    ch.get(key="k")
    start = time.perf_counter()
    for _ in range(n):
        ch.get(key="k")
    seconds = time.perf_counter() - start
    fut.wait()
    return n / seconds


def _direct_call_us(n: int) -> float:
    return median_call_s(BenchWorker.__new__(BenchWorker).noop, n) * 1e6


def _queue_rate(n: int, large: bool) -> float:
    """A queue.Queue in one process, with the clone an inline channel makes of a tensor: the layer below."""
    q: queue.Queue = queue.Queue(4)
    item = torch.randint(0, 255, LARGE, dtype=torch.uint8) if large else dict(SMALL)
    start = time.perf_counter()
    for _ in range(n):
        q.put(item.clone() if large else dict(item))
        q.get()
    return n / (time.perf_counter() - start)


def calls_and_channels(n_calls: int, n_small: int, n_large: int, reps: int = 3) -> list[Row]:
    """Each repetition: both backends, then the layer below; a row is the median of its repetitions."""
    rounds: dict[str, list[dict]] = {}

    def add(key: str, ours: float, base: float) -> None:
        rounds.setdefault(key, []).append({"ours": ours, "baseline": base, "ratio": ours / base})

    mb = torch.Size(LARGE).numel() / 1e9
    for _ in range(reps):
        measured = {}
        for backend in BACKENDS:
            cluster = Cluster(ClusterConfig(num_devices=2, timeout_s=60, backend=backend))
            try:
                group = BenchWorker.create_group(None).launch(cluster, _strategy(4), name="Bench")
                group.noop().wait()  # start-up
                for ranks in (1, 4):
                    measured[(backend, f"call{ranks}")] = _call_us(group, ranks, n_calls)
                measured[(backend, "small")] = _channel_rate(cluster, group, n_small, False)
                measured[(backend, "large")] = _channel_rate(cluster, group, n_large, True) * mb
            finally:
                cluster.shutdown()
        direct, small, large = _direct_call_us(n_calls), _queue_rate(n_small, False), _queue_rate(n_large, True) * mb
        for backend in BACKENDS:
            for ranks in (1, 4):
                add(f"{backend} call{ranks}", measured[(backend, f"call{ranks}")], direct)
            add(f"{backend} small", measured[(backend, "small")], small)
            add(f"{backend} large", measured[(backend, "large")], large)
    rows = []
    for backend in BACKENDS:
        for ranks in (1, 4):
            rows.append(Row.from_reps(f"{backend}: group call round trip, {ranks} rank{'s' * (ranks > 1)}", "us",
                                      rounds[f"{backend} call{ranks}"], baseline_name="a direct method call",
                                      ratio_of="ours/direct"))
        rows.append(Row.from_reps(f"{backend}: channel small (dict of 4 scalars), rank -> driver", "msg/s",
                                  rounds[f"{backend} small"], baseline_name="queue.Queue, one process",
                                  ratio_of="ours/queue"))
        rows.append(Row.from_reps(f"{backend}: channel large (64x3x64x64 uint8), rank -> driver", "GB/s",
                                  rounds[f"{backend} large"], baseline_name="queue.Queue + clone, one process",
                                  ratio_of="ours/queue"))
    return rows


def rank_start(ranks: int = 4, reps: int = 3) -> list[Row]:
    """Wall time from launching a group of `ranks` local ranks to their first answer: forked from the fork server
    (scheduler/local.py, which imported torch once) against spawned (a fresh interpreter per rank imports torch),
    interleaved. The server's own start (its import of torch), paid once per driver process, is in the note: the
    time of a first launch with no server running."""
    import torch.multiprocessing

    def start_s(start_method: str | None) -> float:
        cluster = Cluster(ClusterConfig(num_devices=2, timeout_s=120))
        try:
            if start_method:
                cluster.backend.mp_context = torch.multiprocessing.get_context(start_method)
            begin = time.perf_counter()
            BenchWorker.create_group(None).launch(cluster, _strategy(ranks), name="Bench").noop().wait()
            return time.perf_counter() - begin
        finally:
            cluster.shutdown()

    from rlinf_mini.scheduler import local

    local._end_fork_server()  # so that the first launch below starts a fresh server: its import of torch, once
    first_s = start_s(None)
    rounds = []
    for _ in range(reps):
        ours, spawned = start_s(None), start_s("spawn")
        rounds.append({"ours": ours, "baseline": spawned, "ratio": spawned / ours})
    return [Row.from_reps(f"local: rank start, {ranks} ranks, launch to first answer", "s", rounds,
                          baseline_name="spawned ranks", ratio_of="spawn/ours",
                          note=f"the first launch of a driver process, which starts the fork server: {first_s:.2f} s")]


def all_reduce(numel: int = 80_000, n: int = 300, reps: int = 3) -> list[Row]:
    """One all-reduce of `numel` float32 (80k: the MLP policy's gradients) over 2 local ranks, one per core:
    cluster.all_reduce 'shm' (scheduler/shm_all_reduce.py) against 'gloo', interleaved, beside the floor of the work
    itself in one process (copy into the segment, add two slots, copy back)."""

    def per_call_s(kind: str) -> float:
        cluster = Cluster(ClusterConfig(num_devices=2, timeout_s=120, all_reduce=kind))
        try:
            group = BenchWorker.create_group(None).launch(cluster, _strategy(2), name="Bench")
            group.join().wait()
            return group.all_reduce_s(numel, n).wait()[0]  # rank 0's median
        finally:
            cluster.shutdown()

    x, y, slot0, slot1 = (torch.randn(numel) for _ in range(4))

    def floor() -> None:
        slot0.copy_(x)
        torch.add(slot0, slot1, out=y)
        x.copy_(y)

    floor_s = median_call_s(floor, n)
    rounds = []
    for _ in range(reps):
        ours, gloo = per_call_s("shm"), per_call_s("gloo")
        rounds.append({"ours": ours * 1e6, "baseline": gloo * 1e6, "limit": floor_s * 1e6, "ratio": gloo / ours})
    return [Row.from_reps(f"local: all-reduce of {numel} float32, 2 ranks", "us", rounds, baseline_name="gloo",
                          limit_name="copy in, add, copy out (one process)", ratio_of="gloo/ours")]


def runner_rollout(config: str, steps: int, reps: int = 3) -> list[Row]:
    """The runner's rollout phase (measure.runner_rollout_rate) on each backend, `reps` runs each, interleaved; the
    ratio is against the local backend of the same round."""
    rounds: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    for _ in range(reps):
        rate = {b: runner_rollout_rate(config, steps, "--cluster.backend", b) for b in BACKENDS}
        for backend in BACKENDS:
            rounds[backend].append({"ours": rate[backend], "baseline": rate["local"],
                                    "ratio": rate[backend] / rate["local"]})
    label = config.rsplit("/", 1)[-1].removesuffix(".yaml")
    return [Row.from_reps(f"{b}: runner rollout env steps/s ({label})", "steps/s", rounds[b],
                          baseline_name="local backend", ratio_of=f"{b}/local") for b in BACKENDS]
