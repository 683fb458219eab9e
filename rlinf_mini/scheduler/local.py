"""The local backend (the default): one torch.multiprocessing process per rank on this machine, group calls over
pipes, channels over kernel queues, tensors through shared memory (codec.py).

Ranks. Each rank is a process forked from a fork server, one per driver, that imported torch once
(`multiprocessing`'s "forkserver" start method, the default from Python 3.14 on Linux): 4 ranks answer their first
call 0.18 s after launch, against 3.1 s when each is a fresh interpreter importing torch ("spawn"); the server's own
start, once per driver process, is ~1.3-3 s (`python -m benchmarks --only backends`, row "local: rank start").
The server is a fresh interpreter, not a copy of the driver: it has no threads, no CUDA context and none of the
driver's state, so the fork is safe. Under `python -m rlinf_mini.train` it is a fork of the driver instead, made before
anything computes (`start_fork_server_here`: the run does not import torch twice). Ranks are named "<group>:<rank>"
in `ps -o comm` and top, the server SERVER_NAME; their command line is the server's.
A rank's environment (CUDA_VISIBLE_DEVICES, the CPU cores, RANK, ...) is the
driver's at launch plus its own, set in `worker_main` before anything initializes CUDA or the thread pools.
The driver talks to a rank through two pipes made at its start: commands in, results out; one write each way and no
thread in between (a multiprocessing.Queue hands every message to a feeder thread on each side: on 4 ranks that made a
no-op call 664 us). A message over INLINE_MAX goes through a shared-memory blob, so every pipe write is small and
atomic. A driver whose command pipe is full reads results while
it waits for room, so driver and worker never wait for each other.

Channels. Every (channel, key) is a queue kept by the kernel, shared by all its producers and consumers, so a message
goes from producer to consumer with no process in between (a put or get is 2-3 system calls, ~10 us of CPU):
- data: a socketpair(AF_UNIX, SOCK_SEQPACKET); one send is one message, one recv takes exactly one, atomically.
- bound and count: a stream socketpair holding one byte per token; FIONREAD counts them exactly. On a bounded key a
  token is a free slot (maxsize of them; a put takes one, a get gives one back); on an unbounded key a token is a
  queued message. maxsize=0 is bounded by the kernel's socket buffer (net.core.wmem_max: ~550 messages at Linux's
  default 212992 bytes); a put beyond that waits, and its timeout says so.
The `ChannelServer` (threads in the driver on one abstract unix socket; RLinf keeps its queues in a Ray actor)
creates a key's sockets on first use and hands their descriptors to each process once (SCM_RIGHTS), then stays out of
the data path. (The first version kept the queues in the server: two socket hops per message through a driver
thread, and small messages ran at 0.1x a pickled multiprocessing.Queue.)
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Hashable
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

from rlinf_mini.scheduler.backend import Backend, GroupRanks, RankSpec, Result
from rlinf_mini.scheduler.tracer import span

INLINE_MAX = 4000  # a larger command or result travels as a shared blob (a pipe write <= PIPE_BUF is atomic)
_PIPE_BYTES = 1 << 20  # pipe buffers are raised to this (Linux's default pipe-max-size) where allowed
POLL_S = 0.1


def _pipe(ctx) -> tuple[Connection, Connection]:
    """(reader, writer) of a new pipe, its buffer raised so that hundreds of small messages fit in it."""
    r, w = ctx.Pipe(duplex=False)
    try:
        fcntl.fcntl(w.fileno(), 1031, _PIPE_BYTES)  # F_SETPIPE_SZ (Linux)
    except OSError:
        pass  # the default 64 KiB still holds 16 messages of INLINE_MAX
    return r, w


def _writable(conn: Connection) -> bool:
    """Whether a message of up to PIPE_BUF bytes can be written without blocking (or the reader is gone, so the
    write fails at once)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(0))


# What the fork server imports once, so that no rank pays for it: torch (~85 % of a rank's start), torch._dynamo
# (a torch optimizer imports it at its first add_param_group: ~1.6 s of CPU in every actor rank otherwise) and the
# scheduler modules every rank runs (the Cluster adds the run's model module). Only imports: importing torch creates
# no CUDA context, and torch resets its thread pools in a forked child (as for a DataLoader's fork workers).
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "rlinf_mini.scheduler.worker", "rlinf_mini.scheduler.codec",
                      "rlinf_mini.scheduler.collective"]


def _mp_context(preload: tuple[str, ...] = ()):
    """The forkserver context, its server started now (once per driver process: a later call reuses it, whatever its
    `preload`) with this environment and FORKSERVER_PRELOAD + `preload` imported; it ends when the driver does, and its
    ranks with it (PR_SET_PDEATHSIG in each rank, the server's own end-of-file check)."""
    import multiprocessing.forkserver

    import torch.multiprocessing

    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD + list(preload))
    # OpenMP reads its wait policy once, when torch's libgomp loads, i.e. in the server: passive, so that idle
    # threads of ranks sharing cores sleep instead of spinning (every rank's env says so too, as before).
    with _environ({"OMP_WAIT_POLICY": "PASSIVE"}):
        multiprocessing.forkserver.ensure_running()
    return ctx


def start_fork_server_here(preload: tuple[str, ...] = ()) -> bool:
    """Start this process's fork server now, as a fork of this process; True if it started (False: a Cluster starts
    the stdlib's, a fresh interpreter, as before). The server shares this process's imports (torch, the scheduler,
    the model's module `preload`) instead of making its own, and imports the rest of FORKSERVER_PRELOAD while this
    process goes on. Measured on the fault tests' run: 7.4 -> 4.5 s of CPU, 6.8 -> 4.1 s of wall.

    Call it before this process runs any torch op (`python -m rlinf_mini.train` does, once the config is read, before
    RunPlan builds the model): libgomp's thread pool, made at the first parallel op, does not survive a fork
    (measured: the child of a process that ran one matmul hangs at its own first). The rest is checked here: Linux,
    no server yet, no Python thread but this one, no CUDA context. (numpy's OpenBLAS threads, started at import, are
    fork-safe: the stdlib-started server has them too.) libgomp reads OMP_WAIT_POLICY when torch loads, in this
    process: the ranks then have this process's policy (main() sets passive first, what the stdlib's server gets).
    The server gets default signal handlers and torch's default random state, as a fresh interpreter has."""
    import importlib
    import multiprocessing.forkserver as forkserver
    from multiprocessing import connection

    server = forkserver._forkserver  # the stdlib keeps one per process; its fields are what ensure_running() sets
    if (not sys.platform.startswith("linux") or threading.active_count() != 1 or server._forkserver_pid is not None
            or set(vars(server)) != {"_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid",
                                     "_inherited_fds", "_lock", "_preload_modules"}):  # another Python's stdlib
        return False
    # what this process imports anyway (the driver builds the model in RunPlan); the server imports torch._dynamo, which
    # only actor ranks need, itself while this process goes on
    for name in [m for m in FORKSERVER_PRELOAD if m != "torch._dynamo"] + list(preload):
        importlib.import_module(name)
    import torch

    if torch.cuda.is_initialized():
        return False
    modules = FORKSERVER_PRELOAD + list(preload)
    server.set_forkserver_preload(modules)
    with server._lock:
        # (No resource tracker yet, unlike the stdlib's start: the first rank's launch starts it, as this process's
        # child, and hands it to the rank; a config RunPlan refuses then leaves no tracker behind for a moment.)
        listener = socket.socket(socket.AF_UNIX)
        address = connection.arbitrary_address("AF_UNIX")  # abstract on Linux: nothing to unlink
        listener.bind(address)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w is gone (driver and ranks)
        pid = os.fork()
        if pid == 0:  # the server: never back into the driver's code, its atexit handlers or finally blocks
            code = 0
            try:
                os.close(alive_w)
                _set_process_name(SERVER_NAME)
                for signum in signal.valid_signals():
                    if callable(signal.getsignal(signum)):
                        signal.signal(signum, signal.SIG_DFL)
                torch.set_rng_state(torch.Generator().get_state())
                forkserver.main(listener.fileno(), alive_r, modules)
            except SystemExit:  # how the server ends when its last client is gone
                pass
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(alive_r)
        listener.close()
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return True


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """Set environment variables around a process start: the child inherits the environment at exec time."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _end_fork_server() -> None:
    """SIGKILL the fork server and reap it. Its ranks are gone by now (the cluster stopped them) and it holds no state;
    left to end at its lifeline's end-of-file, its interpreter teardown (torch loaded) took ~1 s at exit."""
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver  # the stdlib keeps one per process; it has no public stop
    if server._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server._forkserver_pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            server._stop()  # closes the lifeline and reaps the server


# The server outlives a Cluster (the next one in this process reuses it) but not the driver: at exit, after the
# Clusters' own shutdowns (atexit runs last-registered first, and a Cluster registers after importing this module),
# it is ended and reaped, so that nothing of the run is left when the driver's exit is seen. (A killed driver cannot:
# the server then ends by itself at its lifeline's end-of-file.) In a rank's process there is no server: a no-op.
atexit.register(_end_fork_server)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, timeout_s: float, preload: tuple[str, ...] = ()):
        self.timeout_s = timeout_s
        self.mp_context = _mp_context(preload)
        self.channel_server = ChannelServer()

    def launch(self, group, specs: list[RankSpec]) -> LocalRanks:
        # The rendezvous of the group's torch.distributed collective: a file store in this run's /dev/shm namespace
        # (one machine), not a TCP port. A port picked free here and bound by rank 0 seconds later was taken in
        # between once in a while (EADDRINUSE: other runs, Ray, the ephemeral ports of every connection).
        # The cluster's sweep at shutdown removes the file with the run's other segments (a killed run's: the next run).
        # (shm imports torch: here, not at this module's import, which comes before the driver's torch.)
        from rlinf_mini.scheduler import shm

        store = shm.SHM_DIR / f"{shm.PREFIX}{shm.run_id()}_store_{group.name}_{secrets.token_hex(4)}"
        for spec in specs:
            spec.env |= {"RLINF_MINI_STORE_FILE": str(store), "LOCAL_RANK": "0"}
        return LocalRanks(self, group.name, specs)

    def channel_transport(self, name: str, maxsize: int, default_timeout: float) -> KernelQueues:
        self.channel_server.create(name, maxsize)
        return KernelQueues(name, self.channel_server.address, self.channel_server.authkey, default_timeout)

    def shutdown(self) -> None:
        self.channel_server.close()
        close_transport_resources()


class LocalRanks(GroupRanks):
    def __init__(self, backend: LocalBackend, name: str, specs: list[RankSpec]):
        from rlinf_mini.scheduler import codec

        self._codec = codec
        self.name, self.timeout_s = name, backend.timeout_s
        self.procs, self._cmd, self._res = [], [], []
        self._lock = threading.Lock()  # driver threads (channel gets watching the workers) read results together
        self._backlog: list[Result] = []  # results read while a submit waited for room
        ctx = backend.mp_context
        for spec in specs:
            cmd_r, cmd_w = _pipe(ctx)
            res_r, res_w = _pipe(ctx)
            env = dict(os.environ) | spec.env  # what a spawned process would have inherited, and the rank's own
            proc = ctx.Process(target=worker_main, args=(spec, env, cmd_r, res_w), name=f"{name}:{spec.rank}",
                               daemon=True)
            proc.start()
            cmd_r.close()  # the child has its own copies now: a dead child's pipe then reads EOF
            res_w.close()
            self._cmd.append(cmd_w)
            self._res.append(res_r)
            self.procs.append(proc)
        self._open = list(self._res)  # result pipes not at EOF (a dead worker's pipe is dropped)
        self.pids = [p.pid for p in self.procs]

    def submit(self, ranks: list[int], call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        for r in ranks:
            # one frame per rank: a receiver frees the shared blobs and tensor segments of what it read
            msg = self._codec.frame((call_id, method, args, kwargs), INLINE_MAX)
            # A full command pipe means the worker is busy and, maybe, blocked writing results nobody reads: read
            # them while waiting, or driver and worker would each wait for the other.
            deadline = time.monotonic() + self.timeout_s
            while not _writable(self._cmd[r]):
                self._backlog += self.results(block_s=POLL_S)
                if self.exit_status(r) is not None:
                    break  # the wait reports the death
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} rank {r} took no command for {method}() within "
                                       f"{self.timeout_s:g} s (its command pipe stayed full)")
            try:
                self._cmd[r].send_bytes(msg)
            except OSError:  # the worker is gone: the wait reports its death, with its exit code
                pass

    def results(self, block_s: float = 0.0) -> list[Result]:
        if block_s and self._open:
            try:
                wait(self._open, block_s)  # outside the lock; the reads below only take what poll() shows
            except (OSError, ValueError):  # closed by a shutdown in another thread
                return []
        with self._lock:
            out, self._backlog = self._backlog, []
            for rank, conn in enumerate(self._res):
                while conn in self._open and conn.poll():
                    try:
                        raw = conn.recv_bytes()
                    except (EOFError, OSError):  # the worker exited; exit_status reports how
                        self._open.remove(conn)
                        break
                    try:
                        out.append(self._codec.unframe(raw))
                    except Exception as e:  # a result that cannot be read: its sender died meanwhile, or a bug
                        self.procs[rank].join(1.0)
                        if self.procs[rank].exitcode is None:
                            out.append((-1, rank, False, f"the driver could not read a result of rank {rank}: {e!r}"))
            return out

    def exit_status(self, rank: int) -> str | None:
        code = self.procs[rank].exitcode
        if code is None:
            return None
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def request_stop(self) -> None:
        for conn in self._cmd:
            try:
                conn.send_bytes(b"")  # the stop message
            except OSError:
                pass

    def finish_stop(self, deadline: float) -> None:
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        with self._lock:
            self._open = []
            for conn in [*self._cmd, *self._res]:
                conn.close()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
        _end_fork_server()  # the driver exits next, skipping atexit (os._exit); a later Cluster starts a new one


# ---------------------------------------------------------------------------------------------------------------------
# Inside the rank's process


SERVER_NAME = "rlmini-forksrv"  # the fork server's process name in `ps -o comm` and top; a rank's is "<group>:<rank>"


def _set_process_name(name: str) -> None:
    """Name this process in `ps -o comm` and top (Linux keeps 15 bytes); its command line stays what it was (the
    driver's, for a fork of the driver)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the driver dies, so that no worker is ever orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: the command loop below notices the parent's death instead


def worker_main(spec: RankSpec, env: dict[str, str], cmd_pipe: Connection, result_pipe: Connection) -> None:
    """Entry point of a rank's process, forked from the fork server (torch already imported, nothing initialized)."""
    import torch

    # Pinning first: CUDA reads CUDA_VISIBLE_DEVICES when it initializes (the first CUDA call, never at import), so
    # the rank's env must be in place before anything touches CUDA. Tests check that nothing had.
    cuda_before_pinning = torch.cuda.is_initialized()
    os.environ.clear()
    os.environ.update(env)
    _die_with_parent()
    _set_process_name(f"{spec.group_name}:{spec.rank}")
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the driver, which stops the workers
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)

    from rlinf_mini.scheduler import codec
    from rlinf_mini.scheduler.collective import TorchDistCollective
    from rlinf_mini.scheduler.worker import build_worker, run_call

    def send(result: Result) -> None:
        try:
            msg = codec.frame(result, INLINE_MAX)
        except Exception:  # pickled apart from the send, so that an unpicklable result becomes the call's error
            import traceback

            why = f"the result of the call cannot be pickled:\n{traceback.format_exc()}"
            msg = codec.frame((result[0], result[1], False, why), INLINE_MAX)
        result_pipe.send_bytes(msg)

    rank = spec.rank
    try:
        if spec.cores:
            torch.set_num_threads(len(spec.cores))
        device = torch.device("cuda:0" if spec.gpus else "cpu")
        worker = build_worker(spec, device, lambda timeout_s: TorchDistCollective(rank, spec.world_size, device,
                                                                                  timeout_s))
        worker._cuda_before_pinning = cuda_before_pinning
        send((0, rank, True, None))  # up and ready for calls
    except BaseException:
        import traceback

        send((0, rank, False, traceback.format_exc()))
        sys.exit(1)

    try:
        while True:
            if not cmd_pipe.poll(1.0):
                if os.getppid() != parent:
                    break
                continue
            try:
                raw = cmd_pipe.recv_bytes()
            except EOFError:  # the driver is gone
                break
            if not raw:  # the stop message
                break
            call_id, method, margs, mkwargs = codec.unframe(raw)
            ok, value = run_call(worker, method, margs, mkwargs)
            send((call_id, rank, ok, value))
    finally:
        try:
            worker.close()
        finally:
            close_transport_resources()
            codec.close_process_resources()
        result_pipe.close()
    # Everything the rank holds is released above. Skip the interpreter's teardown: for the actor (torch.distributed
    # loaded) its final garbage collection outlasted the driver's 3 s grace, so every shutdown waited 3 s and then
    # SIGTERMed it (multiprocessing's fork start method ends its children with os._exit too).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------------------------------
# Channels: kernel queues, made by a server in the driver

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


# A get (or a put on a full key) that would block first polls the socket for up to SPIN_S, then sleeps in poll().
# Waking a process that sleeps in poll() takes ~50-100 us on this 2-core VM, the order of one MLP inference (~0.3 ms):
# when the other side runs on another core, its message mostly comes within the spin. When the other side needs this
# core to make the message, spinning only delays it: after SPIN_MISSES spins in a row that caught nothing, this
# process stops spinning and tries once every SPIN_RETRY waits. embodied_mlp's end-to-end row (`python -m benchmarks
# --quick --only runner`, interleaved with the code without a spin): a plain 100 us spin, 5 pairs, median 0.70 -> 0.93
# of the same-calls loop; this one, 3 pairs, 0.75 -> 0.88.
SPIN_S = 100e-6
SPIN_MISSES = 8
SPIN_RETRY = 64
_spin = {"misses": 0, "skipped": 0}  # this process's (threads share it: a race only shifts when it retries)


def _spin_for(op, arg):
    """`op(arg, MSG_DONTWAIT)`'s result if it succeeds within SPIN_S of polling, else BlockingIOError."""
    if _spin["misses"] >= SPIN_MISSES:
        _spin["skipped"] += 1
        if _spin["skipped"] < SPIN_RETRY:
            raise BlockingIOError
        _spin["skipped"] = 0  # one try, which resumes spinning if it catches the message
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        try:
            value = op(arg, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        _spin["misses"] = 0
        return value
    _spin["misses"] += 1
    raise BlockingIOError


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
    kernel queues and no round trip: see _KeyQueue."""

    def __init__(self, name: str, address: str, authkey: bytes, default_timeout: float):
        self.name, self._address, self._authkey, self.default_timeout = name, address, authkey, default_timeout

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
            try:
                return _spin_for(op, arg)
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
        from rlinf_mini.scheduler import codec

        return codec.lend(shape, dtype, shared=True)

    def put(self, key: Hashable, item: Any, deadline: float, check, slice_s: float) -> bool:
        from rlinf_mini.scheduler import codec

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
        from rlinf_mini.scheduler import codec

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

