"""The `ray` benchmark group: the Ray backend (scheduler/ray_backend.py) beside the raw Ray figure of the layer below.

    python -m benchmarks --only ray            # or: python -m benchmarks.ray_backend [--tiny]

- group call round trip (a no-op on 1 and on 4 ranks) vs a bare Ray actor call (`ray.get(a.noop.remote())`, and the
  same on 4 bare actors at once); target: ours <= 2x bare;
- channel messages from one rank to another through the queue actor, large (786 KB) and small, vs `ray.put` +
  `ray.get` of the same item in one rank (the object store alone); target for large: >= 0.5x;
- the runner's rollout env steps/s on configs/embodied_mlp.yaml, ray vs local (same config, same process layout).

Everything runs on a private Ray instance of this machine (ray.init(address="local"), stopped at the end). Figures are
medians (calls) or best of 3 (throughput) after a warm-up.
"""

from __future__ import annotations

import sys
import time

import ray
import torch

from benchmarks.measure import Row, median_call_s, runner_rollout_rate
from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.worker import Worker
from stages.placement import ComponentPlacement

# calls, large messages (huge: a quarter of them), small messages, runner steps
SIZES = {"full": (1000, 400, 3000, 20), "quick": (300, 200, 1000, 8), "tiny": (10, 8, 20, 1)}


def _item(kind: str):
    if kind == "large":
        return torch.randint(0, 255, (64, 3, 64, 64), dtype=torch.uint8)  # 786 KB: one batch of 64x64 RGB frames
    if kind == "huge":
        return torch.randint(0, 255, (64, 3, 224, 224), dtype=torch.uint8)  # 9.6 MB: 64 frames at 224x224
    return {"reward": 1.0, "done": False, "step": 0, "value": 0.5}


class RayBenchWorker(Worker):
    def noop(self) -> None:
        return None

    def produce(self, channel: Channel, n: int, kind: str) -> None:
        item = _item(kind)
        for _ in range(n):
            channel.put(item, key="k")

    def consume(self, channel: Channel, n: int) -> float:
        """Seconds for messages 2..n (the first pays the producer's start)."""
        channel.get(key="k")
        start = time.perf_counter()
        for _ in range(n - 1):
            channel.get(key="k")
        return time.perf_counter() - start

    def put_get(self, n: int, kind: str) -> float:
        """Seconds for n x (ray.put + ray.get) of the same item: the object store alone."""
        item = _item(kind)
        ray.get(ray.put(item))
        start = time.perf_counter()
        for _ in range(n):
            ray.get(ray.put(item))
        return time.perf_counter() - start


@ray.remote(num_cpus=0.01)
class _Bare:
    def noop(self) -> None:
        return None


def _strategy(devices: str, num_devices: int = 2):
    return ComponentPlacement({"p": devices}, num_devices).get_strategy("p")


def group_calls_and_channels(n_calls: int, n_large: int, n_small: int) -> list[Row]:
    rows = []
    cluster = Cluster(ClusterConfig(backend="ray", num_devices=2, timeout_s=60))
    try:
        group = RayBenchWorker.create_group(None).launch(cluster, _strategy("0-1:0-3"), name="Bench")  # 4 ranks
        group.noop().wait()
        bare = [_Bare.remote() for _ in range(4)]
        ray.get([a.noop.remote() for a in bare])
        for ranks in (1, 4):
            ours = group.execute_on(0).noop if ranks == 1 else group.noop
            ours().wait()
            ours_s = median_call_s(lambda ours=ours: ours().wait(), n_calls)
            actors = bare[:ranks]
            bare_s = median_call_s(lambda actors=actors: ray.get([a.noop.remote() for a in actors]), n_calls)
            rows.append(Row(f"ray: group call round trip, no-op on {ranks} rank{'s' * (ranks > 1)}", "us",
                            ours_s * 1e6, bare_s * 1e6, "bare Ray actor call" + (" x4" if ranks > 1 else ""),
                            ratio=ours_s / bare_s, ratio_of="ours/bare", target="<= 2",
                            note=f"median of {n_calls}"))
        for a in bare:
            ray.kill(a)
        for kind, n in (("large", n_large), ("huge", max(4, n_large // 4)), ("small", n_small)):
            ours_best = base_best = float("inf")
            for rep in range(3):
                channel = Channel.create(f"bench_{kind}_{rep}", cluster, maxsize=4)  # bounded, as the runner's
                consumed = group.execute_on(1).consume(channel, n)
                group.execute_on(0).produce(channel, n, kind).wait()
                ours_best = min(ours_best, consumed.wait()[0])
                base_best = min(base_best, group.execute_on(2).put_get(n, kind).wait()[0])
            ours_rate, base_rate = (n - 1) / ours_best, n / base_best
            if kind != "small":
                nbytes = _item(kind).numel()
                size = "786 KB" if kind == "large" else "9.6 MB"
                rows.append(Row(f"ray: channel, large ({size} uint8), rank to rank", "GB/s", ours_rate * nbytes / 1e9,
                                base_rate * nbytes / 1e9, "ray.put + ray.get, one rank", ratio=ours_rate / base_rate,
                                ratio_of="ours/baseline", target=">= 0.5", note=f"best of 3 x {n} messages"))
            else:
                rows.append(Row("ray: channel, small (dict of 4 scalars), rank to rank", "msg/s", ours_rate,
                                base_rate, "ray.put + ray.get, one rank", ratio=ours_rate / base_rate,
                                ratio_of="ours/baseline", note=f"best of 3 x {n} messages; maxsize 4: a round "
                                "trip to the queue actor per put and per get"))
    finally:
        cluster.shutdown()
    return rows


def ray_rows(mode: str = "quick") -> list[Row]:
    from rlinf_mini.scheduler.ray_backend import _import_roots

    n_calls, n_large, n_small, steps = SIZES[mode]
    # one Ray session for every row (the backend uses a session it finds, and leaves it)
    ray.init(address="local", include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}})
    try:
        rows = group_calls_and_channels(n_calls, n_large, n_small)
        ours = runner_rollout_rate("configs/embodied_mlp.yaml", steps, "--cluster.backend", "ray")
    finally:
        ray.shutdown()
    local = runner_rollout_rate("configs/embodied_mlp.yaml", steps, "--cluster.backend", "local")
    rows.append(Row("ray: runner rollout env steps/s (embodied_mlp)", "steps/s", ours, local, "local backend",
                    ratio=ours / local, ratio_of="ours/local", note=f"median of {steps} steps"))
    return rows


if __name__ == "__main__":
    from benchmarks.ray_backend import ray_rows as rows_of  # by module name: ranks import the worker class by it
    from benchmarks.table import format_table

    print(format_table(rows_of("tiny" if "--tiny" in sys.argv else "quick"), markdown="--markdown" in sys.argv))
