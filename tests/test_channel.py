"""The channel's transport: per-key kernel queues shared by several producers and consumers (exactly-once delivery,
the bound holds), exact qsize, large pickles as shared-memory blobs, and ChannelClosed when the server goes away."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from toy_workers import EchoWorker

from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler import codec, local
from rlinf_mini.scheduler.channel import Channel, ChannelClosed, ChannelTimeout
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.local import ChannelServer, KernelQueues
from rlinf_mini.scheduler.worker import WorkerDiedError
from stages.placement import ComponentPlacement


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(ClusterConfig(num_devices=2, timeout_s=20))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def echo(cluster):
    placement = ComponentPlacement({"echo": "0-1"}, cluster.num_devices)
    return EchoWorker.create_group(None, "t").launch(cluster, placement.get_strategy("echo"), name="ChanEcho")


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
    assert len(codec.dumps(item)) > local._MSG_MAX
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
    start = time.monotonic()
    with pytest.raises(ChannelClosed, match="'gone'"):
        ch.get(key="k", timeout=20)
    assert time.monotonic() - start < 5


def test_a_bound_above_what_the_kernel_holds_is_refused_by_name(cluster):
    with pytest.raises(ValueError, match=r"channel 'huge': maxsize=100000 must be 0 \(unbounded\) to 512"):
        Channel.create("huge", cluster, maxsize=100_000)


def test_a_blocked_get_in_the_driver_ends_when_a_worker_dies(cluster):
    placement = ComponentPlacement({"doomed": "0"}, cluster.num_devices)
    doomed = EchoWorker.create_group(None).launch(cluster, placement.get_strategy("doomed"), name="ChanDoomed")
    doomed.info().wait()
    ch = Channel.create("watched", cluster)
    doomed.exit_hard(7)  # not waited for: the channel wait is what must notice
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"ChanDoomed rank 0 .* exit code 7"):
        ch.get(key="k", timeout=15)
    assert time.monotonic() - start < 5
    doomed.shutdown()
    cluster.groups.remove(doomed)
