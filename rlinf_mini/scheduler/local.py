"""The local backend (the default): one torch.multiprocessing process per rank on this machine, forked from the fork
server (forkserver.py; cluster.rank_start 'spawn': a fresh interpreter per rank), group calls over two pipes per
rank; channels over kernel queues (kernel_queues.py; cluster.channel_wait picks how a wait waits, spin_wait.py),
tensors through shared memory (codec.py).

A rank's environment (CUDA_VISIBLE_DEVICES, the CPU cores, RANK, ...) is the driver's at launch plus its own, set in
`worker_main` before anything initializes CUDA or the thread pools. The driver talks to a rank through two pipes made
at its start: commands in, results out; one write each way and no thread in between (a multiprocessing.Queue hands
every message to a feeder thread on each side, which made a no-op call several times slower). A message over INLINE_MAX
goes through a shared-memory blob, so every pipe write is small and atomic. A driver whose command pipe is full reads
results while it waits for room, so driver and worker never wait for each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import select
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection, wait

from rlinf_mini.scheduler.backend import Backend, GroupRanks, RankSpec, Result
from rlinf_mini.scheduler.forkserver import (
    FORKSERVER_PRELOAD,
    SERVER_NAME,
    _end_fork_server,
    _environ,
    _mp_context,
    _set_process_name,
    start_fork_server_here,
)
from rlinf_mini.scheduler.kernel_queues import ChannelServer, KernelQueues, close_transport_resources

# the names callers use as local.X (conftest extends FORKSERVER_PRELOAD in place; train.py starts the server)
__all__ = ["INLINE_MAX", "FORKSERVER_PRELOAD", "SERVER_NAME", "ChannelServer", "KernelQueues", "LocalBackend",
           "LocalRanks", "close_transport_resources", "start_fork_server_here", "worker_main"]

INLINE_MAX = 4000  # a larger command or result travels as a shared blob (a pipe write <= PIPE_BUF is atomic)
_PIPE_BYTES = 1 << 20  # pipe buffers are raised to this (Linux's default pipe-max-size) where allowed
POLL_S = 0.1
# A rank that outlived the stop's grace gets SIGTERM, then SIGKILL. A killed process always ends, but its end can take
# seconds on a loaded machine: the kernel unmaps a simulator's memory (MuJoCo with EGL), and the fork server, which
# reaps it, has to be scheduled to report its exit. A shorter wait left such a rank alive to the caller's eyes.
TERM_WAIT_S, KILL_WAIT_S = 2.0, 30.0


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


class LocalBackend(Backend):
    name = "local"

    def __init__(self, timeout_s: float, preload: tuple[str, ...] = (), spin: bool = True, fork_server: bool = True,
                 all_reduce: str = "shm"):
        """spin: channel waits spin before they sleep (cluster.channel_wait); fork_server: ranks fork from the fork
        server (cluster.rank_start 'forkserver'), else each is a fresh interpreter ('spawn'); all_reduce: how CPU
        ranks sum (cluster.all_reduce: 'shm' through shared memory, 'gloo')."""
        self.timeout_s, self.spin, self.fork_server = timeout_s, spin, fork_server
        self.all_reduce = all_reduce
        self.mp_context = _mp_context(preload) if fork_server else _spawn_context()
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
            spec.env |= {"RLINF_MINI_STORE_FILE": str(store), "LOCAL_RANK": "0",
                         "RLINF_MINI_ALL_REDUCE": self.all_reduce}
        return LocalRanks(self, group.name, specs)

    def channel_transport(self, name: str, maxsize: int, default_timeout: float) -> KernelQueues:
        self.channel_server.create(name, maxsize)
        return KernelQueues(name, self.channel_server.address, self.channel_server.authkey, default_timeout,
                            spin=self.spin)

    def shutdown(self) -> None:
        self.channel_server.close()
        close_transport_resources()


def _spawn_context():
    """torch.multiprocessing's spawn context: each rank a fresh interpreter that imports torch and the run's modules
    itself (cluster.rank_start 'spawn')."""
    import torch.multiprocessing

    return torch.multiprocessing.get_context("spawn")


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
            # a spawned rank's libgomp reads its wait policy at torch's import, before worker_main sets its env:
            # passive, as the fork server's (idle threads of ranks sharing cores sleep instead of spinning)
            with _environ({} if backend.fork_server else {"OMP_WAIT_POLICY": "PASSIVE"}):
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
        for signal_them, wait_s in (("terminate", TERM_WAIT_S), ("kill", KILL_WAIT_S)):  # all at once, one wait
            alive = [proc for proc in self.procs if proc.is_alive()]
            for proc in alive:
                getattr(proc, signal_them)()
            until = time.monotonic() + wait_s
            for proc in alive:
                proc.join(max(0.0, until - time.monotonic()))
        for rank, proc in enumerate(self.procs):
            if proc.is_alive():  # in uninterruptible sleep (D state: a stuck device or NFS); nothing more to do
                print(f"rlinf_mini: {self.name} rank {rank} (pid {proc.pid}) was still alive {KILL_WAIT_S:g} s after "
                      f"SIGKILL", file=sys.stderr, flush=True)
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


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the driver dies, so that no worker is ever orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: the command loop below notices the parent's death instead


def _drop_fork_server_lifeline() -> None:
    """Close this rank's copy of the fork server's lifeline (the stdlib hands every forked child the write end), so
    that the server ends when the driver does, whatever its ranks do, and a rank that hangs is SIGKILLed with it
    (PR_SET_PDEATHSIG): with the copy open, a killed driver's hung rank and the server kept each other alive."""
    import multiprocessing.forkserver as forkserver

    server = forkserver._forkserver  # the stdlib keeps one per process; a rank never starts processes through it
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None


def worker_main(spec: RankSpec, env: dict[str, str], cmd_pipe: Connection, result_pipe: Connection) -> None:
    """Entry point of a rank's process, forked from the fork server (torch already imported, nothing initialized) or
    spawned (cluster.rank_start 'spawn': a fresh interpreter)."""
    import torch

    # Pinning first: CUDA reads CUDA_VISIBLE_DEVICES when it initializes (the first CUDA call, never at import), so
    # the rank's env must be in place before anything touches CUDA. Tests check that nothing had.
    cuda_before_pinning = torch.cuda.is_initialized()
    os.environ.clear()
    os.environ.update(env)
    _die_with_parent()
    _drop_fork_server_lifeline()
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
        device = torch.device("cuda:0" if spec.gpus else "cpu")  # (build_worker sets the placement's thread count)
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
