"""The `ray` benchmark group: the Ray backend (scheduler/ray_backend.py) beside the raw Ray figure of the layer below.

    python -m benchmarks --only ray            # or: python -m benchmarks.ray_backend [--tiny]

- group call round trip (a no-op on 1 and on 4 ranks) vs a bare Ray actor call (`ray.get(a.noop.remote())`, and the
  same on 4 bare actors at once); target: ours <= 2x bare;
- channel messages from one rank to another through the queue actor, large (786 KB and 9.6 MB) and small, vs the
  object store alone between the same two ranks: `ray.put` of the item n times in the producer rank, the n refs
  handed to the consumer rank in one call (untimed), `ray.get` of each there; the baseline's seconds per message are
  the producer's put seconds plus the consumer's get seconds. Target for large: >= 0.5x;
- the runner's rollout env steps/s on configs/embodied_mlp.yaml, ray vs local (same config, same process layout).

Everything runs on a private Ray instance of this machine (ray.init(address="local"), stopped at the end). Figures are
medians (calls) after a warm-up, or, for channels, the median of rounds in which ours and the baseline run in turn
(3 in --quick), each row with the spread of its ratio.

    python -m benchmarks.ray_backend --channels    # the channel rows alone
    python -m benchmarks.ray_backend --step --out benchmarks/ray_step.json   # ray / local, the whole embodied step
    python -m benchmarks.ray_backend --designs     # 786 KB: ray_channel.py's design vs a pull from the producer
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import ray
import torch

from benchmarks.measure import Row, median_call_s, runner_rollout_rate, started_runner
from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.worker import Worker
from stages.placement import ComponentPlacement

# calls, large messages (huge: a quarter of them), small messages, runner steps
SIZES = {"full": (1000, 400, 3000, 20), "quick": (300, 200, 1000, 8), "tiny": (10, 8, 20, 1)}
REPS = {"full": 5, "quick": 3, "tiny": 1}  # rounds of every channel row (as benchmarks/__main__.py)


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

    def put_refs(self, n: int, kind: str) -> tuple[float, list]:
        """(seconds for n x ray.put of the item, the refs): the producer's side of the object store alone."""
        item = _item(kind)
        ray.get(ray.put(item))
        start = time.perf_counter()
        refs = [ray.put(item) for _ in range(n)]
        return time.perf_counter() - start, refs

    def get_refs(self, refs: list) -> float:
        """Seconds for ray.get of each ref (passed nested in a list, so they arrive as refs): the consumer's side."""
        start = time.perf_counter()
        for ref in refs[0]:
            ray.get(ref)
        return time.perf_counter() - start


@ray.remote(num_cpus=0.01)
class _Bare:
    def noop(self) -> None:
        return None


def _strategy(devices: str, num_devices: int = 2):
    return ComponentPlacement({"p": devices}, num_devices).get_strategy("p")


def group_calls(group, n_calls: int) -> list[Row]:
    rows = []
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
                        ratio=ours_s / bare_s, ratio_of="ours/bare", target="<= 2", note=f"median of {n_calls}"))
    for a in bare:
        ray.kill(a)
    return rows


def channels(cluster, group, n_large: int, n_small: int, reps: int) -> list[Row]:
    """Rank 0 puts, rank 1 gets: through a channel (maxsize 4, as the runner's), then through the object store alone
    (ray.put in rank 0, ray.get in rank 1), in turn, `reps` rounds."""
    kinds = (("large", n_large), ("huge", max(4, n_large // 4)), ("small", n_small))
    measured: dict[str, list[dict]] = {kind: [] for kind, _ in kinds}
    for rep in range(reps):
        for kind, n in kinds:
            channel = Channel.create(f"bench_{kind}_{rep}", cluster, maxsize=4)
            consumed = group.execute_on(1).consume(channel, n)
            group.execute_on(0).produce(channel, n, kind).wait()
            ours = (n - 1) / consumed.wait()[0]  # messages/s
            put_s, refs = group.execute_on(0).put_refs(n, kind).wait()[0]
            get_s = group.execute_on(1).get_refs([refs]).wait()[0]
            del refs
            base = n / (put_s + get_s)
            scale = 1.0 if kind == "small" else _item(kind).numel() / 1e9  # GB/s for the large rows
            measured[kind].append({"ours": ours * scale, "baseline": base * scale, "ratio": ours / base})
    # What limits the large rows: a message of any size costs the two queue-actor calls a small one costs (a
    # pipelined put, a get's round trip), so in each round the small rate x the item's bytes over the baseline is
    # the most a large row could reach if moving its data were free.
    for kind in ("large", "huge"):
        for rep, small in zip(measured[kind], measured["small"], strict=True):
            rep["bound"] = small["ours"] * _item(kind).numel() / 1e9 / rep["baseline"]
    rows, base_name = [], "ray.put in one rank + ray.get in another"
    for kind, n in kinds:
        note = f"median of {reps} rounds x {n} messages, ours and the baseline in turn"
        if kind == "small":
            rows.append(Row.from_reps("ray: channel, small (dict of 4 scalars), rank to rank", "msg/s", measured[kind],
                                      baseline_name=base_name, ratio_of="ours/baseline",
                                      note=note + "; a round trip to the queue actor per get"))
        else:
            size = "786 KB" if kind == "large" else "9.6 MB"
            rows.append(Row.from_reps(f"ray: channel, large ({size} uint8), rank to rank", "GB/s", measured[kind],
                                      baseline_name=base_name, ratio_of="ours/baseline",
                                      target=">= 0.5", note=note + "; with free data at most "
                                      f"{statistics.median(r['bound'] for r in measured[kind]):.2f} (the small "
                                      "row's calls per message)"))
    return rows


def group_calls_and_channels(n_calls: int, n_large: int, n_small: int, reps: int, calls: bool = True) -> list[Row]:
    rows = []
    cluster = Cluster(ClusterConfig(backend="ray", num_devices=2, timeout_s=60))
    cluster.backend.same_node_channels = False  # the queue actor, as a run on several nodes has (one node: kernel)
    try:
        group = RayBenchWorker.create_group(None).launch(cluster, _strategy("0-1:0-3"), name="Bench")  # 4 ranks
        group.noop().wait()
        if calls:
            rows += group_calls(group, n_calls)
        rows += channels(cluster, group, n_large, n_small, reps)
    finally:
        cluster.shutdown()
    return rows


def ray_rows(mode: str = "quick", channels_only: bool = False) -> list[Row]:
    from rlinf_mini.scheduler.ray_backend import _import_roots

    n_calls, n_large, n_small, steps = SIZES[mode]
    # one Ray session for every row (the backend uses a session it finds, and leaves it)
    ray.init(address="local", include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}})
    try:
        rows = group_calls_and_channels(n_calls, n_large, n_small, REPS[mode], calls=not channels_only)
        if channels_only:
            return rows
        ours = runner_rollout_rate("configs/embodied_mlp.yaml", steps, "--cluster.backend", "ray")
    finally:
        ray.shutdown()
    local = runner_rollout_rate("configs/embodied_mlp.yaml", steps, "--cluster.backend", "local")
    rows.append(Row("ray: runner rollout env steps/s (embodied_mlp)", "steps/s", ours, local, "local backend",
                    ratio=ours / local, ratio_of="ours/local", note=f"median of {steps} steps"))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Two designs of a large message side by side, in bare actors (no rank, no Channel): the one ray_channel.py uses and
# the one it was measured against (the "payload moved once" shapes); ray.put + ray.get is the baseline.

FRAME_BYTES = 64 * 3 * 64 * 64  # 786 KB, the large row's item


@ray.remote(num_cpus=0)
class _Queue:
    """One key's bounded queue (maxsize 8), holding what it is given: [ObjectRef] or (producer, id)."""

    def __init__(self):
        import asyncio

        self.q = asyncio.Queue(8)

    async def put(self, wrapped) -> None:
        await self.q.put(wrapped)

    async def get(self):
        return await self.q.get()


@ray.remote(num_cpus=0.01, concurrency_groups={"lend": 1})
class _DesignProducer:
    def __init__(self):
        self.lent: dict[int, object] = {}
        self.me = None

    def set_handle(self, me) -> None:
        self.me = me

    def put_refs(self, q, n: int) -> None:
        """ray_channel.py's design: ray.put here (this process owns the object), the queue holds the ObjectRef."""
        import numpy as np

        item = np.random.randint(0, 255, FRAME_BYTES, dtype=np.uint8)
        for _ in range(n):
            ray.get(q.put.remote([ray.put(item)]))

    def put_ids(self, q, n: int) -> None:
        """The alternative: the item stays here (a copy: the caller may reuse its buffer), the queue holds
        (this actor, id), and the consumer pulls the item by calling `lend`."""
        import numpy as np

        item = np.random.randint(0, 255, FRAME_BYTES, dtype=np.uint8)
        for i in range(n):
            self.lent[i] = item.copy()
            ray.get(q.put.remote((self.me, i)))

    @ray.method(concurrency_group="lend")
    def lend(self, i: int):
        return self.lent.pop(i)

    def put_bare(self, n: int) -> tuple[float, list]:
        import numpy as np

        item = np.random.randint(0, 255, FRAME_BYTES, dtype=np.uint8)
        start = time.perf_counter()
        refs = [ray.put(item) for _ in range(n)]
        return time.perf_counter() - start, refs


@ray.remote(num_cpus=0.01)
class _DesignConsumer:
    def get_refs(self, q, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            ray.get(ray.get(q.get.remote())[0]).copy()  # the copy: a received tensor is the receiver's (ray_channel)
        return time.perf_counter() - start

    def get_ids(self, q, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            owner, i = ray.get(q.get.remote())
            ray.get(owner.lend.remote(i)).copy()
        return time.perf_counter() - start

    def get_bare(self, refs: list) -> float:
        start = time.perf_counter()
        for ref in refs[0]:
            ray.get(ref).copy()
        return time.perf_counter() - start


def design_rows(n: int, reps: int) -> list[Row]:
    """The 786 KB message through each design, and ray.put + ray.get alone, in turn, `reps` rounds of `n`."""
    queue, producer, consumer = _Queue.options(max_concurrency=100).remote(), _DesignProducer.remote(), \
        _DesignConsumer.remote()
    ray.get(producer.set_handle.remote(producer))
    measured = []
    for _ in range(reps):
        rates = {}
        for design in ("refs", "ids"):
            got = getattr(consumer, f"get_{design}").remote(queue, n)
            ray.get(getattr(producer, f"put_{design}").remote(queue, n))
            rates[design] = n / ray.get(got)
        put_s, refs = ray.get(producer.put_bare.remote(n))
        rates["bare"] = n / (put_s + ray.get(consumer.get_bare.remote([refs])))
        del refs
        measured.append({"ours": rates["refs"], "baseline": rates["ids"], "ratio": rates["refs"] / rates["ids"],
                         "bare": rates["bare"], "loadavg": os.getloadavg()})
    for actor in (queue, producer, consumer):
        ray.kill(actor)
    bare = {k: statistics.median(r[k] / r["bare"] for r in measured) for k in ("ours", "baseline")}
    return [Row.from_reps("ray: 786 KB message, the producer's ObjectRef through the queue (ray_channel.py)", "msg/s",
                          measured, baseline_name="the payload pulled from the producer's actor", ratio_of="ours/it",
                          note=f"median of {reps} rounds x {n}, in turn; of bare ray.put + ray.get: ours "
                               f"{bare['ours']:.2f}, the pull {bare['baseline']:.2f}")]


STEP_CONFIGS = {"embodied_mlp": "configs/embodied_mlp.yaml", "default VLA": "configs/embodied.yaml"}


def step_figures(config: str, steps: int, backend: str) -> dict[str, float]:
    """One run of `config` on `backend` (the config's placement, one node): medians over `steps` steps after a
    warm-up step of the whole step's seconds and of the share of it that the env ranks spend in channel gets (waiting
    for actions) and the rollout ranks (waiting for observations), from the tracer's spans around those gets."""
    with started_runner(config, "--cluster.backend", backend) as (_, _, runner):
        runner.init_workers()
        runner.max_steps = steps + 1
        history = runner.run()[1:]

    def med(of) -> float:
        return statistics.median(of(h) for h in history)

    def share(who: str):
        return lambda h: h[f"time/trace/bubble/{who}_waits"] * h["time/generate_rollouts"] / h["time/step"]

    return {"step_s": med(lambda h: h["time/step"]), "env_gets": med(share("env")),
            "rollout_gets": med(share("rollout"))}


def whole_step_rows(steps: dict[str, int], pairs: int) -> list[Row]:
    """ray / local for the whole embodied step of each config: `pairs` runs of each backend, local and ray in turn
    (one Ray session for the ray runs), medians of the pairs' ratios."""
    from rlinf_mini.scheduler.ray_backend import _import_roots

    measured: dict[str, list[dict]] = {name: [] for name in STEP_CONFIGS}
    ray.init(address="local", include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}})
    try:
        for _ in range(pairs):
            for name, config in STEP_CONFIGS.items():
                local = step_figures(config, steps[name], "local")
                ours = step_figures(config, steps[name], "ray")
                measured[name].append({"ours": 1 / ours["step_s"], "baseline": 1 / local["step_s"],
                                       "ratio": local["step_s"] / ours["step_s"],
                                       "ray": ours, "local": local, "loadavg": os.getloadavg()})
    finally:
        ray.shutdown()
    rows = []
    for name, reps in measured.items():
        def med(backend: str, key: str, reps=reps) -> float:
            return statistics.median(r[backend][key] for r in reps)

        rows.append(Row.from_reps(
            f"ray: whole embodied step ({name}), one node, the config's placement", "steps/s", reps,
            baseline_name="local backend", ratio_of="ray/local", target=">= 0.8",
            note=f"median of {pairs} runs of each, in turn, x {steps[name]} steps; share of the step in channel gets "
                 f"(env / rollout ranks): ray {med('ray', 'env_gets'):.0%} / {med('ray', 'rollout_gets'):.0%}, "
                 f"local {med('local', 'env_gets'):.0%} / {med('local', 'rollout_gets'):.0%}"))
    return rows


if __name__ == "__main__":
    from benchmarks.ray_backend import ray_rows as rows_of  # by module name: ranks import the worker class by it
    from benchmarks.table import format_table

    mode = "tiny" if "--tiny" in sys.argv else "quick"
    if "--designs" in sys.argv:  # the large message in ray_channel.py's design and in the one it was measured against
        from benchmarks.ray_backend import design_rows

        ray.init(address="local", include_dashboard=False, logging_level="WARNING")
        try:
            print(format_table(design_rows(10 if mode == "tiny" else 200, 1 if mode == "tiny" else 5),
                               markdown="--markdown" in sys.argv))
        finally:
            ray.shutdown()
    elif "--step" in sys.argv:  # the whole-step rows alone, saved as JSON: --step [--out FILE]
        from benchmarks.ray_backend import whole_step_rows

        out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "results/ray_step.json"
        start_load = os.getloadavg()
        rows = whole_step_rows({"embodied_mlp": 1 if mode == "tiny" else 5, "default VLA": 1 if mode == "tiny" else 3},
                               1 if mode == "tiny" else 3)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"loadavg": {"start": start_load, "end": os.getloadavg()},
                                         "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))
        print(format_table(rows, markdown="--markdown" in sys.argv))
    else:
        print(format_table(rows_of(mode, channels_only="--channels" in sys.argv), markdown="--markdown" in sys.argv))
