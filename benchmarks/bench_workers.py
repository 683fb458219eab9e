"""Process bodies and workers of the benchmarks (a module, so that spawned processes can import them by name). The
pipeline rows run the real runner (benchmarks/pipeline.py); nothing here copies its protocol.

The functions in the first sections run in one of two long-lived host processes (`host_main`), each pinned to one
core with one torch thread, so that a figure measures the transport, not how many threads a copy could use, and so
that the benchmarks pay the start-up of a process (importing torch: seconds on a busy machine) twice, not per row.
"""

from __future__ import annotations

import os
import time

import torch

from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.worker import Worker

# ---------------------------------------------------------------------------------------------------------------------
# The host processes


def host_main(index: int, core: int | None, shared: dict, conn, env: dict[str, str]) -> None:
    """Run the commands (function name, args) that arrive on `conn`; an argument "@name" is shared[name] (queues
    can only be handed to a process when it starts). Answers ("ok", result) or ("error", traceback). `env`: the
    driver's environment at the start (a child of the fork server has the server's), with the run id its segments
    carry."""
    import traceback

    os.environ.clear()
    os.environ.update(env)
    if core is not None:
        os.sched_setaffinity(0, [core])
    torch.set_num_threads(1)
    while True:
        cmd = conn.recv()
        if cmd is None:
            from rlinf_mini.scheduler import codec
            from rlinf_mini.scheduler.local import close_transport_resources

            close_transport_resources()
            codec.close_process_resources()
            return
        name, args = cmd
        args = [shared[a[1:]] if isinstance(a, str) and a.startswith("@") else a for a in args]
        try:
            conn.send(("ok", globals()[name](*args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------------------------------------------------
# Channel and queue producers / consumers


def channel_producer(ch: Channel, n: int, make: str, key: str = "k") -> None:
    item = _make_item(make)
    for i in range(n):
        if isinstance(item, dict):
            item["step"] = i
        ch.put(item, key=key)


def channel_producer_built(ch: Channel, n: int, in_place: bool, key: str = "k") -> float:
    """n 786 KB batches, each built from a source frame with one numpy copy (as a renderer writes its frame), then
    put. in_place: built in a channel.empty() buffer, which the put sends by its segment's name (zero copy); else
    built in the producer's own tensor, which the put copies into a shared segment (the copying put). Returns the
    producer's CPU seconds per message (time.thread_time: what it costs when it has a core, preemption left out)."""
    import numpy as np

    source = _make_item("large").numpy()
    own = torch.empty(source.shape, dtype=torch.uint8)
    start = time.thread_time()
    for _ in range(n):
        batch = ch.empty(source.shape, torch.uint8) if in_place else own
        np.copyto(batch.numpy(), source)
        ch.put(batch, key=key)
    return (time.thread_time() - start) / n


def channel_producer_zero_copy(ch: Channel, n: int, key: str = "k") -> float:
    """n 786 KB batches, each taken with ch.empty(), stamped with its number in its first 8 bytes (the producer's
    own work, e.g. an env drawing its frame, happens in place and is not the transport's), then put: only the
    segment's name travels. Returns the producer's CPU seconds per message (time.thread_time)."""
    import numpy as np

    start = time.thread_time()
    for i in range(n):
        batch = ch.empty((64, 3, 64, 64), torch.uint8)
        batch.numpy().reshape(-1)[:8].view(np.int64)[0] = i
        ch.put(batch, key=key)
    return (time.thread_time() - start) / n


def channel_consumer(ch: Channel, n: int, key: str = "k", stamped: bool = False) -> float:
    """The seconds taken by messages 2..n (the first one pays the producer's start-up). stamped: check that batch i
    carries i in its first 8 bytes (channel_producer_zero_copy), i.e. every message arrived, in order, and its
    bytes are the producer's."""
    import numpy as np

    def get(i: int) -> None:
        item = ch.get(key=key)
        if stamped and item.numpy().reshape(-1)[:8].view(np.int64)[0] != i:
            raise AssertionError(f"message {i} arrived with the stamp of another message")

    get(0)
    start = time.perf_counter()
    for i in range(1, n):
        get(i)
    return time.perf_counter() - start


def queue_producer(q, n: int, make: str, fresh: bool, done) -> None:
    """fresh: put a new tensor each time (as new data would be); torch shares each one through its own shm.
    The producer stays until the consumer is done: torch hands tensors over by file descriptors it serves."""
    item = _make_item(make)
    for i in range(n):
        if isinstance(item, dict):
            item["step"] = i
            q.put(item)
        else:
            q.put(item.clone() if fresh else item)
    done.wait(120)


def queue_consumer(q, n: int, done) -> float:
    q.get()
    start = time.perf_counter()
    for _ in range(n - 1):
        q.get()
    seconds = time.perf_counter() - start
    done.set()
    return seconds


def _make_item(make: str):
    if make == "large":
        return torch.randint(0, 255, (64, 3, 64, 64), dtype=torch.uint8)  # 786 KB: one batch of 64x64 RGB frames
    return {"reward": 1.0, "done": False, "step": 0, "value": 0.5}  # a small message: a dict of a few scalars


def channel_echo(ch: Channel, n: int) -> None:
    for _ in range(n):
        ch.put(ch.get(key="ping"), key="pong")


def channel_pinger(ch: Channel, n: int) -> float:
    msg = _make_item("small")
    ch.put(msg, key="ping")
    ch.get(key="pong")
    start = time.perf_counter()
    for _ in range(n - 1):
        ch.put(msg, key="ping")
        ch.get(key="pong")
    return (time.perf_counter() - start) / (n - 1)


def queue_echo(q_in, q_out, n: int) -> None:
    for _ in range(n):
        q_out.put(q_in.get())


def queue_pinger(q_in, q_out, n: int) -> float:
    msg = _make_item("small")
    q_out.put(msg)
    q_in.get()
    start = time.perf_counter()
    for _ in range(n - 1):
        q_out.put(msg)
        q_in.get()
    return (time.perf_counter() - start) / (n - 1)


# ---------------------------------------------------------------------------------------------------------------------
# Weight sync


class FlatModel(torch.nn.Module):
    """`numel` float32 parameters in 8 tensors (a stand-in for a policy's state dict)."""

    def __init__(self, numel: int, device: str = "cpu"):
        super().__init__()
        per = numel // 8
        self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(per, device=device)) for _ in range(8)])


def weight_receiver(numel: int, reps: int, handle_q, ack_q, device: str = "cpu") -> None:
    from stages.sync import make_weight_receiver

    receiver = make_weight_receiver(FlatModel(numel, device))  # on cuda: the device paths of stages/sync.py
    handle_q.put(receiver.handle())
    try:
        for v in range(reps):
            receiver.wait_for_version(v, timeout=120.0)
            if device != "cpu":
                torch.cuda.synchronize()
            ack_q.put(v)
    finally:
        receiver.close()


def gloo_broadcast(rank: int, port: int, numel: int, reps: int) -> float:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.ones(numel) if rank == 0 else torch.empty(numel)
    dist.broadcast(t, src=0)  # warm-up: connection set-up and first-touch page faults
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(t, src=0)
        dist.barrier()  # the receiver has everything when both pass the barrier
        times.append(time.perf_counter() - start)
    dist.destroy_process_group()
    return min(times)


# ---------------------------------------------------------------------------------------------------------------------
# Workers (group calls) and the GPU channel rows (benchmarks/gpu.py)


class NoopWorker(Worker):
    def noop(self) -> None:
        return None


def channel_producer_cuda(ch: Channel, n: int) -> None:
    x = _make_item("large").cuda()
    for _ in range(n):
        ch.put(x, key="k")  # the channel stages a CUDA tensor through host shared memory


def channel_consumer_cuda(ch: Channel, n: int) -> float:
    ch.get(key="k").cuda()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n - 1):
        ch.get(key="k").cuda()
    torch.cuda.synchronize()
    return time.perf_counter() - start
