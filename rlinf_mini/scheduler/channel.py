"""Channel: named, keyed, bounded producer-consumer queues between the driver and any worker.

    env_channel = Channel.create("Env", cluster, maxsize=4)     # in the driver; the handle pickles into group calls
    env_channel.put(obs, key=("stage", 0))                       # in a worker: blocks while that key is full
    obs = env_channel.get(key=("stage", 0), timeout=30)          # blocks until an item arrives, or ChannelTimeout

How it works. Every (channel, key) is a queue kept by the kernel, shared by all its producers and consumers, so a
message goes from producer to consumer directly, with no process in between:
- data: a socketpair(AF_UNIX, SOCK_SEQPACKET). One send is one message and one recv takes exactly one, atomically,
  so several producers and consumers need no lock; a blocked get sleeps in poll() with its timeout.
- bound and count: a stream socketpair holding one byte per token; FIONREAD counts them exactly. On a bounded key a
  token is a free slot (the server writes `maxsize` of them; a put takes one, blocking while there is none, and a
  get gives one back); on an unbounded key a token is a queued message. `qsize` reads the count from the kernel.
  An unbounded key holds what the kernel buffers allow (raised to net.core.wmem_max: ~550 messages at Linux's
  default 212992 bytes); a put beyond that waits like a put on a full bounded key. maxsize is at most MAX_BOUND.
The `ChannelServer` (threads in the driver on one abstract unix socket; RLinf keeps its queues in a `ChannelWorker`
Ray actor) knows each channel's maxsize, creates a key's sockets on first use and hands their descriptors to each
process once (SCM_RIGHTS). It stays out of the data path; clients also watch their connection to it, so a wait ends
with ChannelClosed when the driver goes away.

Why. The first version kept the queues in the server: every message made two socket hops through a driver thread
(~100 us each idle, milliseconds when the cores are oversubscribed), and small messages ran at 0.1x a pickled
multiprocessing.Queue. Now a put or get is 2-3 system calls (~10 us of CPU).

Payloads. A message is one pickle. Tensors of at least `SHM_MIN_BYTES` leave it: the sender copies each into a
shared-memory segment from its own pool and sends only (name, offset, dtype, shape); the receiver maps it without a
copy and the segment is free again when the receiver drops the tensor. A segment is set up once and reused, so large
payloads cost one memory copy and no per-message allocation. A pickle over `_MSG_MAX` (many small tensors) travels
the same way as a blob, so socket messages stay small.

RLinf counterpart: `rlinf/scheduler/channel/channel.py::Channel` (put/get/qsize, keys, maxsize). Left out: weighted
`get_batch`, async handles, multi-node replicas. A Ray backend would keep this API and host the server in an actor.
"""

from __future__ import annotations

import atexit
import copyreg
import fcntl
import io
import math
import os
import pickle
import secrets
import select
import socket
import struct
import termios
import threading
import time
import weakref
from collections.abc import Hashable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy
import torch

from rlinf_mini.scheduler.shm import SharedSegment
from rlinf_mini.scheduler.tracer import span

DEFAULT_KEY = "default_queue"
# Each returned token is one skb (~770 bytes) in the kernel: at Linux's default wmem_max a key's token socket holds
# ~550 of them, so a larger bound could leave a get unable to give its token back.
MAX_BOUND = 512
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
            seg.send_view = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, offset=_HEADER)  # [size - _HEADER] bytes
            seg._mmap[0] = 1
            self.segments.append(seg)
            return seg

    def close(self) -> None:
        for seg in self.segments:
            seg.send_view = None  # the view exports the mapping's buffer: drop it so that the mapping can close
            seg.close()
        self.segments.clear()


_send_pool = _SegmentPool()
atexit.register(lambda: close_process_resources())
_attached: dict[str, SharedSegment] = {}  # receive side: segments opened once per process, by name


def _reduce_tensor(obj: torch.Tensor) -> tuple:
    """How the channel pickles a tensor: raw bytes inline when small, through a pooled shared segment when large.

    (torch's own pickling of a small tensor costs ~150 us; its bytes through numpy cost ~3 us, a fifth of the env's
    and the rollout's per-message overhead with the MLP.) A reducer in the pickler's dispatch_table, not a
    persistent_id hook: that hook is a Python call for every object of every message.
    """
    t = obj.detach() if obj.requires_grad else obj
    nbytes = t.numel() * t.element_size()
    if not t.is_cpu:
        if nbytes >= SHM_MIN_BYTES:  # one copy: device straight into the shared segment, no host temporary
            seg = _send_pool.acquire(nbytes)
            _shm_tensor(seg, t.dtype, tuple(t.shape)).copy_(t)  # synchronous D2H (pageable destination)
            return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))
        t = t.cpu()  # small: one device-to-host copy, then its bytes inline
    if t.dtype in _NUMPY_DTYPES:  # numpy does the byte work: ~3 us small, ~13 us less than torch for 786 KB
        arr = t.numpy()  # a view; .tobytes() writes C order
        if nbytes < SHM_MIN_BYTES:
            return _rebuild_array, (arr.tobytes(), t.dtype, arr.shape)
        if arr.flags.c_contiguous:
            seg = _send_pool.acquire(nbytes)
            numpy.copyto(seg.send_view[:nbytes], arr.reshape(-1).view(numpy.uint8))
            return _rebuild_shm, (seg.name, seg.size, t.dtype, arr.shape)
    elif nbytes < SHM_MIN_BYTES:  # bfloat16 and friends: no numpy dtype, so raw bytes and a torch view
        return _rebuild_bytes, (t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), t.dtype,
                                tuple(t.shape))
    seg = _send_pool.acquire(nbytes)  # large and strided, or without a numpy dtype: torch copies into the segment
    _shm_tensor(seg, t.dtype, tuple(t.shape)).copy_(t)
    return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))


def _rebuild_array(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    # bytearray: a writable copy, so the tensor is an ordinary writable one (frombuffer over bytes is read-only)
    return torch.from_numpy(numpy.frombuffer(bytearray(raw), dtype=_NUMPY_DTYPES[dtype]).reshape(shape))


def _rebuild_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def _rebuild_shm(name: str, size: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    seg = _attached.get(name)
    if seg is None:
        seg = _attached[name] = SharedSegment.attach(name, size)
    # Zero copy: the tensor we return *is* the sender's segment. The segment goes back to its sender (flag 0)
    # when the last tensor or view using it is freed: torch.from_numpy keeps the numpy array alive exactly that
    # long, and the array's finalizer clears the flag. A copy here would cost as much as the sender's copy.
    return _shm_tensor(seg, dtype, shape, on_free=_release)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor, torch.nn.Parameter: _reduce_tensor}


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
    return pickle.loads(data)  # the tensors rebuild themselves: _rebuild_bytes, _rebuild_shm


# ---------------------------------------------------------------------------------------------------------------------
# Messages on a key's kernel queue: one pickle each, or a shared-memory blob when the pickle is large

_MSG_MAX = 16 * 1024  # a larger pickle (inline tensors under SHM_MIN_BYTES add up) travels as a blob: even at
# Linux's default wmem_max a key's socket then holds >= 25 messages, so a bounded put is rarely held by the buffer
_RECV_BYTES = _MSG_MAX + 1024


def _frame(payload: bytes) -> bytes:
    if len(payload) <= _MSG_MAX:
        return b"P" + payload
    seg = _send_pool.acquire(len(payload))
    seg._mmap[_HEADER:_HEADER + len(payload)] = payload
    return b"B" + pickle.dumps((seg.name, seg.size, len(payload)))


def _unframe(msg: bytes) -> Any:
    if msg[:1] == b"P":
        return loads(msg[1:])
    name, size, n = pickle.loads(msg[1:])
    seg = _attached.get(name)
    if seg is None:
        seg = _attached[name] = SharedSegment.attach(name, size)
    payload = bytes(seg._mmap[_HEADER:_HEADER + n])
    _release(seg)
    return loads(payload)


# ---------------------------------------------------------------------------------------------------------------------
# The server (runs in the driver): makes each key's kernel queue on first use and hands its ends to every client


class _KeyQueue:
    """The kernel objects of one (channel, key), created by the server, shared by every producer and consumer.

    data_w -> data_r: SOCK_SEQPACKET pair; one send is one message and one recv takes exactly one, atomically, so
        any number of producers and consumers share it without a lock. Messages stay small (<= _MSG_MAX).
    tok_w -> tok_r: SOCK_STREAM pair holding one byte per token; FIONREAD on tok_r counts them exactly.
        Bounded key: a token is a free slot. The server writes `maxsize`; a put takes one (blocking while there is
        none), a get gives one back after taking its message. Unbounded key: a token is a queued message; a put
        adds one before its message, a get takes one after. Either way qsize is a count the kernel keeps.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.data_w, self.data_r = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.tok_w, self.tok_r = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (self.data_w, self.tok_w):
            try:  # unix sockets count the sender's buffer in skbs of ~770 bytes: ~270 messages by default
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _wmem_max())
            except OSError:
                pass
        if maxsize > 0:
            self.tok_w.sendall(b"\1" * maxsize)

    def fds(self) -> list[int]:
        return [self.data_w.fileno(), self.data_r.fileno(), self.tok_w.fileno(), self.tok_r.fileno()]

    def close(self) -> None:
        for s in (self.data_w, self.data_r, self.tok_w, self.tok_r):
            s.close()


def _wmem_max() -> int:
    try:
        return int(open("/proc/sys/net/core/wmem_max").read())
    except (OSError, ValueError):
        return 1 << 20


class ChannelServer:
    """Knows every channel's maxsize and each key's kernel queue; one thread per connected process serves its
    requests (opening a key, in practice once per process and key). Messages never pass through it."""

    def __init__(self):
        self.address = f"\0rlinf_mini_{os.getpid()}_{secrets.token_hex(4)}"  # Linux abstract socket: no file left
        self.authkey = secrets.token_bytes(16)
        self.channels: dict[str, int] = {}  # name -> maxsize (0 = unbounded)
        self.keys: dict[tuple[str, Hashable], _KeyQueue] = {}
        self._lock = threading.Lock()
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        self._conns: list[Connection] = []
        threading.Thread(target=self._accept_loop, name="channel-accept", daemon=True).start()

    def create(self, name: str, maxsize: int) -> None:
        if name in self.channels:
            raise ValueError(f"channel {name!r} already exists")
        if not 0 <= maxsize <= MAX_BOUND:
            raise ValueError(f"channel {name!r}: maxsize={maxsize} must be 0 (unbounded) to {MAX_BOUND}")
        self.channels[name] = maxsize

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
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # the same stream, to pass fds on
                while True:
                    op, name, key = conn.recv()
                    if op != "open" or name not in self.channels:
                        conn.send(("error", f"unknown channel {name!r}" if op == "open" else f"unknown op {op!r}"))
                        continue
                    with self._lock:
                        q = self.keys.get((name, key))
                        if q is None:
                            q = self.keys[(name, key)] = _KeyQueue(self.channels[name])
                    conn.send(("ok", q.maxsize))
                    socket.send_fds(sock, [b"\0"], q.fds())
        except (EOFError, OSError):
            pass  # the process went away (or the server closed); its connection is done

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
                # shutdown, not just close: the serving thread's dup of the socket would keep it open, and
                # clients watch this socket for EOF to learn that the server is gone
                socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass
        with self._lock:
            for q in self.keys.values():
                q.close()
            self.keys.clear()


# ---------------------------------------------------------------------------------------------------------------------
# The handle (used anywhere: picklable; opens each key once per process, one server connection per thread)

_local = threading.local()
_opened: dict[tuple[str, str, Hashable], _KeyEnds] = {}  # (address, channel, key) -> this process's ends
_opened_lock = threading.Lock()


class _KeyEnds:
    def __init__(self, maxsize: int, socks: list[socket.socket]):
        self.maxsize = maxsize
        self.data_w, self.data_r, self.tok_w, self.tok_r = socks

    def close(self) -> None:
        for s in (self.data_w, self.data_r, self.tok_w, self.tok_r):
            s.close()


class Channel:
    """A handle on one named channel; safe to pass to group calls and to use from several threads.

    A put or get is a few system calls on the key's kernel queues (~10 us) and no round trip: see _KeyQueue.
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

    def _closed(self, why: object) -> ChannelClosed:
        _local.__dict__.setdefault("conns", {}).pop(self._address, None)
        return ChannelClosed(f"channel {self.name!r}: the channel server is gone ({why})")

    def _connection(self) -> tuple[Connection, socket.socket]:
        conns = _local.__dict__.setdefault("conns", {})
        pair = conns.get(self._address)
        if pair is None:
            try:
                conn = Client(self._address, family="AF_UNIX", authkey=self._authkey)
            except OSError as e:
                raise self._closed(e) from None
            pair = conns[self._address] = (conn, socket.socket(fileno=os.dup(conn.fileno())))
        return pair

    def _ends(self, key: Hashable) -> _KeyEnds:
        ident = (self._address, self.name, key)
        ends = _opened.get(ident)
        if ends is not None:
            return ends
        conn, sock = self._connection()
        try:
            conn.send(("open", self.name, key))
            if not conn.poll(self.default_timeout + 10.0):
                raise self._closed("no answer")
            status, answer = conn.recv()
            if status != "ok":
                raise ValueError(f"channel {self.name!r}: {answer}")
            _, fds, _, _ = socket.recv_fds(sock, 1, 4)
        except (EOFError, OSError) as e:
            raise self._closed(e) from None
        if len(fds) != 4:
            raise self._closed("no queue descriptors")
        with _opened_lock:
            if ident in _opened:  # another thread of this process opened it meanwhile
                for fd in fds:
                    os.close(fd)
            else:
                _opened[ident] = _KeyEnds(answer, [socket.socket(fileno=fd) for fd in fds])
            return _opened[ident]

    def _wait(self, sock: socket.socket, event: int, deadline: float) -> bool:
        """Block until `sock` is ready for `event` (False at the deadline); ChannelClosed if the server is gone.
        In the driver, waits in slices of DRIVER_SLICE_S and raises if a worker died meanwhile."""
        conn, _ = self._connection()
        poller = select.poll()
        poller.register(sock, event)
        poller.register(conn.fileno(), select.POLLIN)  # the server's end never speaks unasked: EOF = it is gone
        while True:
            if self._check_workers is not None:
                self._check_workers()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd, _ in poller.poll(min(left, DRIVER_SLICE_S if self._check_workers else 3600.0) * 1000):
                if fd == conn.fileno():
                    raise self._closed("connection closed")
                return True

    def _do(self, op, arg, sock: socket.socket, event: int, deadline: float, wait_name: str, on_timeout):
        """`op(arg, MSG_DONTWAIT)`, waiting (traced as `wait_name`) while it would block."""
        try:
            return op(arg, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        with span(wait_name):
            while True:
                if not self._wait(sock, event, deadline):
                    raise on_timeout()
                try:
                    return op(arg, socket.MSG_DONTWAIT)
                except BlockingIOError:  # another producer / consumer was faster
                    continue

    def put(self, item: Any, key: Hashable = DEFAULT_KEY, timeout: float | None = None) -> None:
        """Append `item` to queue `key`; blocks while the queue is full, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        q = self._ends(key)
        msg = _frame(dumps(item))

        def full() -> ChannelTimeout:
            return ChannelTimeout(f"channel {self.name!r} key {key!r}: still full after {timeout:g} s "
                                  f"(is its consumer alive and reading?)")

        if q.maxsize > 0:  # take a free slot
            self._do(q.tok_r.recv, 1, q.tok_r, select.POLLIN, deadline, "wait_put", full)
        else:  # count the message in before it can be taken out
            self._do(q.tok_w.send, b"\1", q.tok_w, select.POLLOUT, deadline, "wait_put", full)
        try:
            self._do(q.data_w.send, msg, q.data_w, select.POLLOUT, deadline, "wait_put", full)
        except ChannelTimeout:  # the kernel buffer stayed full: undo the token so that the count stays exact
            if q.maxsize > 0:
                q.tok_w.send(b"\1")
            else:
                q.tok_r.recv(1, socket.MSG_DONTWAIT)
            raise

    def get(self, key: Hashable = DEFAULT_KEY, timeout: float | None = None, expected_from: str = "") -> Any:
        """Pop the oldest item of queue `key`; blocks until one arrives, at most `timeout` seconds."""
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        q = self._ends(key)

        def empty() -> ChannelTimeout:
            who = f", expected from {expected_from}" if expected_from else ""
            return ChannelTimeout(f"channel {self.name!r} key {key!r}: nothing arrived within "
                                  f"{time.monotonic() - start:.0f} s{who}")

        msg = self._do(q.data_r.recv, _RECV_BYTES, q.data_r, select.POLLIN, start + timeout, "wait_get", empty)
        if q.maxsize > 0:
            q.tok_w.send(b"\1")  # the slot is free again (never blocks: at most maxsize tokens exist)
        else:
            q.tok_r.recv(1)  # its producer counted it in before sending it (never blocks)
        return _unframe(msg)

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """Items queued for `key` (exact when no put or get is under way)."""
        q = self._ends(key)
        tokens = struct.unpack("i", fcntl.ioctl(q.tok_r.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        return q.maxsize - tokens if q.maxsize > 0 else tokens

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


def close_process_resources() -> None:
    """Release this process's channel connections, queue ends and shared-memory segments (when a worker stops)."""
    for conn, sock in getattr(_local, "conns", {}).values():
        sock.close()
        conn.close()
    getattr(_local, "conns", {}).clear()
    with _opened_lock:
        for ends in _opened.values():
            ends.close()
        _opened.clear()
    _send_pool.close()
    for seg in _attached.values():
        seg.close()
    _attached.clear()
