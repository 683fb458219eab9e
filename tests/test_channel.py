"""The channel's transport: per-key kernel queues shared by several producers and consumers (exactly-once delivery,
the bound holds), exact qsize, large pickles as shared-memory blobs, and ChannelClosed when the server goes away.
The zero-copy put (Channel.empty): a batch built in a lent segment arrives bitwise in another process, in the very
segment the producer filled, each segment free again once both sides dropped it; its rules (put once, no write
after the put) are enforced the same on local and inline (and on Ray: test_ray.py); an env that draws frames in
shared memory trains bitwise the same on local and inline."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import types

import pytest
import torch
from conftest import write_config
from toy_workers import LENT_BATCH, EchoWorker, batch_pattern

from rlinf_mini.config import ClusterConfig, load_config
from rlinf_mini.scheduler import codec, kernel_queues, spin_wait
from rlinf_mini.scheduler.channel import Channel, ChannelClosed, ChannelTimeout, LentBufferError
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.kernel_queues import ChannelServer, KernelQueues
from rlinf_mini.scheduler.worker import WorkerDiedError
from stages.placement import ComponentPlacement


def test_two_producer_processes_and_two_consumer_threads_get_every_item_exactly_once(cluster, echo):
    ch = Channel.create("many", cluster, maxsize=3)
    items = [[(r, i) for i in range(150)] for r in range(2)]
    produced = [echo.execute_on(r).produce(ch, items[r], "k") for r in range(2)]
    got: list[list] = [[], []]

    def consume(j: int) -> None:
        for _ in range(150):
            got[j].append(ch.get(key="k", timeout=20))
            assert ch.qsize("k") <= 3  # the bound holds with two producers (a token per free slot)

    threads = [threading.Thread(target=consume, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [f.wait() for f in produced] == [[150], [150]]
    assert sorted(got[0] + got[1]) == sorted(items[0] + items[1])
    for j in range(2):  # each producer's items stay in order within what one consumer saw
        for r in range(2):
            seq = [i for (rr, i) in got[j] if rr == r]
            assert seq == sorted(seq)
    assert ch.qsize("k") == 0


def test_unbounded_qsize_counts_queued_items_and_a_bound_blocks_at_maxsize(cluster):
    ch = Channel.create("count", cluster)
    for i in range(200):  # (the kernel buffers hold ~550 small messages at Linux's default wmem_max)
        ch.put({"i": i}, key="u", timeout=2)
    assert ch.qsize("u") == 200
    assert [ch.get(key="u")["i"] for _ in range(200)] == list(range(200))
    assert ch.qsize("u") == 0
    bounded = Channel.create("bound5", cluster, maxsize=5)
    for i in range(5):
        bounded.put(i, key=0, timeout=1)
    with pytest.raises(ChannelTimeout, match=r"channel 'bound5' key 0: still full"):
        bounded.put(5, key=0, timeout=0.2)
    assert bounded.qsize(0) == 5 and bounded.get(key=0) == 0 and bounded.qsize(0) == 4


def test_a_large_pickle_of_small_tensors_travels_as_a_blob_exactly(cluster, echo):
    ch = Channel.create("blob", cluster, maxsize=2)
    item = {f"t{i}": torch.randn(100, 50) for i in range(8)}  # 8 x 20 KB, each under SHM_MIN_BYTES: 160 KB pickle
    assert len(codec.dumps(item)) > kernel_queues._MSG_MAX
    ch.put(item, key="b")
    got = echo.execute_on(1).consume(ch, 1, "b").wait()[0][0]
    assert got.keys() == item.keys() and all(torch.equal(got[k], item[k]) for k in item)


def test_a_blocked_get_ends_with_channel_closed_when_the_server_goes_away():
    server = ChannelServer()
    server.create("gone", 2)
    ch = Channel("gone", KernelQueues("gone", server.address, server.authkey, 30.0), 30.0)
    ch.put(1, key="k")
    assert ch.get(key="k") == 1
    threading.Timer(0.3, server.close).start()
    with pytest.raises(ChannelClosed, match="'gone'"):
        ch.get(key="k", timeout=20)  # closed, not timed out: the exception says which


def test_a_bound_above_what_the_kernel_holds_is_refused_by_name(cluster):
    with pytest.raises(ValueError, match=r"channel 'huge': maxsize=100000 must be 0 \(unbounded\) to 512"):
        Channel.create("huge", cluster, maxsize=100_000)


def test_a_blocked_get_in_the_driver_ends_when_a_worker_dies(cluster):
    placement = ComponentPlacement({"doomed": "0"}, cluster.num_devices)
    doomed = EchoWorker.create_group(None).launch(cluster, placement.get_strategy("doomed"), name="ChanDoomed")
    doomed.info().wait()
    ch = Channel.create("watched", cluster)
    doomed.exit_hard(7)  # not waited for: the channel wait is what must notice
    with pytest.raises(WorkerDiedError, match=r"ChanDoomed rank 0 .* exit code 7"):
        ch.get(key="k", timeout=15)  # the death, not the timeout: the exception says which
    doomed.shutdown()
    cluster.groups.remove(doomed)


# ---------------------------------------------------------------------------------------------------------------------
# Channel.empty: a batch built in place and put without a copy


def test_a_batch_built_in_a_lent_segment_arrives_bitwise_in_another_process_without_a_copy(cluster, echo):
    ch = Channel.create("inplace", cluster, maxsize=2)
    produced = echo.execute_on(0).produce_in_place(ch, 6, "k")
    got = [ch.get(key="k", timeout=20) for _ in range(6)]  # all kept: none of their segments may be reused meanwhile
    names = produced.wait()[0]
    assert all(name is not None and name.startswith("rlmini_") for name in names)
    assert len(set(names)) == 6  # the consumer holds every batch, so the producer built each in a segment of its own
    for i, msg in enumerate(got):
        assert msg["i"] == i and torch.equal(msg["obs"], batch_pattern(i))
        assert codec.shared_segment_of(msg["obs"]) == names[i]  # the bytes the producer wrote, mapped: no copy
    del got, msg
    gc.collect()  # the consumer drops them: each segment is free again (the producer dropped its side after the put)
    produced = echo.execute_on(0).produce_in_place(ch, 6, "k")
    for i in range(6):
        msg = ch.get(key="k", timeout=20)
        assert torch.equal(msg["obs"], batch_pattern(i))
        del msg
    assert set(produced.wait()[0]) <= set(names)  # reused, none added


def check_lent_buffer_rules(ch: Channel, backend: str) -> None:
    """What every backend does with a buffer from Channel.empty (test_ray.py runs it on Ray)."""
    buf = ch.empty(LENT_BATCH, torch.uint8)
    buf.copy_(batch_pattern(1))
    ch.put({"obs": buf}, key="k")
    with pytest.raises(LentBufferError, match=rf"channel '{ch.name}' key 'again': this buffer from Channel.empty\(\) "
                                              rf"was put already, on channel '{ch.name}' key 'k'"):
        ch.put(buf, key="again")  # refused before anything is sent
    got = ch.get(key="k", timeout=10)["obs"]
    assert torch.equal(got, batch_pattern(1)) and ch.qsize("again") == 0
    if backend == "local":  # the consumer maps the producer's segment (here both are this process)
        assert codec.shared_segment_of(got) == codec.shared_segment_of(buf) is not None
    elif backend == "inline":  # handed over as it is, without the clone inline makes of other tensors
        assert got.data_ptr() == buf.data_ptr()
    buf[0, 0, 0, 0] += 1  # a write after the put: the consumer may see it, so the next put or empty() says so
    with pytest.raises(LentBufferError, match=rf"put on channel '{ch.name}' key 'k' was written after its put"):
        ch.put("next", key="k")
    ch.put("next", key="k")  # reported once; a clone of a put buffer is an ordinary tensor
    ch.put(buf.clone(), key="k")
    assert ch.get(key="k", timeout=10) == "next" and torch.equal(ch.get(key="k", timeout=10), buf)
    small = ch.empty((4,), torch.float32)  # under SHM_MIN_BYTES: ordinary memory, the same rules
    small.fill_(2.0)
    ch.put(small, key="k")
    with pytest.raises(LentBufferError, match="put already"):
        ch.put(small, key="k")
    assert torch.equal(ch.get(key="k", timeout=10), torch.full((4,), 2.0))
    with pytest.raises(TypeError, match=rf"channel '{ch.name}' empty\(\): dtype must be a torch.dtype, got 'uint8'"):
        ch.empty((4,), "uint8")


@pytest.mark.parametrize("backend", ["local", "inline"])
def test_a_lent_buffer_put_twice_or_written_after_its_put_is_refused_by_name(cluster, backend):
    if backend == "local":
        check_lent_buffer_rules(Channel.create("rules", cluster, maxsize=4), backend)
        return
    inline = Cluster(ClusterConfig(num_devices=2, timeout_s=20, backend="inline"))
    try:
        check_lent_buffer_rules(Channel.create("rules", inline, maxsize=4), backend)
    finally:
        inline.shutdown()


def test_frames_drawn_in_shared_memory_train_bitwise_the_same_on_local_and_inline(tmp_path):
    """PixelReach draws each frame in its rollout channel's memory (60x60 pixels x 8 envs per stage: 86 KB, over
    SHM_MIN_BYTES, so local puts it without a copy); two rollouts' trajectories (the VLA's forward inputs, images
    included: the env's frames as the rollout read them) agree bitwise with inline's, where the frames go as plain
    tensors. Two rollouts: the second starts from the first's last frame, which was put already (rollout.py)."""
    from rlinf_mini.train import RunPlan, launch

    side = 5 * 12
    assert 8 * 3 * side * side >= codec.SHM_MIN_BYTES
    out = {}
    for backend in ("local", "inline"):
        (tmp_path / backend).mkdir()
        cluster = {"backend": backend, "num_devices": 1, "component_placement": {"env,rollout,actor": "0"}}  # 3 ranks
        path = write_config(tmp_path / backend, base="configs/embodied.yaml", cluster=cluster,
                            runner={"max_epochs": 1, "val_check_interval": -1, "save_interval": -1,
                                    "progress_bar": False, "logger": {"logger_backends": []}},
                            env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 4,
                                           "init_params": {"cell_pixels": 12}},
                                 "eval": {"total_num_envs": 2, "init_params": {"cell_pixels": 12}}},
                            actor={"global_batch_size": 32, "micro_batch_size": 16,
                                   "model": {"model_path": str(tmp_path / "tiny_vla"), "patch_size": 12}})
        cfg = load_config(["--config", str(path)])
        plan = RunPlan(cfg, str(path))
        plan.run_dir.mkdir(parents=True)
        c = Cluster(cfg.cluster)
        try:
            runner = launch(cfg, plan, c)
            runner.init_workers()
            runner.update_rollout_weights()
            out[backend] = []
            for step in range(2):
                runner.global_step = step
                runner.generate_rollouts()
                out[backend] += runner.actor.get_rollout_batch().wait()  # per actor rank
        finally:
            c.shutdown()
    assert out["local"][0]["obs"]["images"].shape[-1] == side
    for a, b in zip(out["local"], out["inline"], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            va, vb = (a[k], b[k]) if isinstance(a[k], dict) else ({k: a[k]}, {k: b[k]})
            assert va.keys() == vb.keys() and all(torch.equal(va[n], vb[n]) for n in va), k


def test_a_wait_spins_only_while_spinning_catches_the_message(monkeypatch):
    """spin_wait.py polls a would-block socket for up to SPIN_S before sleeping in poll(); after SPIN_MISSES spins
    in a row that caught nothing it stops spinning, tries once every SPIN_RETRY waits; a try that catches resumes it."""
    monkeypatch.setattr(spin_wait, "_state", {"misses": 0, "skipped": 0})
    # a clock that moves one tick at each reading, and a spin of 8 ticks: a spin is 7 tries, however loaded the machine
    ticks = itertools.count()
    monkeypatch.setattr(spin_wait, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    monkeypatch.setattr(spin_wait, "SPIN_S", 8.0)
    calls = []

    def after(n: int):
        def op(arg, flags):  # a socket call that would block `n` times, then succeeds
            calls.append(flags)
            if len(calls) <= n:
                raise BlockingIOError
            return arg
        return op

    assert spin_wait.spin_for(after(3), b"msg") == b"msg" and len(calls) == 4  # caught within the spin
    assert calls[0] & spin_wait.socket.MSG_DONTWAIT  # never a blocking call
    for _ in range(spin_wait.SPIN_MISSES):  # the other side is slow: spins that catch nothing
        calls.clear()
        with pytest.raises(BlockingIOError):
            spin_wait.spin_for(after(10**9), b"msg")
        assert len(calls) == 7  # it polled until the spin's end, and no longer
    calls.clear()
    for _ in range(spin_wait.SPIN_RETRY - 1):  # no more spinning: straight to poll()
        with pytest.raises(BlockingIOError):
            spin_wait.spin_for(after(0), b"msg")
    assert calls == []
    assert spin_wait.spin_for(after(0), b"msg") == b"msg"  # the SPIN_RETRY-th wait tries, and catches...
    assert spin_wait._state == {"misses": 0, "skipped": 0}  # ...so the next waits spin again


@pytest.mark.parametrize("spin", [True, False], ids=["spin", "block"])
def test_a_wait_that_spins_or_blocks_gets_the_same_messages(monkeypatch, spin):
    """cluster.channel_wait: 'block' (no spin_wait) is the plain path; 'spin' delivers the same messages in the same
    order, whether the spin catches them or gives up and sleeps in poll()."""
    monkeypatch.setattr(spin_wait, "_state", {"misses": 0, "skipped": 0})
    spins = []
    monkeypatch.setattr(kernel_queues, "spin_for", lambda op, arg: spins.append(1) or spin_wait.spin_for(op, arg))
    server = ChannelServer()
    try:
        server.create("waits", 2)
        ch = Channel("waits", KernelQueues("waits", server.address, server.authkey, 20.0, spin=spin), 20.0)
        items = [{"i": i, "t": torch.full((3,), float(i))} for i in range(40)]

        def produce() -> None:
            for i, item in enumerate(items):
                if i % 4 == 0:
                    time.sleep(0.001)  # a slow producer now and then: the consumer's waits spin, or sleep
                ch.put(item, key="k")

        producer = threading.Thread(target=produce)
        producer.start()
        got = [ch.get(key="k", timeout=20) for _ in items]
        producer.join(20)
    finally:
        server.close()
    assert [g["i"] for g in got] == list(range(40))
    assert all(torch.equal(g["t"], w["t"]) for g, w in zip(got, items, strict=True))
    assert bool(spins) == spin  # the key decides whether a wait ever spins
