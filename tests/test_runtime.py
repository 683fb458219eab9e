"""The runtime: worker groups (fan-out, futures, errors, pinning), channels (keys, bounds, timeouts, shared-memory
tensors) and the cluster's cleanup. One cluster and one 2-rank group are shared by the whole module."""

from __future__ import annotations

import os
import time

import pytest
import torch
from toy_workers import BrokenWorker, EchoWorker

from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler.channel import Channel, ChannelTimeout
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.codec import dumps, loads
from rlinf_mini.scheduler.local import INLINE_MAX
from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR
from rlinf_mini.scheduler.worker import WorkerDiedError, WorkerError
from stages.placement import ComponentPlacement


def test_call_runs_on_every_rank_and_returns_in_rank_order(echo):
    infos = echo.info().wait()
    assert [i["rank"] for i in infos] == [0, 1]
    assert all(i["world_size"] == 2 and i["group"] == "Echo" and i["tag"] == "hello" for i in infos)
    assert len({i["pid"] for i in infos}) == 2 and all(i["pid"] != os.getpid() for i in infos)
    assert echo.add(1, b=2).wait() == [3, 4]


def test_processes_are_pinned_to_their_virtual_device(cluster, echo):
    infos = echo.info().wait()
    for info in infos:
        assert info["cores"] == cluster.device_cores(info["rank"])
        assert info["threads"] == 1  # one device: one thread (devices.rank_threads), whatever cores it has
        assert info["cuda_visible"] == ""  # no GPU: CUDA is hidden, the device is a CPU share
        assert info["cuda_before_pinning"] is False  # pinned before anything initialized CUDA


def test_a_ranks_threads_are_cluster_threads_per_device_times_its_devices():
    cluster = Cluster(ClusterConfig(num_devices=2, timeout_s=20, threads_per_device=3))
    try:
        placement = ComponentPlacement({"one": "0", "both": "0-1:0"}, cluster.num_devices)  # 1 device; 2 devices
        one = EchoWorker.create_group(None, "t").launch(cluster, placement.get_strategy("one"), name="One")
        both = EchoWorker.create_group(None, "t").launch(cluster, placement.get_strategy("both"), name="Both")
        assert [i["threads"] for i in one.info().wait() + both.info().wait()] == [3, 6]
    finally:
        cluster.shutdown()


def test_execute_on_selects_ranks_for_one_call(echo):
    assert echo.execute_on(1).add(10).wait() == [11]
    assert len(echo.add(0).wait()) == 2  # the selection does not stick


def test_calls_on_a_group_return_futures_at_once(echo):
    echo.info().wait()  # the group is up (its start takes seconds)
    fut = echo.sleep(1.0)
    assert not fut.done()  # the call returned before its 1 s on the ranks could end (done() takes any result in)
    assert fut.wait() == [1.0, 1.0]


def test_worker_exception_reaches_driver_with_group_rank_and_traceback(echo):
    with pytest.raises(WorkerError) as exc:
        echo.fail(1).wait()
    msg = str(exc.value)
    assert "Echo rank 1" in msg and "fail()" in msg and "planned failure on rank 1" in msg
    assert "Traceback" in msg and "toy_workers.py" in msg
    assert echo.info().wait()[1]["rank"] == 1  # the worker survives its exception


def test_unpicklable_result_is_an_error_not_a_hang(echo):
    with pytest.raises(WorkerError, match=r"(?s)Echo rank [01] raised in unpicklable\(\).*cannot be pickled"):
        echo.unpicklable().wait(timeout=10)


def test_results_carry_tensors(echo):
    assert torch.equal(echo.execute_on(0).add(torch.ones(3)).wait()[0], torch.ones(3))


def test_large_arguments_and_results_travel_whole_through_shared_memory_blobs(cluster, echo):
    # Over INLINE_MAX a command or a result goes through a pooled shared-memory blob instead of the pipe; its reader
    # copies it out and frees it, so repeating the call reuses the blobs instead of adding segments.
    big = "".join(chr(65 + i % 26) for i in range(3 * INLINE_MAX))
    small = "s"
    assert echo.mirror(big).wait() == [(0, big[::-1]), (1, big[::-1])]
    assert echo.mirror(small).wait() == [(0, "s"), (1, "s")]  # both kinds, one after the other, in order
    assert echo.execute_on(1).mirror(big * 40).wait() == [(1, (big * 40)[::-1])]
    segments = set(SHM_DIR.glob(f"{PREFIX}{cluster.run_id}_msg_*"))
    for _ in range(20):
        assert echo.mirror(big).wait() == [(0, big[::-1]), (1, big[::-1])]
    # the pools grow with the blobs in flight at once (one per rank), not with the number of calls: 20 calls of 2
    # blobs each way add at most one segment per rank (whether one was needed depends on who read first)
    assert len(set(SHM_DIR.glob(f"{PREFIX}{cluster.run_id}_msg_*")) - segments) <= 2


def test_many_calls_in_flight_return_in_order_without_deadlock(echo):
    # 600 calls submitted before any wait, ~2 MB of commands and of results each way, more than a pipe holds: the
    # worker blocks writing results that nobody reads yet, its command pipe fills, and the driver's submit must read
    # results while it waits for room, or each would wait for the other forever.
    texts = ["y" * (3000 + i * 37 % (INLINE_MAX - 3000)) if i % 50 else "z" * 3 * INLINE_MAX for i in range(600)]
    futures = [echo.mirror(text) for text in texts]
    for text, fut in zip(texts, futures, strict=True):
        assert fut.wait(timeout=30) == [(0, text[::-1]), (1, text[::-1])]


def test_a_result_taken_while_checking_the_workers_ends_the_wait_at_once(cluster, echo, monkeypatch):
    # The waiting driver drains every group while it checks the workers. A result taken in there must end the wait
    # at once; it once went unnoticed until the next wake-up, POLL_S later. Proven by events, not by time: the check
    # below keeps draining until the awaited result has landed in it, and no blocking drain may start while a
    # complete result sits unclaimed in the group.
    echo.info().wait()  # the group is up (its start takes seconds)
    check, drain = cluster.check_workers, echo._drain

    def complete() -> bool:
        return any(len(got) == echo.world_size for got in echo._results.values())

    def check_until_the_result_lands() -> None:
        deadline = time.monotonic() + 20  # a hang guard
        check()
        while not complete() and time.monotonic() < deadline:
            time.sleep(0.002)
            check()

    blocked_with_a_result = []

    def watched_drain(block_s: float = 0.0) -> None:
        if block_s > 0 and complete():
            blocked_with_a_result.append(block_s)
        drain(block_s=block_s)

    monkeypatch.setattr(cluster, "check_workers", check_until_the_result_lands)
    monkeypatch.setattr(echo, "_drain", watched_drain)
    for _ in range(5):
        assert echo.sleep(0.01).wait() == [0.01, 0.01]
    assert blocked_with_a_result == []


def test_wait_timeout_names_the_call_and_the_ranks(echo):
    with pytest.raises(TimeoutError, match=r"Echo.sleep\(\) did not return from rank\(s\) \[0, 1\]"):
        echo.sleep(1.5).wait(timeout=0.3)
    echo.info().wait()  # a rank runs its calls in order: this returns once the abandoned sleeps have finished


def test_unknown_method_is_an_attribute_error(echo):
    with pytest.raises(AttributeError, match="no public method 'nope'"):
        echo.nope()
    with pytest.raises(AttributeError):
        echo._private()


def test_channel_keys_are_separate_fifo_queues(cluster, echo):
    ch = Channel.create("keys", cluster, maxsize=8)
    echo.execute_on(0).produce(ch, [1, 2, 3], "a").wait()
    echo.execute_on(0).produce(ch, ["x"], "b").wait()
    assert ch.qsize("a") == 3 and ch.qsize("b") == 1
    assert echo.execute_on(1).consume(ch, 1, "b").wait() == [["x"]]
    assert echo.execute_on(1).consume(ch, 3, "a").wait() == [[1, 2, 3]]


def test_channel_get_times_out_with_the_channel_and_key(cluster):
    ch = Channel.create("empty", cluster)
    with pytest.raises(ChannelTimeout, match=r"channel 'empty' key 'k': nothing arrived .* expected from Env rank 3"):
        ch.get(key="k", timeout=0.3, expected_from="Env rank 3")


def test_bounded_channel_blocks_put_until_timeout(cluster):
    ch = Channel.create("bounded", cluster, maxsize=2)
    ch.put(1, key="q")
    ch.put(2, key="q")
    with pytest.raises(ChannelTimeout, match="still full"):
        ch.put(3, key="q", timeout=0.2)
    assert ch.get(key="q") == 1
    ch.put(3, key="q", timeout=0.2)  # room again
    assert [ch.get(key="q"), ch.get(key="q")] == [2, 3]


def test_tensors_cross_processes_exactly_small_inline_and_large_via_shared_memory(cluster, echo):
    ch = Channel.create("tensors", cluster, maxsize=4)
    small = {"obs": torch.randn(4, 3), "mask": torch.tensor([True, False]), "n": 7}
    large = {"images": torch.randint(0, 255, (64, 3, 64, 64), dtype=torch.uint8),
             "view": torch.arange(200_000.0).reshape(400, 500)[:, ::2]}  # non-contiguous
    ch.put(small, key=0)
    ch.put(large, key=0)
    got = echo.execute_on(1).consume(ch, 2, 0).wait()[0]
    assert torch.equal(got[0]["obs"], small["obs"]) and torch.equal(got[0]["mask"], small["mask"])
    assert torch.equal(got[1]["images"], large["images"]) and torch.equal(got[1]["view"], large["view"])
    # a large tensor travels as a descriptor of a few hundred bytes, not as its 786 KB
    assert len(dumps(large)) < 1000
    assert len(dumps(small)) > 4 * 3 * 4


def test_shared_memory_segments_are_reused_not_reallocated_per_message():
    t = torch.ones(100_000)
    ours = f"{PREFIX}{os.getpid()}-"  # this process's segments (other test processes may run beside it)
    before = set(SHM_DIR.glob(f"{ours}*"))
    for _ in range(20):
        assert torch.equal(loads(dumps(t)), t)  # the receiver frees the segment, the sender reuses it
    created = set(SHM_DIR.glob(f"{ours}*")) - before
    assert len(created) <= 1


def test_worker_death_is_reported_with_group_rank_pid_and_exit_code(cluster):
    placement = ComponentPlacement({"doomed": "0"}, cluster.num_devices)
    doomed = EchoWorker.create_group(None).launch(cluster, placement.get_strategy("doomed"), name="Doomed")
    pid = doomed.info().wait()[0]["pid"]
    with pytest.raises(WorkerDiedError, match=rf"Doomed rank 0 \(pid {pid}\) died with exit code 7"):
        doomed.exit_hard(7).wait()
    doomed.shutdown()  # a dead group is retired; the rest of the cluster carries on
    cluster.groups.remove(doomed)


def test_constructor_failure_is_reported_with_traceback(cluster):
    placement = ComponentPlacement({"broken": "0"}, cluster.num_devices)
    broken = BrokenWorker.create_group(None).launch(cluster, placement.get_strategy("broken"), name="Broken")
    with pytest.raises(WorkerError, match=r"(?s)Broken rank 0 failed to start.*constructor failed on purpose"):
        broken.info().wait()
    broken.shutdown()
    cluster.groups.remove(broken)


def test_shutdown_stops_every_process_and_removes_shared_memory():
    c = Cluster(ClusterConfig(num_devices=2, timeout_s=20))
    g = EchoWorker.create_group(None).launch(c, ComponentPlacement({"g": "0-1"}, 2).get_strategy("g"))
    ch = Channel.create("big", c, maxsize=2)
    g.execute_on(0).produce(ch, [torch.ones(100_000)], "k").wait()  # rank 0 now owns a segment
    pids = [i["pid"] for i in g.info().wait()]
    assert any(n.startswith(f"{PREFIX}{c.run_id}_") for n in os.listdir(SHM_DIR))
    c.shutdown()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{c.run_id}_")]
