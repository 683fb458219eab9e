"""The local backend's channel transport: every (channel, key) a queue kept by the kernel, made by a ChannelServer
in the driver.

Every (channel, key) is a queue kept by the kernel, shared by all its producers and consumers, so a message
goes from producer to consumer with no process in between (a put or get is 2-3 system calls):
- data: a socketpair(AF_UNIX, SOCK_SEQPACKET); one send is one message, one recv takes exactly one, atomically.
- bound and count: a stream socketpair holding one byte per token; FIONREAD counts them exactly. On a bounded key a
  token is a free slot (maxsize of them; a put takes one, a get gives one back); on an unbounded key a token is a
  queued message. maxsize=0 is bounded by the kernel's socket buffer (net.core.wmem_max: ~550 messages at Linux's
  default 212992 bytes); a put beyond that waits, and its timeout says so.
The `ChannelServer` (threads in the driver on one abstract unix socket; RLinf keeps its queues in a Ray actor)
creates a key's sockets on first use and hands their descriptors to each process once (SCM_RIGHTS), then stays out of
the data path. (The first version kept the queues in the server: two socket hops per message through a driver
thread, slower for small messages than a pickled multiprocessing.Queue; docs/performance.md.)
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Hashable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from rlinf_mini.scheduler import codec
from rlinf_mini.scheduler.spin_wait import spin_for
from rlinf_mini.scheduler.tracer import span

MAX_BOUND = 512  # each returned token is one skb (~770 bytes) in the kernel: ~550 fit at Linux's default wmem_max
_MSG_MAX = 16 * 1024  # a larger pickle travels as a blob: a key's socket then holds >= 25 messages at the default
_RECV_BYTES = _MSG_MAX + 1024


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


_local = threading.local()  # one server connection per thread
_opened: dict[tuple[str, str, Hashable], _KeyEnds] = {}  # (address, channel, key) -> this process's ends
_opened_lock = threading.Lock()


class _KeyEnds:
    def __init__(self, maxsize: int, socks: list[socket.socket]):
        self.maxsize = maxsize
        self.data_w, self.data_r, self.tok_w, self.tok_r = socks

    def close(self) -> None:
        for s in (self.data_w, self.data_r, self.tok_w, self.tok_r):
            s.close()


class ChannelClosedError(ConnectionError):
    """Raised by the transport; channel.py turns it into its ChannelClosed."""


class KernelQueues:
    """The local channel transport (picklable: a server address). A put or get is a few system calls on the key's
    kernel queues and no round trip: see _KeyQueue. `spin` (cluster.channel_wait 'spin'): a wait first retries for a
    moment (spin_wait.py) before it sleeps in poll(); without it, it sleeps at once."""

    def __init__(self, name: str, address: str, authkey: bytes, default_timeout: float, spin: bool = True):
        self.name, self._address, self._authkey, self.default_timeout = name, address, authkey, default_timeout
        self.spin = spin

    def _closed(self, why: object) -> ChannelClosedError:
        _local.__dict__.setdefault("conns", {}).pop(self._address, None)
        return ChannelClosedError(f"channel {self.name!r}: the channel server is gone ({why})")

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

    def _wait(self, sock: socket.socket, event: int, deadline: float, check, slice_s: float) -> bool:
        """Block until `sock` is ready for `event` (False at the deadline); ChannelClosedError if the server is
        gone. With a `check` (the driver's liveness check), waits in slices of `slice_s` and calls it each time."""
        conn, _ = self._connection()
        poller = select.poll()
        poller.register(sock, event)
        poller.register(conn.fileno(), select.POLLIN)  # the server's end never speaks unasked: EOF = it is gone
        while True:
            if check is not None:
                check()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd, _ in poller.poll(min(left, slice_s if check else 3600.0) * 1000):
                if fd == conn.fileno():
                    raise self._closed("connection closed")
                return True

    def _do(self, op, arg, sock, event: int, deadline: float, wait_name: str, check, slice_s: float):
        """`op(arg, MSG_DONTWAIT)`, waiting (traced as `wait_name`) while it would block; None at the deadline."""
        try:
            return op(arg, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        with span(wait_name):
            if self.spin:
                try:
                    return spin_for(op, arg)
                except BlockingIOError:
                    pass
            while True:
                if not self._wait(sock, event, deadline, check, slice_s):
                    return None
                try:
                    return op(arg, socket.MSG_DONTWAIT)
                except BlockingIOError:  # another producer / consumer was faster
                    continue

    def empty(self, shape: tuple[int, ...], dtype) -> Any:
        """A tensor in this process's pool of shared segments, which a put sends by name (Channel.empty)."""
        return codec.lend(shape, dtype, shared=True)

    def put(self, key: Hashable, item: Any, deadline: float, check, slice_s: float) -> bool:
        q = self._ends(key)
        msg = codec.frame(item, _MSG_MAX)
        if q.maxsize > 0:  # take a free slot
            if self._do(q.tok_r.recv, 1, q.tok_r, select.POLLIN, deadline, "wait_put", check, slice_s) is None:
                return False
        else:  # count the message in before it can be taken out
            if self._do(q.tok_w.send, b"\1", q.tok_w, select.POLLOUT, deadline, "wait_put", check, slice_s) is None:
                return False
        if self._do(q.data_w.send, msg, q.data_w, select.POLLOUT, deadline, "wait_put", check, slice_s) is None:
            if q.maxsize > 0:  # the kernel buffer stayed full: undo the token so that the count stays exact
                q.tok_w.send(b"\1")
            else:
                q.tok_r.recv(1, socket.MSG_DONTWAIT)
            return False
        return True

    def get(self, key: Hashable, deadline: float, check, slice_s: float) -> tuple[bool, Any]:
        q = self._ends(key)
        msg = self._do(q.data_r.recv, _RECV_BYTES, q.data_r, select.POLLIN, deadline, "wait_get", check, slice_s)
        if msg is None:
            return False, None
        if q.maxsize > 0:
            q.tok_w.send(b"\1")  # the slot is free again (never blocks: at most maxsize tokens exist)
        else:
            q.tok_r.recv(1)  # its producer counted it in before sending it (never blocks)
        return True, codec.unframe(msg)

    def qsize(self, key: Hashable) -> int:
        q = self._ends(key)
        tokens = struct.unpack("i", fcntl.ioctl(q.tok_r.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        return q.maxsize - tokens if q.maxsize > 0 else tokens

    def full_reason(self, key: Hashable) -> str:
        """Why a put found the key full, for its timeout message."""
        if self._ends(key).maxsize > 0:
            return "is its consumer alive and reading?"
        return (f"maxsize=0 is bounded by the kernel's socket buffer here: net.core.wmem_max={_wmem_max()} bytes "
                f"holds ~{_wmem_max() // 384} messages; raise it or read the key")


def close_transport_resources() -> None:
    """Release this process's channel connections and queue ends (when a worker stops, and at the driver's end)."""
    for conn, sock in getattr(_local, "conns", {}).values():
        sock.close()
        conn.close()
    getattr(_local, "conns", {}).clear()
    with _opened_lock:
        for ends in _opened.values():
            ends.close()
        _opened.clear()
