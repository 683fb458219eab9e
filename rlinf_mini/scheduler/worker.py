"""Worker, WorkerGroup and the group future: how the driver runs one method on every rank of a component.

    actor = ActorWorker.create_group(cfg).launch(cluster, placement_strategy=placement.get_strategy("actor"))
    results = actor.run_training().wait()      # runs on every rank; returns [rank 0 result, rank 1 result, ...]
    actor.execute_on(0).save_checkpoint(path).wait()   # only rank 0

Each rank is one process (torch.multiprocessing, spawn), started by `Cluster.allocate` with its device pinned before
torch is imported. The driver talks to a rank through two pipes created at spawn: commands in (pickled tuples: call
id, method name, arguments) and results out. Each message is one write on the pipe, with no thread in between (a
multiprocessing.Queue hands every message to a feeder thread on each side: on 4 ranks that made a no-op call 664 us);
a message over INLINE_MAX goes through a shared-memory file instead, so every pipe write is small and atomic. A
driver whose command pipe is full reads results while it waits for room, so driver and worker never wait for each
other. Data between workers does not go through here: it goes through a `Channel` passed as an argument. A call
returns a `GroupFuture` at once, so calls on different groups run at the same time (`env.interact(...)` and
`rollout.generate(...)` together make the rollout pipeline). `.wait()` raises
`WorkerError` with the group, rank and the worker's traceback if one rank raised, and `WorkerDiedError` if any
worker of the cluster died, so a crash anywhere ends every wait within a poll interval.

RLinf counterpart: `rlinf/scheduler/worker/worker.py::Worker` and `worker_group.py::WorkerGroup`,
`WorkerGroupFuncResult`. Left out: Ray, P2P send/recv (Channels do that job here), per-method concurrency. Another
backend (in-process for debugging, Ray for multi-node) would implement `launch`, `_submit` and `_collect` again.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rlinf_mini.scheduler import faults, tracer

POLL_S = 0.1  # how often a waiting driver checks that every worker is alive
# A group call's default wait is cluster.timeout_s plus this margin, so that a worker's own timeout (a channel get,
# which names the key and the producer it waited for) reaches the driver before the driver's vaguer one.
WAIT_MARGIN_S = 5.0
START_MIN_S = 60.0  # a worker's start (spawn, import torch, constructor) may take this long even with a short timeout
INLINE_MAX = 4000  # larger command or result pickles go through a shared-memory file; the pipe carries its name
# (a message of at most PIPE_BUF = 4096 bytes is written atomically)
_PIPE_BYTES = 1 << 20  # pipe buffers are raised to this (Linux's default pipe-max-size) where allowed


def _send(conn: Connection, payload: bytes) -> None:
    """One message on a pipe: b"P" + the pickle, or b"F" + the name of a shared-memory file holding it."""
    if len(payload) <= INLINE_MAX:
        conn.send_bytes(b"P" + payload)
        return
    from rlinf_mini.scheduler import shm  # here, not at the top: it imports torch, which a worker imports after pinning

    seg = shm.SharedSegment.create(len(payload), tag="call")
    seg._mmap[:] = payload  # one copy; the receiver removes the file once it has read it
    seg.owner = False  # closing our mapping must not remove the file before the receiver has it
    seg.close()
    conn.send_bytes(b"F" + pickle.dumps((seg.name, len(payload))))


def _decode(msg: bytes) -> Any:
    """The object `_send` sent, from the bytes read off the pipe."""
    if msg[:1] == b"P":
        return pickle.loads(msg[1:])
    from rlinf_mini.scheduler import shm

    name, size = pickle.loads(msg[1:])
    seg = shm.SharedSegment.attach(name, size)
    payload = seg._mmap[:]  # a bytes copy, so the mapping can close at once
    seg.close()
    shm.unlink(name)
    return pickle.loads(payload)


def _writable(conn: Connection) -> bool:
    """Whether a message of up to PIPE_BUF bytes can be written without blocking (or the reader is gone, so the
    write fails at once)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(0))


def _pipe(ctx) -> tuple[Connection, Connection]:
    """(reader, writer) of a new pipe, its buffer raised so that hundreds of small messages fit in it."""
    r, w = ctx.Pipe(duplex=False)
    try:
        fcntl.fcntl(w.fileno(), 1031, _PIPE_BYTES)  # F_SETPIPE_SZ (Linux)
    except OSError:
        pass  # the default 64 KiB still holds 16 messages of INLINE_MAX
    return r, w


class WorkerError(RuntimeError):
    """A worker method raised; the message holds group, rank and the worker's traceback."""


class WorkerDiedError(RuntimeError):
    """A worker process exited without being asked to."""


class Worker:
    """Base class of every worker. Subclasses take `cfg` (and optional arguments) and define public methods.

    The runtime sets, before `__init__` runs: `self._rank`, `self._world_size`, `self._group_name` and
    `self.device` (a torch.device: the process's own GPU as cuda:0, or the CPU).
    """

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @classmethod
    def create_group(cls, cfg: Any, *args: Any) -> WorkerGroup:
        return WorkerGroup(cls, cfg, args)

    def close(self) -> None:
        """Release what the worker holds (envs, shared buffers); called in the process when its group shuts down."""

    def log(self, msg: str) -> None:
        print(f"[{self._group_name}:{self._rank}] {msg}", file=sys.stderr, flush=True)

    def trace_enable(self, on: bool = True) -> None:
        """Record timeline spans in this process (scheduler/tracer.py); the runner turns it on with runner.trace."""
        tracer.enable(on)

    def trace_drain(self) -> list[tracer.Span]:
        """The spans recorded since the last drain (the runner gathers them once per step)."""
        return tracer.drain()

    def init_collective(self, timeout_s: float) -> None:
        """Join this group's collective (every rank must call it); then `all_reduce` sums over the ranks."""
        self._collective = self._make_collective(timeout_s)

    def all_reduce(self, t):
        """Sum `t` over the ranks of this group, in place (a no-op on one rank); returns `t`."""
        if self._world_size > 1:
            self._collective.all_reduce(t)
        return t

    def close_collective(self) -> None:
        if getattr(self, "_collective", None) is not None:
            self._collective.close()
            self._collective = None

    def get_rng_state(self) -> dict[str, Any]:
        """This process's global random generators (python, numpy, torch CPU and CUDA), for checkpoints."""
        import random

        import numpy as np
        import torch

        state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        import random

        import numpy as np
        import torch

        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class GroupFuture:
    """The pending result of one call on some ranks of a group."""

    def __init__(self, group: WorkerGroup, call_id: int, method: str, ranks: list[int]):
        self.group, self.call_id, self.method, self.ranks = group, call_id, method, ranks

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Per-rank results, in rank order. Raises WorkerError, WorkerDiedError or TimeoutError."""
        if timeout is None:
            return self.group._collect(self, self.group.cluster.timeout_s + WAIT_MARGIN_S, "cluster.timeout_s + margin")
        return self.group._collect(self, timeout, "the wait's timeout")

    def done(self) -> bool:
        self.group._drain()
        return all(r in self.group._results.get(self.call_id, {}) for r in self.ranks)


class WorkerGroup:
    """All ranks of one component. Public methods of the worker class become group calls (see __getattr__)."""

    def __init__(self, cls: type, cfg: Any, args: tuple):
        self.cls, self.cfg, self.args = cls, cfg, args
        self.name = cls.__name__
        self.procs: list = []
        self._cmd_pipes: list[Connection] = []  # driver's writing end, one per rank
        self._result_pipes: list[Connection] = []  # driver's reading end, one per rank
        self._open_results: list[Connection] = []  # those not at EOF (a dead worker's pipe is dropped)
        self._read_lock = threading.Lock()  # driver threads (channel gets watching the workers) drain together
        self._results: dict[int, dict[int, tuple[bool, Any]]] = {}
        self._call_ids = itertools.count(1)
        self._methods: dict[int, str] = {}  # call id -> method name, while the call is pending
        self._abandoned: set[int] = set()  # calls already reported as failed: late results are dropped
        self._ready: set[int] = set()  # ranks whose worker finished its constructor
        self._all_ready_at = 0.0  # when the last of them did (a call's clock starts no earlier)
        self._closed = False  # no more calls accepted
        self._stopped = False  # processes joined and pipes closed

    def launch(self, cluster, placement_strategy, name: str | None = None) -> WorkerGroup:
        """Start one process per placement rank; returns at once (failures surface at the first wait)."""
        self.cluster = cluster
        self.name = name or self.name
        self.world_size = placement_strategy.world_size
        self._launched_at = time.monotonic()
        ctx = cluster.mp_context
        for p in placement_strategy.placements:
            cmd_r, cmd_w = _pipe(ctx)
            res_r, res_w = _pipe(ctx)
            proc = cluster.allocate(self, p, cmd_r, res_w)
            cmd_r.close()  # the child has its own copies now: a dead child's pipe then reads EOF
            res_w.close()
            self._cmd_pipes.append(cmd_w)
            self._result_pipes.append(res_r)
            self.procs.append(proc)
        self._open_results = list(self._result_pipes)
        return self

    # Dynamic forwarding, in this one place: `group.run_training(...)` submits `run_training` to every rank.
    # Only public methods of the worker class are forwarded, so a typo is still an AttributeError.
    def __getattr__(self, method: str):
        if method.startswith("_") or not callable(getattr(self.cls, method, None)):
            raise AttributeError(f"{self.cls.__name__} has no public method {method!r}")
        return lambda *args, **kwargs: self._submit(method, args, kwargs, list(range(self.world_size)))

    def execute_on(self, *ranks: int) -> _RankSelection:
        """Run the next call on these ranks only: `group.execute_on(0).save_checkpoint(path)`."""
        return _RankSelection(self, list(ranks))

    def _submit(self, method: str, args: tuple, kwargs: dict, ranks: list[int]) -> GroupFuture:
        if self._closed:
            raise RuntimeError(f"{self.name} is shut down; cannot call {method}()")
        call_id = next(self._call_ids)
        self._methods[call_id] = method
        payload = bytes(ForkingPickler.dumps((call_id, method, args, kwargs)))  # once for all ranks
        for r in ranks:
            conn = self._cmd_pipes[r]
            # A full command pipe means the worker is busy and, maybe, blocked writing results nobody reads: read
            # them while waiting, or driver and worker would each wait for the other.
            deadline = time.monotonic() + self.cluster.timeout_s + WAIT_MARGIN_S
            while not _writable(conn):
                self._drain(block_s=POLL_S)
                self.cluster.check_workers()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} rank {r} took no command for {method}() within "
                                       f"{self.cluster.timeout_s + WAIT_MARGIN_S:g} s (its command pipe stayed full)")
            try:
                _send(conn, payload)
            except OSError:  # the worker is gone: the wait reports its death, with its exit code
                pass
        return GroupFuture(self, call_id, method, ranks)

    def _drain(self, block_s: float = 0.0) -> None:
        """Move every result that has arrived into `_results`, waiting up to `block_s` for the first one; a failed
        worker construction raises at once."""
        if block_s and self._open_results:
            try:
                wait(self._open_results, block_s)  # outside the lock; the reads below only take what poll() shows
            except (OSError, ValueError):  # closed by a shutdown in another thread
                return
        with self._read_lock:
            for conn in list(self._open_results):
                while conn.poll():
                    try:
                        raw = conn.recv_bytes()
                    except (EOFError, OSError):  # the worker exited; Cluster.check_workers reports its exit code
                        self._open_results.remove(conn)
                        break
                    call_id, rank, ok, value = _decode(raw)
                    if call_id == 0 and not ok:  # the worker's constructor raised; the process is exiting
                        raise WorkerError(f"{self.name} rank {rank} failed to start:\n{value}")
                    if call_id == 0:  # the worker is up: it started, imported torch and ran its constructor
                        self._ready.add(rank)
                        if len(self._ready) == self.world_size:
                            self._all_ready_at = time.monotonic()
                    elif call_id not in self._abandoned:
                        self._results.setdefault(call_id, {})[rank] = (ok, value)

    def _raise_failed_call(self) -> None:
        """Raise the failure of any pending call, waited on or not: while the driver waits for the actor, an env
        rank that raised must end the wait too (the actor would otherwise wait out its channel timeout)."""
        for call_id, got in list(self._results.items()):
            for rank, (ok, value) in sorted(got.items()):
                if not ok:
                    method = self._methods.get(call_id, "?")  # before _abandon forgets it
                    self._abandon(call_id)
                    raise WorkerError(f"{self.name} rank {rank} raised in {method}():\n{value}")

    def _abandon(self, call_id: int) -> None:
        self._abandoned.add(call_id)
        self._results.pop(call_id, None)
        self._methods.pop(call_id, None)

    def _collect(self, fut: GroupFuture, timeout: float, why: str = "") -> list[Any]:
        # Starting a process (spawn, import torch, constructor) takes seconds, many on a loaded machine; it has its
        # own budget, and a call's clock starts once every rank is up, so a short timeout_s does not fail the start.
        submitted = time.monotonic()
        self._drain()
        while True:
            got = self._results.get(fut.call_id, {})
            for rank in fut.ranks:
                if rank in got and not got[rank][0]:
                    missing = [r for r in fut.ranks if r not in got]
                    pending = f" (rank(s) {missing} had not returned)" if missing else ""
                    self._abandon(fut.call_id)
                    raise WorkerError(f"{self.name} rank {rank} raised in {fut.method}(){pending}:\n{got[rank][1]}")
            if all(r in got for r in fut.ranks):
                del self._results[fut.call_id]
                self._methods.pop(fut.call_id, None)
                return [got[r][1] for r in fut.ranks]
            arrived = len(got)
            self.cluster.check_workers()  # it drains every group, this one too: look again before blocking below
            if len(self._results.get(fut.call_id, {})) != arrived:
                continue
            now = time.monotonic()
            starting = [r for r in range(self.world_size) if r not in self._ready]
            if starting and now > self._launched_at + max(timeout, START_MIN_S):
                self._abandon(fut.call_id)
                raise TimeoutError(f"{self.name} rank(s) {starting} did not start within "
                                   f"{max(timeout, START_MIN_S):g} s")
            if not starting and now > max(submitted, self._all_ready_at) + timeout:
                missing = [r for r in fut.ranks if r not in got]
                self._abandon(fut.call_id)
                raise TimeoutError(f"{self.name}.{fut.method}() did not return from rank(s) {missing} within "
                                   f"{timeout:g} s ({why})")
            self._drain(block_s=POLL_S)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask every rank to stop, then terminate and finally kill whatever is still alive."""
        self.request_stop()
        self.finish_stop(time.monotonic() + timeout)

    def request_stop(self) -> None:
        """Phase 1 of shutdown: tell every rank to close and exit after its current call."""
        if self._closed:
            return
        self._closed = True
        for conn in self._cmd_pipes:
            try:
                conn.send_bytes(b"")  # the stop message
            except OSError:
                pass

    def finish_stop(self, deadline: float) -> None:
        """Phase 2: wait until `deadline` for the ranks to exit, then SIGTERM, then SIGKILL the rest."""
        if self._stopped:
            return
        self._stopped = True
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        with self._read_lock:
            self._open_results = []
            for conn in [*self._cmd_pipes, *self._result_pipes]:
                conn.close()


class _RankSelection:
    def __init__(self, group: WorkerGroup, ranks: list[int]):
        self.group, self.ranks = group, ranks

    def __getattr__(self, method: str):
        getattr(self.group, method)  # same checks as a full-group call
        return lambda *args, **kwargs: self.group._submit(method, args, kwargs, self.ranks)


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker process


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the driver dies, so that no worker is ever orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: the command loop below notices the parent's death instead


def worker_main(cls_module: str, cls_name: str, cfg: Any, args: tuple, cores: list[int] | None,
                cmd_pipe: Connection, result_pipe: Connection) -> None:
    """Entry point of a worker process. The environment (CUDA_VISIBLE_DEVICES, RANK, ...) was set at spawn."""
    torch_before_pinning = "torch" in sys.modules  # must stay False: tests check that pinning came first
    _die_with_parent()
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the driver, which stops the workers
    if cores:
        os.sched_setaffinity(0, cores)
    rank = int(os.environ["RANK"])
    try:
        import importlib

        import torch
        import torch.multiprocessing  # noqa: F401  (registers tensor sharing for the results' ForkingPickler)

        from rlinf_mini.scheduler.collective import TorchDistCollective

        if cores:
            torch.set_num_threads(len(cores))
        cls = getattr(importlib.import_module(cls_module), cls_name)
        worker = cls.__new__(cls)
        worker._rank, worker._world_size = rank, int(os.environ["WORLD_SIZE"])
        worker._group_name = os.environ["RLINF_MINI_GROUP"]
        worker._torch_before_pinning = torch_before_pinning
        worker.device = torch.device("cuda:0" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu")
        worker._make_collective = lambda timeout_s: TorchDistCollective(rank, worker._world_size, worker.device,
                                                                       timeout_s)
        fault = faults.for_this_worker(worker._group_name, rank)  # None unless RLMINI_FAULT names this worker
        if fault is not None:
            faults.before_call(fault, "__init__")
        worker.__init__(cfg, *args)
        _send(result_pipe, pickle.dumps((0, rank, True, None)))  # up and ready for calls
    except BaseException:
        _send(result_pipe, pickle.dumps((0, rank, False, traceback.format_exc())))
        sys.exit(1)

    from rlinf_mini.scheduler.channel import close_process_resources

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
            call_id, method, margs, mkwargs = _decode(raw)
            try:
                if fault is not None:
                    faults.before_call(fault, method)
                with tracer.span(method):  # the whole call; its waits are recorded inside it
                    result = (True, getattr(worker, method)(*margs, **mkwargs))
            except BaseException:
                result = (False, traceback.format_exc())
            if fault is not None:
                faults.disarm()
            try:
                # Pickled apart from the send, so that an unpicklable result becomes the call's error.
                payload = bytes(ForkingPickler.dumps((call_id, rank, *result)))
            except Exception:
                why = f"the result of {method}() cannot be pickled:\n{traceback.format_exc()}"
                payload = bytes(ForkingPickler.dumps((call_id, rank, False, why)))
            _send(result_pipe, payload)
    finally:
        try:
            worker.close()
        finally:
            close_process_resources()
        result_pipe.close()
