"""Worker, WorkerGroup and the group future: how the driver runs one method on every rank of a component.

    actor = ActorWorker.create_group(cfg).launch(cluster, placement_strategy=placement.get_strategy("actor"))
    results = actor.run_training().wait()      # runs on every rank; returns [rank 0 result, rank 1 result, ...]
    actor.execute_on(0).save_checkpoint(path).wait()   # only rank 0

How a rank runs is the backend's business (backend.py: a process, a thread of the driver, a Ray actor); this module
is the same on all of them. A call returns a `GroupFuture` at once, so calls on different groups run at the same
time (`env.interact(...)` and `rollout.generate(...)` together make the rollout pipeline). `.wait()` raises
`WorkerError` with the group, rank and the worker's traceback if one rank raised, and `WorkerDiedError` if any
worker of the cluster died, so a crash anywhere ends every wait within a poll interval. Data between workers does
not go through here: it goes through a `Channel` passed as an argument.

RLinf counterpart: `rlinf/scheduler/worker/worker.py::Worker` and `worker_group.py::WorkerGroup`,
`WorkerGroupFuncResult`. Left out: P2P send/recv (Channels do that job here), per-method concurrency.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import sys
import threading
import time
import traceback
from typing import Any

from rlinf_mini.scheduler import faults, tracer
from rlinf_mini.scheduler.backend import RankSpec

POLL_S = 0.1  # how often a waiting driver checks that every worker is alive
# A group call's default wait is cluster.timeout_s plus this margin, so that a worker's own timeout (a channel get,
# which names the key and the producer it waited for) reaches the driver before the driver's vaguer one.
WAIT_MARGIN_S = 5.0
START_MIN_S = 60.0  # a worker's start (spawn, import torch, constructor) may take this long even with a short timeout


class WorkerError(RuntimeError):
    """A worker method raised; the message holds group, rank and the worker's traceback."""


class WorkerDiedError(RuntimeError):
    """A worker process exited without being asked to."""


class Worker:
    """Base class of every worker. Subclasses take `cfg` (and optional arguments) and define public methods.

    The runtime sets, before `__init__` runs: `self._rank`, `self._world_size`, `self._group_name` and
    `self.device` (a torch.device: the rank's own GPU, or the CPU).
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
        self._ranks = None  # the backend's GroupRanks, once launched
        self._results: dict[int, dict[int, tuple[bool, Any]]] = {}
        self._call_ids = itertools.count(1)
        self._methods: dict[int, str] = {}  # call id -> method name, while the call is pending
        self._abandoned: set[int] = set()  # calls already reported as failed: late results are dropped
        self._ready: set[int] = set()  # ranks whose worker finished its constructor
        self._all_ready_at = 0.0  # when the last of them did (a call's clock starts no earlier)
        self._closed = False  # no more calls accepted
        self._stopped = False  # ranks joined

    def launch(self, cluster, placement_strategy, name: str | None = None) -> WorkerGroup:
        """Start one rank per placement (a process, a thread or a Ray actor: cluster.backend); returns at once
        (failures surface at the first wait)."""
        self.cluster = cluster
        self.name = name or self.name
        self.world_size = placement_strategy.world_size
        self._launched_at = time.monotonic()
        specs = [cluster.rank_spec(self, p) for p in placement_strategy.placements]
        self._ranks = cluster.backend.launch(self, specs)
        cluster.groups.append(self)
        return self

    @property
    def pids(self) -> list[int | None]:
        """The process id of each rank (the driver's own on the inline backend)."""
        return self._ranks.pids

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
        self._ranks.submit(ranks, call_id, method, args, kwargs)
        return GroupFuture(self, call_id, method, ranks)

    def _drain(self, block_s: float = 0.0) -> None:
        """Move every result that has arrived into `_results`, waiting up to `block_s` for the first one; a failed
        worker construction raises (after the other results are stored)."""
        failed_start = None
        for call_id, rank, ok, value in self._ranks.results(block_s):
            if call_id == 0 and not ok:  # the worker's constructor raised; the rank is exiting
                failed_start = failed_start or WorkerError(f"{self.name} rank {rank} failed to start:\n{value}")
            elif call_id == 0:  # the worker is up: it started, imported torch and ran its constructor
                self._ready.add(rank)
                if len(self._ready) == self.world_size:
                    self._all_ready_at = time.monotonic()
            elif call_id not in self._abandoned:
                self._results.setdefault(call_id, {})[rank] = (ok, value)
        if failed_start is not None:
            raise failed_start

    def _raise_failed_call(self) -> None:
        """Raise the failure of any pending call, waited on or not: while the driver waits for the actor, an env
        rank that raised must end the wait too (the actor would otherwise wait out its channel timeout)."""
        for call_id, got in list(self._results.items()):
            for rank, (ok, value) in sorted(got.items()):
                if not ok:
                    method = self._methods.get(call_id, "?")  # before _abandon forgets it
                    self._abandon(call_id)
                    raise WorkerError(f"{self.name} rank {rank} raised in {method}():\n{value}")

    def _check_alive(self) -> None:
        """Raise WorkerDiedError if a rank ended without being asked to (a constructor failure raises its own)."""
        if self._closed:
            return
        for rank in range(self.world_size):
            how = self._ranks.exit_status(rank)
            if how is not None:
                self._drain()  # a constructor failure carries a traceback: raise that instead
                pid = self._ranks.pids[rank]
                raise WorkerDiedError(f"{self.name} rank {rank} (pid {pid}) died with {how}")

    def _abandon(self, call_id: int) -> None:
        self._abandoned.add(call_id)
        self._results.pop(call_id, None)
        self._methods.pop(call_id, None)

    def _collect(self, fut: GroupFuture, timeout: float, why: str = "") -> list[Any]:
        # Starting a rank (spawn, import torch, constructor) takes seconds, many on a loaded machine; it has its
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
                                   f"{timeout:g} s ({why}){self.cluster.backend.wait_note()}")
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
        self._ranks.request_stop()

    def finish_stop(self, deadline: float) -> None:
        """Phase 2: wait until `deadline` for the ranks to exit, then terminate and kill the rest."""
        if self._stopped:
            return
        self._stopped = True
        self._ranks.finish_stop(deadline)


class _RankSelection:
    def __init__(self, group: WorkerGroup, ranks: list[int]):
        self.group, self.ranks = group, ranks

    def __getattr__(self, method: str):
        getattr(self.group, method)  # same checks as a full-group call
        return lambda *args, **kwargs: self.group._submit(method, args, kwargs, self.ranks)


# ---------------------------------------------------------------------------------------------------------------------
# Inside a rank (every backend): build the worker, run its calls


def build_worker(spec: RankSpec, device, make_collective) -> Worker:
    """Construct the rank's worker: runtime attributes first, then the class's own __init__ (an injected fault with
    method=__init__ fires before it)."""
    import torch

    torch.set_num_threads(spec.threads)  # every backend: the placement's count (RankSpec.threads says why)
    cls = getattr(importlib.import_module(spec.cls_module), spec.cls_name)
    worker = cls.__new__(cls)
    worker._rank, worker._world_size, worker._group_name = spec.rank, spec.world_size, spec.group_name
    worker.device = device
    worker._make_collective = make_collective
    worker._fault = faults.for_this_worker(spec.group_name, spec.rank)  # None unless RLINF_MINI_FAULT names this rank
    if worker._fault is not None:
        faults.before_call(worker._fault, "__init__")
    worker.__init__(spec.cfg, *spec.args)
    return worker


def run_call(worker: Worker, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """Run one call on the rank's worker: (True, result) or (False, the traceback as text)."""
    fault = worker._fault
    try:
        if fault is not None:
            faults.before_call(fault, method)
        with tracer.span(method):  # the whole call; its waits are recorded inside it
            result = (True, getattr(worker, method)(*args, **kwargs))
    except BaseException:
        result = (False, traceback.format_exc())
    if fault is not None:
        faults.disarm()
    return result


_turn = threading.local()  # inline backend: how the running rank thread gives up and takes back its turn


@contextlib.contextmanager
def waiting_for_others():
    """Wrap a wait for another rank (a weight-version stamp, a barrier). With one process per rank it does nothing;
    on the inline backend, where ranks are threads of one process taking turns, the others run meanwhile."""
    give = getattr(_turn, "give", None)
    if give is None:
        yield
        return
    give()
    try:
        yield
    except BaseException:
        # An error on its way out (a timeout) needs no turn: if a hung rank holds it, report without it.
        _turn.take(timeout=1.0)
        raise
    _turn.take()
