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
import os
import pickle
import secrets
import threading
import time
from collections.abc import Hashable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch

from rlinf_mini.shm import SharedSegment

DEFAULT_KEY = "default_queue"
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
                if seg.size - _HEADER >= nbytes and seg.size <= 4 * (nbytes + _HEADER) and seg.data[0] == 0:
                    seg.data[0] = 1
                    return seg
            size = _HEADER + max(1 << 16, 1 << (nbytes - 1).bit_length())  # power of two: fewer distinct sizes
            seg = SharedSegment.create(size, tag="chan")
            seg.data[0] = 1
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
        seg.view(t.dtype, tuple(t.shape), _HEADER).copy_(t)
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
        out = seg.view(dtype, shape, _HEADER).clone()
        seg.data[0] = 0  # hand the segment back to its sender
        return out


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
        with q.cond:
            if op == "put":
                if not q.cond.wait_for(lambda: q.maxsize <= 0 or len(q.items[key]) < q.maxsize, timeout):
                    return ("timeout", None)
                q.items[key].append(payload)
                q.cond.notify_all()
                return ("ok", None)
            if op == "get":
                if not q.cond.wait_for(lambda: len(q.items[key]) > 0, timeout):
                    return ("timeout", None)
                item = q.items[key].popleft()
                q.cond.notify_all()
                return ("ok", item)
            if op == "qsize":
                return ("ok", len(q.items[key]))
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
    """A handle on one named channel; safe to pass to group calls and to use from several threads."""

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

    def _request(self, op: str, key: Hashable, payload: bytes | None, timeout: float) -> tuple:
        conns = getattr(_local, "conns", None)
        if conns is None:
            conns = _local.conns = {}
        conn = conns.get(self._address)
        try:
            if conn is None:
                conn = conns[self._address] = Client(self._address, family="AF_UNIX", authkey=self._authkey)
            conn.send((op, self.name, key, payload, timeout))
            # The server answers within `timeout`; the margin only guards against a server that vanished.
            if not conn.poll(timeout + 10.0):
                raise ChannelClosed(f"channel {self.name!r}: the channel server did not answer")
            return conn.recv()
        except (EOFError, OSError) as e:
            conns.pop(self._address, None)
            raise ChannelClosed(f"channel {self.name!r}: the channel server is gone ({e})") from None

    def put(self, item: Any, key: Hashable = DEFAULT_KEY, timeout: float | None = None) -> None:
        """Append `item` to queue `key`; blocks while the queue is full, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        status, _ = self._blocking_request("put", key, dumps(item), timeout)
        if status == "timeout":
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: still full after {timeout:g} s "
                                 f"(is its consumer alive and reading?)")

    def get(self, key: Hashable = DEFAULT_KEY, timeout: float | None = None, expected_from: str = "") -> Any:
        """Pop the oldest item of queue `key`; blocks until one arrives, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        status, data = self._blocking_request("get", key, None, timeout)
        if status == "timeout":
            who = f", expected from {expected_from}" if expected_from else ""
            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: nothing arrived within "
                                 f"{time.monotonic() - start:.0f} s{who}")
        return loads(data)

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        return self._request("qsize", key, None, 1.0)[1]

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


def close_process_resources() -> None:
    """Release this process's channel connections and shared-memory segments (called when a worker stops)."""
    for conn in getattr(_local, "conns", {}).values():
        conn.close()
    _send_pool.close()
    for seg in _attached.values():
        seg.close()
    _attached.clear()
