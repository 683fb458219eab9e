"""The Ray backend (cluster.backend: ray) on a 2-node Ray cluster on this machine (ray.cluster_utils, 1 and 2 CPUs and
2 and 1 faked GPUs, shared by the whole session): the same run is bitwise the same on local, ray with 1 node and
ray with 2 nodes (actor rank 0 on node 0, env and rollout on node 1: the cross-node weight path, and the actor's
all-reduce across the nodes), and so are the shipped configs' first step; ranks pin the GPU Ray reserved, and a
config that needs more GPUs than the cluster has is one line before any actor starts; a kill -9, an exception, a
hang and a failed constructor are reported as on local; channels through the queue actor, with pipelined puts (order,
bound and timeouts kept; a producer killed with puts in flight hangs no consumer) across nodes, through the kernel
queues on one node (a killed rank ends the driver's get and leaves no segment); rank actors at the driver's
niceness. After every test no actor of ours is alive (Ctrl-C: test_ray_ctrl_c.py; a cluster started outside the run:
test_ray_outside.py)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import tempfile
import time

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

import ray  # noqa: E402
import ray.cluster_utils  # noqa: E402
import torch  # noqa: E402
from conftest import ROOT  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from test_channel import check_lent_buffer_rules  # noqa: E402
from test_pipeline import cat_ranks, small_cfg  # noqa: E402
from toy_workers import BrokenWorker, EchoWorker  # noqa: E402

from rlinf_mini.config import ClusterConfig, ConfigError, load_config  # noqa: E402
from rlinf_mini.scheduler.channel import Channel, ChannelClosed, ChannelTimeout  # noqa: E402
from rlinf_mini.scheduler.cluster import Cluster  # noqa: E402
from rlinf_mini.scheduler.ray_backend import _import_roots  # noqa: E402
from rlinf_mini.scheduler.ray_channel import MAX_IN_FLIGHT  # noqa: E402
from rlinf_mini.scheduler.worker import WorkerDiedError, WorkerError  # noqa: E402
from rlinf_mini.train import RunPlan, build_and_run, launch  # noqa: E402
from stages.placement import ComponentPlacement  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster():
    """Two Ray nodes on this machine (1 and 2 CPUs, 2 and 1 faked GPUs); the tests' runs use this session (the backend
    leaves a session it did not start alone). Its Ray temp folder is its own (RAY_TMPDIR), so the address file that
    ray.cluster_utils writes there names it to no run outside this session (an empty cluster.ray_address joins the
    cluster that file names: scheduler/ray_backend.py)."""
    root = tempfile.mkdtemp(prefix="rlray", dir="/tmp")  # short: Ray's socket paths live under it
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", root)
        env.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the raylets must see (2 faked GPUs on node 0, 1 on node 1)
        cluster = ray.cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2,
                                                                                   "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=2, num_gpus=1)  # another CPU share than the head's
            env.undo()  # RAY_TMPDIR as well: the raylets have it, and ray.init reads the address it is given
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}},
                     logging_level="WARNING")
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(root, ignore_errors=True)


def _alive() -> list[dict]:
    """The GCS's entries of the actors it still holds alive (ours: rank and queue actors)."""
    from ray._private.state import state

    return [a for a in state.actor_table(None).values() if a["State"] != "DEAD"]


def alive_actors() -> list[str]:
    """Our live actors by class name, but for those of a shared cluster while it is up (SHARED)."""
    return [a["ActorClassName"] for a in _alive() if a["ActorID"] not in SHARED]


SHARED: set[str] = set()  # the actor ids of TestOneGroupOnTwoNodes's cluster, while it is up


@pytest.fixture(autouse=True)
def no_actor_left(ray_cluster):
    yield
    deadline = time.monotonic() + 5
    while alive_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive_actors() == [], "Ray actors outlived the test"


def collect(tmp_path, placement: dict, num_devices: int, **cluster) -> tuple:
    """Launch, run 2 steps by hand; returns (trajectories per step, trained actor weights, rollout weights after the
    last sync, the runner's weight handles, the cluster's Ray nodes, the class names of the runner's three channel
    transports and of the rollout's weight mailbox)."""
    cfg, source = small_cfg(tmp_path, placement, num_devices, 2, cluster=cluster)
    plan = RunPlan(cfg, source)
    c = Cluster(cfg.cluster)
    try:
        runner = launch(cfg, plan, c)
        runner.init_workers()
        batches = []
        for step in range(2):
            runner.global_step = step
            runner.actor.set_global_step(step).wait()
            runner.update_rollout_weights()
            runner.generate_rollouts()
            batches.append(cat_ranks(runner.actor.get_rollout_batch().wait()))
            runner.actor.compute_advantages_and_returns().wait()
            runner.actor.run_training().wait()
        trained = runner.actor.get_state_dict().wait()
        runner.global_step = 2
        runner.update_rollout_weights()
        after_sync = runner.rollout.get_state_dict().wait()
        transports = [type(ch.transport).__name__ for ch in (runner.env_channel, runner.rollout_channel,
                                                             runner.actor_channel)]
        transports += [type(h.mailbox).__name__ for h in runner.weight_handles]
        return batches, trained, after_sync, runner.weight_handles, getattr(c.backend, "nodes", None), transports
    finally:
        c.shutdown()


# actor ranks on devices 1 and 2, env and rollout on device 3. With 2 nodes of 2 devices: actor rank 0 on node 0,
# actor rank 1 and the rollout on node 1. Each device is one CPU core (the same cores on every backend).
PLACEMENT = {"actor": "1-2", "env,rollout": "3"}
GENEROUS_S = 10  # slack on top of an event's own bound (a timeout, a grace period) that a busy 2-core machine stays in


def test_local_ray_and_ray_on_two_nodes_train_bitwise_the_same(ray_cluster, tmp_path):
    """...and a one-node Ray run's channels and weight mailbox are the kernel queues (the same-node fast path:
    scheduler/ray_backend.py), a two-node run's the queue actor."""
    local = collect(tmp_path, PLACEMENT, 4)
    one_node = collect(tmp_path, PLACEMENT, 4, backend="ray")
    two_nodes = collect(tmp_path, PLACEMENT, 4, backend="ray", num_nodes=2)
    assert local[5] == ["KernelQueues"] * 3 + ["NoneType"]
    assert one_node[5] == ["KernelQueues"] * 4
    assert two_nodes[5] == ["RayQueues"] * 4
    nodes = two_nodes[4]
    assert [h.node for h in two_nodes[3]] == [nodes[1]["NodeID"]]  # the rollout's buffer is on node 1...
    assert nodes[0]["NodeID"] != nodes[1]["NodeID"]  # ...and actor rank 0 on node 0: weights crossed nodes
    assert all(h.node == one_node[4][0]["NodeID"] for h in one_node[3])  # one node: the shared buffer
    assert [h.mailbox for h in local[3]] == [None]
    for name, run in (("ray 1 node", one_node), ("ray 2 nodes", two_nodes)):
        for step in range(2):
            assert local[0][step].keys() == run[0][step].keys()
            for k in local[0][step]:
                assert torch.equal(local[0][step][k], run[0][step][k]), f"{name}: step {step} {k} differs"
        for rank in range(2):  # both actor ranks (their all-reduce kept them equal)
            for k, v in local[1][rank].items():
                assert torch.equal(v, run[1][rank][k]), f"{name}: trained {k} differs on actor rank {rank}"
        for k, v in local[2][0].items():
            assert torch.equal(v, run[2][0][k]), f"{name}: rollout {k} after sync differs"
            assert torch.equal(v, run[1][0][k]), f"{name}: rollout {k} is not the actor's after sync"


def first_step(tmp_path, config: str, *flags: str) -> list[dict]:
    """The metrics of a shipped config's step 0 (eval) and step 1 (rollout, training, eval), timings left out."""
    cfg = load_config(["--config", str(ROOT / "configs" / config), "--runner.max-epochs", "1", "--runner.save-interval",
                       "-1", "--runner.logger.log-path", str(tmp_path), "--runner.logger.experiment-name",
                       "_".join(f.lstrip("-") for f in flags) or "local", *flags])
    history = build_and_run(cfg, RunPlan(cfg, config))
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


@pytest.mark.parametrize("config", ["embodied_mlp.yaml", "embodied.yaml"])
def test_shipped_configs_are_bitwise_the_same_on_local_and_on_one_and_two_ray_nodes(ray_cluster, tmp_path, config):
    """The shipped placement (env 0, rollout 1, actor 0-1) on 2 devices: one node (a core per device) or two nodes of
    1 and 2 CPUs (every core of the node per device); a rank's thread count comes from its placement on both (2
    threads per rank gave eval/return 0.00928457174450159 at step 0 instead of local's 0.00928457360714674)."""
    local = first_step(tmp_path, config)
    assert local[0]["step"] == 0 and "eval/return" in local[0] and "train/critic/value_loss" in local[1]
    runs = {"ray 2 nodes": ("--cluster.backend", "ray", "--cluster.num-nodes", "2")}
    if config == "embodied_mlp.yaml":  # (one node: the VLA's ranks import transformers for another ~15 s)
        runs["ray 1 node"] = ("--cluster.backend", "ray")
    for name, flags in runs.items():
        assert first_step(tmp_path, config, *flags) == local, name


def free_gpus_become(n: float) -> None:
    """Wait (10 s at most) until Ray reports `n` GPUs free: its resource view follows the actors a moment later."""
    deadline = time.monotonic() + 10
    while ray.available_resources().get("GPU", 0) != n:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.1)


@ray.remote(num_gpus=1, num_cpus=0)
class _GpuHolder:
    """Another job's actor holding one GPU."""

    def gpu(self) -> str:
        return str(ray.get_gpu_ids()[0])


def _our_placement_groups() -> list[str]:
    return [pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"]


def test_ranks_pin_the_gpu_ray_reserved_in_its_bundle_and_more_gpus_than_the_cluster_has_is_one_line(
        ray_cluster, monkeypatch):
    """GPUs faked: node 0 has 2, node 1 has 1 (Ray's view), the driver's torch sees 1 or 2. Another job holds one
    of node 0's GPUs: two components collocated on the placement's GPU 0 land in one bundle, on the GPU Ray reserved
    (the other one), each asking for half of it; ranks the placement keeps apart get two GPUs; a GPU Ray cannot
    reserve is one error after cluster.timeout_s; 2 GPUs per node on a cluster whose node 1 has 1 is refused before
    any actor starts. No placement group outlives a run."""
    from rlinf_mini.scheduler import devices

    def launch_all(placement: dict, num_devices: int, num_nodes: int, timeout_s: float = 20):
        placement = ComponentPlacement(placement, num_devices)
        strategies = {c: placement.get_strategy(c) for c in ("actor", "rollout")}
        plan = devices.device_plan(strategies, num_devices, torch.cuda.device_count())
        c = Cluster(ClusterConfig(backend="ray", num_nodes=num_nodes, num_devices=num_devices, timeout_s=timeout_s),
                    device_plan=plan)
        try:
            groups = [EchoWorker.create_group(None).launch(c, strategies[n], name=n) for n in strategies]
            return c, [g.info().wait()[0] for g in groups]
        except BaseException:
            c.shutdown()
            raise

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    before = set(_our_placement_groups())
    head = ray.get_runtime_context().get_node_id()
    holder = _GpuHolder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    try:
        held = ray.get(holder.gpu.remote(), timeout=60)
        assert held == "0"  # Ray's first free one: so the placement's GPU 0 is not the GPU Ray gives our ranks
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        c, infos = launch_all({"actor": "0", "rollout": "0"}, 2, 2)
        try:
            free = {"0", "1"} - {held}
            # the placement says GPU 0; Ray's free one is the other: both ranks pin it, and it is what Ray gave them
            assert [i["cuda_visible"] for i in infos] == [*free, *free], (held, infos)
            assert [i["ray_gpu_ids"] for i in infos] == [[*free], [*free]]
            free_gpus_become(1.0)  # 3 - the holder's - our bundle's (0.5 + 0.5 in it): node 1's GPU is left free
        finally:
            c.shutdown()
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        with pytest.raises(TimeoutError, match=r"^Ray reserved no GPU for GPU 1 of node \w+ within "
                                               r"cluster\.timeout_s=3 s: another job holds the node's GPUs$"):
            launch_all({"actor": "0", "rollout": "1"}, 2, 1, timeout_s=3)  # node 0 has one free GPU, not two
    finally:
        ray.kill(holder)
    free_gpus_become(3.0)
    c, infos = launch_all({"actor": "0", "rollout": "1"}, 2, 1)  # kept apart: apart on Ray's GPUs too
    try:
        assert sorted(i["cuda_visible"] for i in infos) == ["0", "1"]
        assert [[i["cuda_visible"]] for i in infos] == [i["ray_gpu_ids"] for i in infos]
    finally:
        c.shutdown()
    free_gpus_become(3.0)
    assert set(_our_placement_groups()) == before
    with pytest.raises(ConfigError, match=r"^cluster\.num_devices: the placement needs 2 GPU\(s\) on each of 2 "
                                          r"node\(s\), but Ray node 1 \(\S+\) of the Ray cluster at \S+ has 1$"):
        Cluster(ClusterConfig(backend="ray", num_nodes=2, num_devices=4))
    assert alive_actors() == []


def launch_echo(cluster, devices: str, num_devices: int, name: str, cls=EchoWorker):
    return cls.create_group(None).launch(cluster, ComponentPlacement({"p": devices}, num_devices).get_strategy("p"),
                                         name=name)


@pytest.fixture
def two_nodes(ray_cluster):
    c = Cluster(ClusterConfig(backend="ray", num_nodes=2, num_devices=2, timeout_s=20))
    yield c
    c.shutdown()


@ray.remote(num_cpus=0.01, max_concurrency=2)
class _Producer:
    """A bare Ray actor that puts into a channel (not a rank: its death is not the cluster's to report, so the
    consumer's own timeout is what ends its wait). Its second thread answers `in_flight` while it puts."""

    def pid(self) -> int:
        return os.getpid()

    def produce(self, channel, items: list, key) -> list[float]:
        """time.monotonic() after each put returned (CLOCK_MONOTONIC: the driver's clock too)."""
        times = []
        for item in items:
            channel.put(item, key=key, timeout=20)
            times.append(time.monotonic())
        return times

    def stream(self, channel, nbytes: int, key) -> None:
        import numpy as np

        item = np.zeros(nbytes, dtype=np.uint8)
        while True:
            channel.put(item, key=key)

    def in_flight(self, channel, key) -> int:
        """This process's puts to `key` that the queue actor has not answered yet."""
        from rlinf_mini.scheduler import ray_channel

        box = ray_channel._outboxes.get((channel.transport.uid, key))
        refs = [ref for ref, _ in list(box.in_flight)] if box is not None else []
        return len(ray.wait(refs, num_returns=len(refs), timeout=0)[1]) if refs else 0


@pytest.fixture(scope="class")  # TestOneGroupOnTwoNodes' shared cluster
def two_node_echo(ray_cluster):
    c = Cluster(ClusterConfig(backend="ray", num_nodes=2, num_devices=2, timeout_s=20))
    try:
        group = launch_echo(c, "0-1", 2, "Echo")
        group.info().wait()
        Channel.create("made_at_setup", c)  # the cluster's queue actor, shared too
        SHARED.update(a["ActorID"] for a in _alive())
        yield c, group
    finally:
        SHARED.clear()
        c.shutdown()


class TestOneGroupOnTwoNodes:
    """One cluster of both nodes with one Echo group (rank 0 on node 0, rank 1 on node 1) and its queue actor, shared
    by these tests in their order; the last one hangs rank 0 and kills rank 1, and ends the cluster (a group and a
    cluster per test started 4 rank actors and 3 queue actors more)."""

    def test_exception_and_constructor_failure_are_reported_like_local(self, two_node_echo):
        cluster, group = two_node_echo
        with pytest.raises(WorkerError, match=r"Echo rank 1 raised in fail\(\)") as err:
            group.fail(1).wait()
        assert "Traceback" in str(err.value) and "ValueError: planned failure on rank 1" in str(err.value)
        assert group.add(1, b=2).wait() == [3, 4]  # the group still serves calls
        broken = launch_echo(cluster, "1", 2, "Broken", BrokenWorker)
        try:
            with pytest.raises(WorkerError,
                               match=r"Broken rank 0 failed to start:[\s\S]*constructor failed on purpose"):
                broken.info().wait()
        finally:
            broken.shutdown()

    def test_channels_cross_nodes_bounded_and_in_order(self, two_node_echo):
        two_nodes, group = two_node_echo
        bounded = Channel.create("bounded", two_nodes, maxsize=2)
        # large (80 KB: by ObjectRef through the object store) and small (as bytes) in turn: the puts are pipelined
        items = [torch.full((20_000,), i) if i % 2 else torch.randn(1000) for i in range(20)]
        items.append({"small": torch.arange(3), "text": "x"})
        consumed = group.execute_on(1).consume(bounded, len(items), "k", 20)  # node 1 reads what node 0 writes
        produced = group.execute_on(0).produce(bounded, items, "k")
        assert produced.wait() == [len(items)]
        got = consumed.wait()[0]
        for a, b in zip(items[:-1], got[:-1], strict=True):
            assert torch.equal(a, b)
        assert torch.equal(got[-1]["small"], torch.arange(3)) and got[-1]["text"] == "x"
        bounded.put(1, key="full")
        bounded.put(2, key="full")
        assert bounded.qsize("full") == 2
        with pytest.raises(ChannelTimeout, match=r"still full after 0\.3 s \(is its consumer alive and reading\?\)"):
            bounded.put(3, key="full", timeout=0.3)
        assert [bounded.get(key="full"), bounded.get(key="full")] == [1, 2]
        unbounded = Channel.create("unbounded", two_nodes)
        for i in range(600):  # beyond what a kernel socket buffer holds: unbounded means unbounded
            unbounded.put(i, key="u")
        assert unbounded.qsize("u") == 600 and [unbounded.get(key="u") for _ in range(600)] == list(range(600))
        with pytest.raises(ChannelTimeout, match=r"nothing arrived within 0\.2 s"):
            unbounded.get(key="empty", timeout=0.2)
        with pytest.raises(ValueError, match="already exists"):
            Channel.create("bounded", two_nodes)
        group.trace_enable().wait()  # a get that waits is traced as wait_get, for as long as it waited
        for attempt in range(10):  # the put may win the race against the consumer's second get: then it never waits
            key = f"late{attempt}"
            unbounded.put("first", key=key)
            waiting = group.execute_on(1).consume(unbounded, 2, key, 20)
            deadline = time.monotonic() + 60  # a hang guard
            while unbounded.qsize(key):  # the consumer took the first item: its second get is the one that waits
                assert time.monotonic() < deadline, "the consumer did not take the first item"
            put_ns = time.monotonic_ns()
            unbounded.put("late", key=key)
            assert waiting.wait() == [["first", "late"]]
            waits = [(start, end) for _, _, name, _, start, end in group.execute_on(1).trace_drain().wait()[0]
                     if name == "wait_get"]
            if waits and put_ns < waits[-1][1]:
                break
        # by events: the last wait ended after the item it waited for was put (one clock, one host). Whether it
        # began before the put is a race (the consumer's get may start after it while the item is still in flight);
        # the first get may have waited too, for the first item's pipelined put
        assert 1 <= len(waits) <= 2 and waits[-1][0] < waits[-1][1] and put_ns < waits[-1][1], (waits, put_ns)
        group.trace_enable(False).wait()

    def test_a_lent_buffer_follows_the_same_rules_on_ray(self, two_node_echo):
        """Channel.empty on Ray is ordinary memory (the object store copies on put), under the rules of every
        backend."""
        check_lent_buffer_rules(Channel.create("rules", two_node_echo[0], maxsize=4), "ray")

    def test_pipelined_puts_keep_bound_and_timeout_and_a_killed_producer_hangs_no_consumer(self, two_node_echo):
        """A put that finds a slot free does not wait for the queue actor's answer; the bound and the timeouts are the
        unpipelined ones (the order: test_channels_cross_nodes_bounded_and_in_order)."""
        two_nodes = two_node_echo[0]
        producer = _Producer.remote()
        try:
            # the bound: put i (maxsize 2) cannot return before the consumer started taking item i - 2
            bounded = Channel.create("bound", two_nodes, maxsize=2)
            produced = producer.produce.remote(bounded, list(range(6)), "b")
            deadline = time.monotonic() + 60  # a hang guard: a busy machine starts a Ray call late
            while bounded.qsize("b") < 2:
                assert time.monotonic() < deadline, "the producer did not fill the channel"
                time.sleep(0.1)
            get_started = []  # the two went in before any get (the loop above): the second one was pipelined
            for i in range(6):
                get_started.append(time.monotonic())
                assert bounded.get(key="b", timeout=20) == i
            put_done = ray.get(produced, timeout=20)
            assert all(put_done[i] >= get_started[i - 2] for i in range(2, 6)), (put_done, get_started)
            # two producers on one key: a pipelined put of the driver meets the queue filled by the other after all;
            # it waits in the queue actor up to its timeout, and the driver's next call on the key reports it
            shared = Channel.create("shared", two_nodes, maxsize=2)
            shared.put("a", key="s")  # answered: the driver knows one slot is free
            ray.get(producer.produce.remote(shared, ["b"], "s"), timeout=20)  # ...which the other producer takes
            shared.put("c", key="s", timeout=0.3)  # pipelined: returns at once
            # the driver's next call on the key after the put's timeout has run out in the queue actor reports it (the
            # wait it names is the put's time left when it was sent: its 0.3 s less the send)
            deadline, reported = time.monotonic() + 20, None
            while reported is None:
                assert time.monotonic() < deadline, "the timed-out pipelined put was never reported"
                try:
                    assert shared.qsize("s") == 2  # not yet timed out: the put still waits in the queue actor
                except ChannelTimeout as e:
                    reported = str(e)
            assert re.search(r"an earlier put of this process found it still full after 0\.\d+ s", reported), reported
            assert [shared.get(key="s"), shared.get(key="s"), shared.qsize("s")] == ["a", "b", 0]
            # a producer killed with puts in flight: the consumer's gets end within their timeout (the queued items,
            # then lost items or nothing more), the wait does not hang on the dead producer's puts
            killed = Channel.create("killed", two_nodes)  # unbounded: every put is pipelined
            pid = ray.get(producer.pid.remote())
            producer.stream.remote(killed, 100_000, "k")  # 100 KB each: by ObjectRef, owned by the producer
            assert killed.get(key="k", timeout=20).nbytes == 100_000
            deadline = time.monotonic() + 60  # a hang guard
            while not 0 < ray.get(producer.in_flight.remote(killed, "k")) <= MAX_IN_FLIGHT:  # the check can fail
                assert time.monotonic() < deadline, "the producer never had a put in flight"
            os.kill(pid, signal.SIGKILL)
            with pytest.raises((ChannelTimeout, ChannelClosed)):
                while True:
                    killed.get(key="k", timeout=2)
        finally:
            ray.kill(producer)  # (killed already when the test gets this far)

    def test_a_hang_and_a_kill9_are_reported_and_the_shutdown_ends_the_rest(self, two_node_echo):
        """Last: the hang of rank 0, then the kill -9 of rank 1 seen within 10 s, naming group and rank, by a driver
        blocked in a channel get and by a pending call; then the cluster's shutdown, which kills the hung rank after
        the grace period and waits until no actor is left."""
        two_nodes, group = two_node_echo
        infos = group.info().wait()
        assert [i["rank"] for i in infos] == [0, 1] and not any(i["cuda_before_pinning"] for i in infos)
        assert [i["cuda_visible"] for i in infos] == ["", ""]  # Ray's own CUDA_VISIBLE_DEVICES was replaced by ours
        # at the driver's niceness, not Ray's 15 for its workers (both nodes are this machine: their pids are ours)
        assert [os.getpriority(os.PRIO_PROCESS, i["pid"]) for i in infos] == [os.getpriority(os.PRIO_PROCESS, 0)] * 2
        slept_at = time.monotonic()  # rank 0's sleep of 60 s starts after this: it cannot end before slept_at + 60
        with pytest.raises(TimeoutError, match=r"Echo\.sleep\(\) did not return from rank\(s\) \[0\] within 1 s"):
            group.execute_on(0).sleep(60).wait(timeout=1)
        pending = group.sleep(30)  # rank 1 sleeps (rank 0 is still in its sleep of 60 s)
        pid = infos[1]["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=rf"Echo rank 1 \(pid {pid}\) died with Ray actor died"):
            Channel.create("never", two_nodes).get(key="never", timeout=20)
        with pytest.raises(WorkerDiedError, match=rf"^Echo rank 1 \(pid {pid}\) died with Ray actor died"):
            pending.wait()
        SHARED.clear()
        assert sorted(alive_actors()) == ["RankActor", "_ChannelActor"]  # rank 0, hung (the check below can fail)
        two_nodes.shutdown()  # the hung rank is killed after the grace period
        assert time.monotonic() < slept_at + 60  # it killed the hung rank: its sleep of 60 s had not ended
        assert alive_actors() == []  # the cluster's shutdown waited for every actor to be gone


def test_num_nodes_beyond_the_ray_cluster_is_refused(ray_cluster):
    with pytest.raises(ConfigError, match=r"cluster\.num_nodes: 3, but the Ray cluster at \S+ has 2 alive node\(s\)"):
        Cluster(ClusterConfig(backend="ray", num_nodes=3, num_devices=3))


def test_weight_sync_remote_and_same_node_paths_and_timeout(two_nodes, monkeypatch):
    """Both sides of stages/sync.py in this process, told they are on Ray nodes: a buffer on another node gets the
    weights through the mailbox (the object store), one on the same node the shared-memory copy plus a notice."""
    from stages.sync import WeightReceiver, WeightSender

    torch.manual_seed(0)
    actor_model, rollout_model = torch.nn.Linear(200, 100), torch.nn.Linear(200, 100)  # 80 KB: by ObjectRef
    monkeypatch.setenv("RLINF_MINI_RAY_NODE", "node-a")
    receiver, sender = WeightReceiver(rollout_model), WeightSender()
    try:
        assert receiver.handle().node == "node-a" and receiver.handle().mailbox is not None
        for version, node in ((1, "node-b"), (2, "node-a")):  # remote, then same node
            with torch.no_grad():
                actor_model.weight.add_(1.0)
            monkeypatch.setenv("RLINF_MINI_RAY_NODE", node)  # the sender's node
            assert sender.send(actor_model, [receiver.handle()], version) == 4 * (200 * 100 + 100)
            receiver.wait_for_version(version, timeout=20)
            for k, v in actor_model.state_dict().items():
                assert torch.equal(v, rollout_model.state_dict()[k]), (version, k)
        with pytest.raises(TimeoutError, match=r"version 3 did not arrive from actor rank 0 within 0\.3 s \(buffer "
                                               r"holds version 2\)"):
            receiver.wait_for_version(3, timeout=0.3)
    finally:
        sender.close()
        receiver.close()
    assert alive_actors() == ["_ChannelActor"]  # the mailbox, made here; the cluster's shutdown removes it


def test_async_weight_read_takes_the_newest_version_by_mailbox_on_both_paths(two_nodes, monkeypatch):
    """Async PPO's read on Ray (WeightReceiver.load_newest): with several versions published since the last read it
    copies the newest, from the mailbox's weights (another node) or from the buffer a notice names (same node); it
    waits for a version >= the bound and times out naming it; the rollout's own weights stay out of the buffer."""
    from stages.sync import WeightReceiver, WeightSender

    torch.manual_seed(0)
    actor_model, rollout_model = torch.nn.Linear(200, 100), torch.nn.Linear(200, 100)
    serving = copy.deepcopy(rollout_model)  # the model the rollout infers with (async PPO's copy)
    monkeypatch.setenv("RLINF_MINI_RAY_NODE", "node-a")
    receiver, sender = WeightReceiver(rollout_model), WeightSender()
    try:
        for versions, node in (((1, 2, 3), "node-b"), ((4, 5), "node-a")):  # remote, then same node
            monkeypatch.setenv("RLINF_MINI_RAY_NODE", node)  # the sender's node
            for version in versions:  # published one after the other before the rollout reads
                with torch.no_grad():
                    actor_model.weight.fill_(float(version))
                sender.send(actor_model, [receiver.handle()], version)
            assert receiver.load_newest(serving, min_version=versions[0], timeout=20) == versions[-1]
            assert torch.equal(serving.weight, torch.full_like(serving.weight, float(versions[-1]))), versions
            assert receiver.mailbox.qsize(receiver.segment.name) == 0  # every message taken
        assert receiver.load_newest(serving, min_version=4, timeout=20) == 5  # nothing new: the newest again
        with pytest.raises(TimeoutError, match=r"version >= 6 did not arrive from actor rank 0 within 0\.3 s \(buffer "
                                               r"holds version 5\)"):
            receiver.load_newest(serving, min_version=6, timeout=0.3)
    finally:
        sender.close()
        receiver.close()
    assert alive_actors() == ["_ChannelActor"]


def test_async_ppo_on_ray_staleness_0_is_the_local_sync_run_and_staleness_1_keeps_the_bound(ray_cluster, tmp_path):
    """Async PPO on one Ray node (the same-node buffer and its notices) and on two (the rollout on node 1: weights
    through the mailbox): staleness 0 is the local synchronous run bit for bit, staleness 1 queues batch i+1 before
    the actor trains batch i and trains only on versions within the bound."""
    from test_async_ppo import ASYNC, assert_staleness_0_is_the_sync_run, assert_within_staleness_1
    from test_async_ppo import train as train_async

    sync = train_async(tmp_path, "sync")
    for nodes in (1, 2):
        ray_cluster_cfg = {"backend": "ray", "num_nodes": nodes}
        s0 = train_async(tmp_path, f"s0_{nodes}", algorithm={**ASYNC, "staleness_threshold": 0},
                         cluster=ray_cluster_cfg)
        assert_staleness_0_is_the_sync_run(sync, s0)
        s1 = train_async(tmp_path, f"s1_{nodes}", algorithm={**ASYNC, "staleness_threshold": 1},
                         cluster=ray_cluster_cfg)
        assert s1.launch_log == [(0, 0), (1, 0), (2, 2), (3, 2)]  # a save at step 2 is a barrier (save_interval 2)
        assert_within_staleness_1(s1)


def test_one_node_kernel_queues_a_killed_rank_ends_the_wait_and_leaves_nothing(ray_cluster):
    """One node: the channel is the kernel queues (the same-node fast path); a large tensor goes through the rank's
    shared segments, a kill -9 of the rank ends the driver's get (the death, not the timeout), and after the shutdown
    no actor and no segment of the run is left."""
    from rlinf_mini.scheduler import shm
    from rlinf_mini.scheduler.kernel_queues import KernelQueues

    c = Cluster(ClusterConfig(backend="ray", num_devices=1, timeout_s=20))
    try:
        group = launch_echo(c, "0", 1, "Echo")
        pid = group.info().wait()[0]["pid"]
        channel = Channel.create("fast", c, maxsize=2)
        assert isinstance(channel.transport, KernelQueues)
        big = torch.arange(100_000, dtype=torch.float32)  # 400 KB: through a shared segment of the rank's pool
        group.produce(channel, [big, {"small": 1}], "k").wait()
        assert torch.equal(channel.get(key="k", timeout=20), big) and channel.get(key="k", timeout=20) == {"small": 1}
        assert list(shm.SHM_DIR.glob(f"{shm.PREFIX}{c.run_id}_*"))  # the rank's segment (the check can fail)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=rf"Echo rank 0 \(pid {pid}\) died with Ray actor died"):
            channel.get(key="never", timeout=20)  # the death, not the timeout: the exception says which
    finally:
        c.shutdown()
    assert list(shm.SHM_DIR.glob(f"{shm.PREFIX}{c.run_id}_*")) == []
