"""Channel: named, keyed, bounded producer-consumer queues between the driver and any worker.

    env_channel = Channel.create("Env", cluster, maxsize=4)     # in the driver; the handle pickles into group calls
    env_channel.put(obs, key=("stage", 0))                       # in a worker: blocks while that key is full
    obs = env_channel.get(key=("stage", 0), timeout=30)          # blocks until an item arrives, or ChannelTimeout

How it works. The queues live in a `ChannelServer`: threads inside the driver process that serve requests arriving
over one local socket (RLinf keeps them in a `ChannelWorker` Ray actor; the role is the same). A request is a small
pickled message, so a dict of scalars costs one socket round trip and no shared-memory setup. Tensors of at least
`SHM_MIN_BYTES` leave the message: the sender copies each into a shared-memory segment from its own pool and sends only
(name, offset, dtype, shape); the receiver copies it out and marks the segment free, and the sender reuses it. A
segment is set up once and then reused, so large payloads move at memory-copy speed with no per-message allocation.

RLinf counterpart: `rlinf/scheduler/channel/channel.py::Channel` (put/get/qsize, keys, maxsize). Left out: weighted
`get_batch`, async handles, multi-node replicas. A Ray backend would keep this API and host the server in an actor.
"""

from __future__ import annotations

import atexit
import collections
import io
import math
import os
import pickle
import secrets
import threading
import time
import weakref
from collections.abc import Hashable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy
import torch

from rlinf_mini.shm import SharedSegment
from rlinf_mini.tracer import span

DEFAULT_KEY = "default_queue"
_UNBOUNDED = 1 << 30  # the credit of a put on an unbounded channel
_GET_BATCH = 64  # the most items one get request takes home
SHM_MIN_BYTES = 64 * 1024  # below this, pickling the bytes inline is cheaper than a shared-memory hop
DRIVER_SLICE_S = 0.5  # a put/get in the driver checks every worker's liveness this often
_HEADER = 64  # byte 0 of every pool segment is its busy flag; tensor data starts at a 64-byte boundary


class ChannelTimeout(TimeoutError):
    """A put or get waited longer than its timeout."""


class ChannelClosed(ConnectionError):
    """The channel server went away (the driver stopped)."""


# ---------------------------------------------------------------------------------------------------------------------
# Tensor payloads: pickled inline when small, through a reused shared-memory segment when large


class _SegmentPool:
    """Per-process pool of send segments. A segment is free again once its receiver zeroed the busy flag."""

    def __init__(self):
        self.segments: list[SharedSegment] = []
        self.lock = threading.Lock()

    def acquire(self, nbytes: int) -> SharedSegment:
        with self.lock:
            for seg in self.segments:
                # the flag is read and written through the mmap: ~0.1 us, where a torch index costs ~5 us
                if seg.size - _HEADER >= nbytes and seg.size <= 4 * (nbytes + _HEADER) and seg._mmap[0] == 0:
                    seg._mmap[0] = 1
                    return seg
            size = _HEADER + max(1 << 16, 1 << (nbytes - 1).bit_length())  # power of two: fewer distinct sizes
            seg = SharedSegment.create(size, tag="chan")
            seg._mmap[0] = 1
            self.segments.append(seg)
            return seg

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments.clear()


_send_pool = _SegmentPool()
atexit.register(lambda: close_process_resources())
_attached: dict[str, SharedSegment] = {}  # receive side: segments opened once per process, by name


class _Pickler(pickle.Pickler):
    """Tensors are written as raw bytes: inline when small, into a pooled shared segment when large.

    (torch's own pickling of a small tensor costs ~150 us; its bytes cost ~5 us.)
    """

    def persistent_id(self, obj: Any):
        if not isinstance(obj, torch.Tensor):
            return None
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # CUDA tensors go through host memory here; CUDA IPC is a later step
        nbytes = t.numel() * t.element_size()
        if nbytes < SHM_MIN_BYTES:
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            return ("bytes", raw, t.dtype, tuple(t.shape))
        seg = _send_pool.acquire(nbytes)
        _shm_tensor(seg, t.dtype, tuple(t.shape)).copy_(t)
        return ("shm", seg.name, seg.size, t.dtype, tuple(t.shape))


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid[0] == "bytes":
            _, raw, dtype, shape = pid
            if not raw:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
        _, name, size, dtype, shape = pid
        seg = _attached.get(name)
        if seg is None:
            seg = _attached[name] = SharedSegment.attach(name, size)
        # Zero copy: the tensor we return *is* the sender's segment. The segment goes back to its sender (flag 0)
        # when the last tensor or view using it is freed: torch.from_numpy keeps the numpy array alive exactly that
        # long, and the array's finalizer clears the flag. A copy here would cost as much as the sender's copy.
        return _shm_tensor(seg, dtype, shape, on_free=_release)


_NUMPY_DTYPES = {torch.uint8: numpy.uint8, torch.int8: numpy.int8, torch.int16: numpy.int16, torch.int32: numpy.int32,
                 torch.int64: numpy.int64, torch.float16: numpy.float16, torch.float32: numpy.float32,
                 torch.float64: numpy.float64, torch.bool: numpy.bool_}


def _shm_tensor(seg: SharedSegment, dtype: torch.dtype, shape: tuple[int, ...], on_free=None) -> torch.Tensor:
    """A tensor over the segment's bytes from _HEADER. Made through numpy (~5 us, where torch.frombuffer and
    .view take ~20 us); `on_free(seg)` runs when the last tensor or view using these bytes is freed (torch.from_numpy
    keeps the numpy array alive exactly that long)."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is not None:
        arr = numpy.frombuffer(seg._mmap, dtype=np_dtype, count=math.prod(shape), offset=_HEADER).reshape(shape)
        out = torch.from_numpy(arr)
    else:  # bfloat16 and friends have no numpy dtype: bytes, then a torch view
        arr = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, count=math.prod(shape) * dtype.itemsize, offset=_HEADER)
        out = torch.from_numpy(arr).view(dtype).view(shape)
    if on_free is not None:
        weakref.finalize(arr, on_free, seg)  # `arr` is the object the tensor's storage holds on to
    return out


def _release(seg: SharedSegment) -> None:
    try:
        seg._mmap[0] = 0  # hand the segment back to its sender
    except ValueError:  # the mapping was closed at shutdown: nothing to hand back
        pass


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


# ---------------------------------------------------------------------------------------------------------------------
# The server (runs in the driver)


class _Queues:
    def __init__(self, maxsize: int):
        self.maxsize = maxsize  # 0 = unbounded
        self.items: dict[Hashable, collections.deque] = collections.defaultdict(collections.deque)
        self.cond = threading.Condition()


class ChannelServer:
    """Holds every channel's queues; one thread per connected process serves that process's requests in order."""

    def __init__(self):
        self.address = f"\0rlinf_mini_{os.getpid()}_{secrets.token_hex(4)}"  # Linux abstract socket: no file left
        self.authkey = secrets.token_bytes(16)
        self.channels: dict[str, _Queues] = {}
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        self._conns: list[Connection] = []
        threading.Thread(target=self._accept_loop, name="channel-accept", daemon=True).start()

    def create(self, name: str, maxsize: int) -> None:
        if name in self.channels:
            raise ValueError(f"channel {name!r} already exists")
        self.channels[name] = _Queues(maxsize)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # listener closed, or a client that failed authentication
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="channel-serve", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            while True:
                op, name, key, payload, timeout = conn.recv()
                conn.send(self._handle(op, self.channels[name], key, payload, timeout))
        except (EOFError, OSError):
            pass  # the process went away; its connection is done

    @staticmethod
    def _handle(op: str, q: _Queues, key: Hashable, payload: bytes | None, timeout: float) -> tuple:
        items = q.items[key]
        with q.cond:
            if op == "put_nowait":  # the client knows there is room (its credit); see Channel.put
                items.append(payload)
                q.cond.notify_all()
                return ("ok", q.maxsize - len(items) if q.maxsize > 0 else _UNBOUNDED)
            if op == "put":
                if not q.cond.wait_for(lambda: q.maxsize <= 0 or len(items) < q.maxsize, timeout):
                    return ("timeout", None)
                items.append(payload)
                q.cond.notify_all()
                return ("ok", q.maxsize - len(items) if q.maxsize > 0 else _UNBOUNDED)  # the client's new credit
            if op == "get":  # everything queued, up to `payload` items: one round trip serves a burst
                if not q.cond.wait_for(lambda: len(items) > 0, timeout):
                    return ("timeout", None)
                batch = [items.popleft() for _ in range(min(payload, len(items)))]
                q.cond.notify_all()
                return ("ok", batch)
            if op == "qsize":
                return ("ok", len(items))
        raise ValueError(f"unknown channel op {op!r}")

    def close(self) -> None:
        self._closed = True
        try:
            # Wake the accept thread with a throwaway connection so that it sees `_closed` and returns.
            Client(self.address, family="AF_UNIX", authkey=self.authkey).close()
            self._listener.close()
        except OSError:
            pass
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------------------------
# The handle (used anywhere: picklable, connects lazily, one connection per process and thread)

_local = threading.local()


class Channel:
    """A handle on one named channel; safe to pass to group calls and to use from several threads.

    Round trips are what a channel costs (~100 us each on a busy 2-core machine, against ~30 us to copy 786 KB), so
    the common case makes none per message:
    - put: the server's answer to a put says how much room the key has left (the credit); while this thread has
      credit, its next puts go out without waiting for their answers, which it reads later, when they have arrived,
      to renew the credit. Only a put without credit waits (and blocks while the queue is full). With one producer
      per key (as in the rollout pipeline) the queue never exceeds maxsize; with several, each may fill its credit.
    - get: one request takes every item queued for the key (up to 64); the extra ones wait in this thread's local
      buffer, where the next gets find them (so a key may hold up to 2 x maxsize items in all). `qsize` counts both.
    """

    def __init__(self, name: str, address: str, authkey: bytes, default_timeout: float):
        self.name, self._address, self._authkey, self.default_timeout = name, address, authkey, default_timeout
        self._check_workers = None  # in the driver: Cluster.check_workers, so a blocked put/get notices a death

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_check_workers": None}  # workers do not watch each other: the driver does

    @classmethod
    def create(cls, name: str, cluster, maxsize: int = 0) -> Channel:
        """Create channel `name` on `cluster`'s channel server; maxsize bounds each key's queue (0 = unbounded)."""
        cluster.channel_server.create(name, maxsize)
        channel = cls(name, cluster.channel_server.address, cluster.channel_server.authkey, cluster.timeout_s)
        channel._check_workers = cluster.check_workers
        return channel

    def _blocking_request(self, op: str, key: Hashable, payload: bytes | None, timeout: float) -> tuple:
        """A put or get; in the driver it waits in slices of DRIVER_SLICE_S and raises if a worker died meanwhile."""
        if self._check_workers is None:
            return self._request(op, key, payload, timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._check_workers()
            left = deadline - time.monotonic()
            status, data = self._request(op, key, payload, max(0.0, min(DRIVER_SLICE_S, left)))
            if status != "timeout" or left <= DRIVER_SLICE_S:
                return status, data

    def _connection(self) -> Connection:
        conns = self._state("conns")
        conn = conns.get(self._address)
        if conn is None:
            try:
                conn = conns[self._address] = Client(self._address, family="AF_UNIX", authkey=self._authkey)
            except OSError as e:
                raise ChannelClosed(f"channel {self.name!r}: the channel server is gone ({e})") from None
        return conn

    def _send(self, request: tuple) -> None:
        try:
            self._connection().send(request)
        except OSError as e:
            self._state("conns").pop(self._address, None)
            raise ChannelClosed(f"channel {self.name!r}: the channel server is gone ({e})") from None

    def _read_answers(self, block: bool) -> None:
        """Read the answers to puts sent without waiting (they arrive in order) and renew those keys' credit."""
        unanswered = self._state("unanswered").get(self._address)
        if not unanswered:
            return
        conn = self._connection()
        credits = self._state("credits")
        try:
            while unanswered and conn.poll(self.default_timeout + 10.0 if block else 0):
                _, credit = conn.recv()
                ident = unanswered.popleft()
                credits[ident] = credit - sum(1 for i in unanswered if i == ident)  # minus puts still in flight
        except (EOFError, OSError) as e:
            self._state("conns").pop(self._address, None)
            raise ChannelClosed(f"channel {self.name!r}: the channel server is gone ({e})") from None
        if unanswered and block:
            raise ChannelClosed(f"channel {self.name!r}: the channel server did not answer")

    def _request(self, op: str, key: Hashable, payload: Any, timeout: float) -> tuple:
        conns = self._state("conns")
        self._read_answers(block=True)  # answers come in order: earlier puts' answers first
        try:
            conn = self._connection()
            conn.send((op, self.name, key, payload, timeout))
            # The server answers within `timeout`; the margin only guards against a server that vanished.
            if not conn.poll(timeout + 10.0):
                raise ChannelClosed(f"channel {self.name!r}: the channel server did not answer")
            return conn.recv()
        except (EOFError, OSError) as e:
            conns.pop(self._address, None)
            raise ChannelClosed(f"channel {self.name!r}: the channel server is gone ({e})") from None

    def _state(self, attr: str) -> dict:
        d = getattr(_local, attr, None)
        if d is None:
            d = {}
            setattr(_local, attr, d)
        return d

    def put(self, item: Any, key: Hashable = DEFAULT_KEY, timeout: float | None = None) -> None:
        """Append `item` to queue `key`; blocks while the queue is full, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        payload = dumps(item)
        credits = self._state("credits")
        ident = (self._address, self.name, key)
        self._read_answers(block=False)
        if credits.get(ident, 0) > 0:
            credits[ident] -= 1
            self._send(("put_nowait", self.name, key, payload, timeout))
            self._state("unanswered").setdefault(self._address, collections.deque()).append(ident)
            return
        with span("wait_put"):
            status, credit = self._blocking_request("put", key, payload, timeout)
        if status == "timeout":
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: still full after {timeout:g} s "
                                 f"(is its consumer alive and reading?)")
        credits[ident] = credit

    def get(self, key: Hashable = DEFAULT_KEY, timeout: float | None = None, expected_from: str = "") -> Any:
        """Pop the oldest item of queue `key`; blocks until one arrives, at most `timeout` seconds."""
        buffered = self._state("buffered").setdefault((self._address, self.name, key), collections.deque())
        if buffered:
            return loads(buffered.popleft())
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        with span("wait_get"):
            status, batch = self._blocking_request("get", key, _GET_BATCH, timeout)
        if status == "timeout":
            who = f", expected from {expected_from}" if expected_from else ""
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: nothing arrived within "
                                 f"{time.monotonic() - start:.0f} s{who}")
        buffered.extend(batch[1:])
        return loads(batch[0])

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """Items queued for `key`: at the server plus in this thread's local buffer."""
        local = len(self._state("buffered").get((self._address, self.name, key), ()))
        return self._request("qsize", key, None, 1.0)[1] + local

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


def close_process_resources() -> None:
    """Release this process's channel connections and shared-memory segments (called when a worker stops)."""
    for conn in getattr(_local, "conns", {}).values():
        conn.close()
    for attr in ("conns", "credits", "buffered", "unanswered"):
        getattr(_local, attr, {}).clear()
    _send_pool.close()
    for seg in _attached.values():
        seg.close()
    _attached.clear()
