"""Channel: named, keyed, bounded producer-consumer queues between the driver and any worker, on any backend.

    env_channel = Channel.create("Env", cluster, maxsize=4)     # in the driver; the handle pickles into group calls
    env_channel.put(obs, key=("stage", 0))                       # in a worker: blocks while that key is full
    obs = env_channel.get(key=("stage", 0), timeout=30)          # blocks until an item arrives, or ChannelTimeout
    buf = env_channel.empty((B, 3, H, W), torch.uint8)            # fill it, then put it: no copy (see `empty`)

Each key is its own FIFO queue, shared by every producer and consumer of the channel; `maxsize` bounds each key
(0 = unbounded, within what the backend can hold). The queues are the backend's (backend.py, its `channel_transport`):
kernel queues with tensors through shared memory (local), in-process queues (inline), an actor holding the queues with
tensors in the object store (ray). A transport has `put(key, item, deadline, check, slice_s) -> bool`,
`get(key, deadline, check, slice_s) -> (bool, item)` (False: the deadline passed), `qsize(key)` and
`full_reason(key)`, and may have `empty(shape, dtype)`: a buffer it puts without a copy (local: in a shared segment;
the others get ordinary memory under the same rules). In the driver, a blocked put or get calls `check` (the
cluster's liveness check) every DRIVER_SLICE_S, so a worker's death ends the wait; workers do not watch each other,
the driver does.

RLinf counterpart: `rlinf/scheduler/channel/channel.py::Channel` (put/get/qsize, keys, maxsize). Left out: weighted
`get_batch`, async handles. Added: `empty`, a zero-copy put for large batches (RLinf puts copy).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

import torch

from rlinf_mini.scheduler import codec
from rlinf_mini.scheduler.codec import LentBufferError

__all__ = ["Channel", "ChannelClosed", "ChannelTimeout", "LentBufferError", "DEFAULT_KEY"]

DEFAULT_KEY = "default_queue"
DRIVER_SLICE_S = 0.5  # a put/get in the driver checks every worker's liveness this often


class ChannelTimeout(TimeoutError):
    """A put or get waited longer than its timeout."""


class ChannelClosed(ConnectionError):
    """The channel's queues went away (the driver stopped)."""


class Channel:
    """A handle on one named channel; safe to pass to group calls and to use from several threads."""

    def __init__(self, name: str, transport, default_timeout: float):
        self.name, self.transport, self.default_timeout = name, transport, default_timeout
        self._check_workers = None  # in the driver: Cluster.check_workers, so a blocked put/get notices a death

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_check_workers": None}  # workers do not watch each other: the driver does

    @classmethod
    def create(cls, name: str, cluster, maxsize: int = 0) -> Channel:
        """Create channel `name` on `cluster`'s backend; maxsize bounds each key's queue (0 = unbounded)."""
        channel = cls(name, cluster.backend.channel_transport(name, maxsize, cluster.timeout_s), cluster.timeout_s)
        channel._check_workers = cluster.check_workers
        return channel

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor to build a batch in and then put without a copy (a zero-copy put):

            buf = channel.empty((64, 3, 64, 64), torch.uint8)   # local: in this process's pool of shared segments
            render_into(buf); channel.put({"obs": buf}, key=k)   # only the segment's name travels; the consumer
                                                                 # maps the very bytes the producer wrote
        Ownership. Until its put the buffer is the producer's; from its put on it is the consumer's to read, and
        the producer may still read it (the env keeps its observation) but must not write into it: there is no copy
        between the two, so a write can change what the consumer reads. A write made through torch (which moves the
        tensor's version counter) is reported by this process's next put or empty() as LentBufferError, naming where
        the buffer went; a write through numpy or another alias is not seen. A buffer is put once (a second put is
        refused with LentBufferError: take a new buffer per message, or put a clone), by the thread that took it
        (another thread's put copies it, as any tensor). Its memory goes back to the pool when both sides have
        dropped every view of it. A consumer must not write into what it got either: the producer may be reading it.
        Under SHM_MIN_BYTES (64 KiB), and on the inline and Ray backends, the buffer is ordinary memory under the
        same rules: small tensors travel inline anyway, inline hands the tensor itself to the consumer (no clone:
        the rules make the clone it gives other tensors unneeded), and Ray's object store copies it on put.
        """
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"channel {self.name!r} empty(): dtype must be a torch.dtype, got {dtype!r}")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        lend = getattr(self.transport, "empty", None)  # local has its own; inline and Ray: ordinary memory
        return lend(shape, dtype) if lend is not None else codec.lend(shape, dtype, shared=False)

    def put(self, item: Any, key: Hashable = DEFAULT_KEY, timeout: float | None = None) -> None:
        """Append `item` to queue `key`; blocks while the queue is full, at most `timeout` seconds. A tensor from
        `empty` goes without a copy, under the rules given there."""
        timeout = self.default_timeout if timeout is None else timeout
        if codec.any_lent():  # this process holds buffers from empty(): the put-once and no-write-after rules
            codec.claim(item, self.name, key)
        try:
            ok = self.transport.put(key, item, time.monotonic() + timeout, self._check_workers, DRIVER_SLICE_S)
        except ConnectionError as e:
            raise ChannelClosed(str(e)) from None
        if not ok:
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: still full after {timeout:g} s "
                                 f"({self.transport.full_reason(key)})")

    def get(self, key: Hashable = DEFAULT_KEY, timeout: float | None = None, expected_from: str = "") -> Any:
        """Pop the oldest item of queue `key`; blocks until one arrives, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        try:
            ok, item = self.transport.get(key, start + timeout, self._check_workers, DRIVER_SLICE_S)
        except ConnectionError as e:
            raise ChannelClosed(str(e)) from None
        if not ok:
            who = f", expected from {expected_from}" if expected_from else ""
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: nothing arrived within {timeout:g} s{who}")
        return item

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """Items queued for `key` (exact when no put or get is under way)."""
        return self.transport.qsize(key)

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"
