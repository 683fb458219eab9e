"""The inline backend: every rank is a thread of the driver process, so `breakpoint()` in any worker method stops
there, and a traceback points at the real line. For debugging; `local` is the fast one.

    python -m rlinf_mini.train --config configs/embodied.yaml --cluster.backend inline

Ranks take turns. A rank thread holds the one turn while it runs Python, and gives it up only where it waits for
another rank: a channel get or put that would block, a collective, a weight-version stamp (`waiting_for_others` in
worker.py). Why threads that take turns, and not coroutines or free threads:
- coroutines would make every stage `async` and every wait an `await`: the stage code would read differently from
  the code the other backends run; threads run the very same methods;
- free threads would share the process's global state: the torch / numpy / python random generators (the actor seeds
  torch and builds its model, on every rank at once), torch's thread count, the tracer's idea of who is recording.
  With turns, each rank keeps its own generator states, swapped in when it takes the turn and out when it gives it
  up, so a run is bitwise the same as with one process per rank (local), and a debugger stopped in one rank sees
  a world where nothing else moves;
- the env <-> rollout pipeline still pipelines: while the env steps stage k the rollout has stage k+1's observations
  and runs as soon as the env waits; the two take turns instead of overlapping on two cores.
Channels are in-process queues (no pickling, no shared memory); an item's tensors are cloned on put, as a process
boundary would copy them, but for buffers from `Channel.empty`, which go as they are (as local sends them).
Group-call arguments and results are passed by reference. The actor's collective is an in-process all-reduce over
the group's threads (`InlineCollective`): with two ranks its sums are bitwise gloo's.
Timeouts, error reports (group, rank, traceback) and Ctrl-C behave as with `local`, but for a hung rank: it keeps the
turn, so no other rank runs; the driver's timeout then names the rank that holds the turn and its method, and the
rank is abandoned (a thread cannot be killed). Faults that end a process (kill9, exit, segv) would end the driver.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Hashable
from typing import Any

from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.backend import Backend, GroupRanks, RankSpec, Result
from rlinf_mini.scheduler.worker import POLL_S, _turn, build_worker, run_call, waiting_for_others


class _Turn:
    """One rank thread's side of the turn: its own random generator states and torch thread count."""

    def __init__(self, backend: InlineBackend, who: str, num_threads: int):
        import numpy
        import torch

        self.backend, self.lock, self.who, self.num_threads = backend, backend.turn, who, num_threads
        self.held = False
        self.method = "__init__"  # the call this rank runs (for the driver's timeout message)
        self.torch_state = torch.Generator().get_state()  # what a freshly started process would have
        self.numpy_state = numpy.random.RandomState().get_state()
        self.python_state = random.Random().getstate()

    def take(self, timeout: float = -1) -> None:
        """Wait for the turn (at most `timeout` s, -1: for ever), then swap this rank's generators in. Past the
        timeout the thread goes on without the turn (only an error on its way out asks for a timeout)."""
        import numpy
        import torch

        self.held = self.lock.acquire(timeout=timeout)
        if not self.held:
            return
        self.backend.holder = (self.who, self.method, time.monotonic())
        torch.set_rng_state(self.torch_state)
        numpy.random.set_state(self.numpy_state)
        random.setstate(self.python_state)
        if self.num_threads and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)

    def give(self) -> None:
        import numpy
        import torch

        if not self.held:
            return
        self.held = False
        self.backend.holder = None  # before the release: a holder that is set is the one running now
        self.torch_state = torch.get_rng_state()
        self.numpy_state = numpy.random.get_state()
        self.python_state = random.getstate()
        self.lock.release()


class InlineBackend(Backend):
    name = "inline"

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.turn = threading.Lock()  # held by the one rank thread that runs
        self.holder: tuple[str, str, float] | None = None  # (group and rank, method, since when) of the last taker
        self.transports: list[InlineQueues] = []

    def launch(self, group, specs: list[RankSpec]) -> InlineRanks:
        return InlineRanks(self, group.name, specs)

    def channel_transport(self, name: str, maxsize: int, default_timeout: float) -> InlineQueues:
        if any(t.name == name for t in self.transports):
            raise ValueError(f"channel {name!r} already exists")
        transport = InlineQueues(name, maxsize)
        self.transports.append(transport)
        return transport

    def wait_note(self) -> str:
        """Who holds the turn, for a driver's timeout: with turns, one hung rank stops every other."""
        holder = self.holder
        if holder is None or not self.turn.locked():
            return ""
        who, method, since = holder
        return f"; on the inline backend {who} has held the turn for {time.monotonic() - since:.0f} s, in {method}()"

    def hung_for(self) -> float:
        """Seconds the rank running now has held the turn (0 when no rank holds it)."""
        holder = self.holder
        return time.monotonic() - holder[2] if holder is not None and self.turn.locked() else 0.0

    def shutdown(self) -> None:
        for transport in self.transports:
            transport.closed = True  # a rank blocked in a get or put sees it within a slice and stops


class InlineRanks(GroupRanks):
    def __init__(self, backend: InlineBackend, name: str, specs: list[RankSpec]):
        self.backend, self.name = backend, name
        self._results: queue.Queue[Result] = queue.Queue()
        self._commands: list[queue.Queue] = [queue.Queue() for _ in specs]
        self._stopping = False
        world = len(specs)
        self.collective = InlineCollective(world, backend.timeout_s) if world > 1 else None
        self.pids = [os.getpid()] * world
        self.threads = [threading.Thread(target=self._rank_main, args=(spec,), name=f"{name}:{spec.rank}",
                                         daemon=True) for spec in specs]
        for t in self.threads:
            t.start()

    def _rank_main(self, spec: RankSpec) -> None:
        import torch

        turn = _Turn(self.backend, f"{spec.group_name} rank {spec.rank}", spec.threads)
        _turn.give, _turn.take = turn.give, turn.take  # for waiting_for_others(), in this thread only
        tracer.set_thread_identity(spec.group_name, spec.rank)
        # a GPU rank computes on the driver's GPU of its first device (spec.gpus may name it by UUID)
        device = torch.device(f"cuda:{spec.devices[0] % torch.cuda.device_count()}" if spec.gpus else "cpu")
        turn.take()
        try:
            worker = build_worker(spec, device, lambda timeout_s: _Member(self.collective, spec.rank))
            worker._cuda_before_pinning = False  # nothing to pin: the driver's process
            ready: Result = (0, spec.rank, True, None)
        except BaseException:
            import traceback

            worker, ready = None, (0, spec.rank, False, traceback.format_exc())
        finally:
            turn.give()
        self._results.put(ready)
        if worker is None:
            return
        while True:
            command = self._commands[spec.rank].get()
            if command is None:  # the stop message
                break
            call_id, method, args, kwargs = command
            turn.method = method
            turn.take()
            try:
                ok, value = run_call(worker, method, args, kwargs)
            finally:
                turn.give()
            self._results.put((call_id, spec.rank, ok, value))
        turn.take()
        try:
            worker.close()
        finally:
            turn.give()

    def submit(self, ranks: list[int], call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        for r in ranks:
            self._commands[r].put((call_id, method, args, kwargs))

    def results(self, block_s: float = 0.0) -> list[Result]:
        out = []
        try:
            out.append(self._results.get(timeout=block_s) if block_s else self._results.get_nowait())
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            return out

    def exit_status(self, rank: int) -> str | None:
        if self._stopping or self.threads[rank].is_alive():
            return None
        return "its thread ending (its constructor failed?)"

    def request_stop(self) -> None:
        self._stopping = True
        for commands in self._commands:
            commands.put(None)

    def finish_stop(self, deadline: float) -> None:
        # A rank still running at the deadline (hung, or in a long call) cannot be killed: it is a daemon thread,
        # abandoned. One that has held the turn for cluster.timeout_s is hung by the measure the driver's own timeout
        # uses (no other rank, so no call the driver waits on, has run for that long): the grace would only be
        # waited out, since every other rank needs the turn to close, so it is not waited for.
        while any(t.is_alive() for t in self.threads) and time.monotonic() < deadline:
            if self.backend.hung_for() >= self.backend.timeout_s:
                return
            next(t for t in self.threads if t.is_alive()).join(POLL_S)

    def kill(self) -> None:
        self.request_stop()


# ---------------------------------------------------------------------------------------------------------------------
# The collective: an all-reduce over the threads of one group


class InlineCollective:
    """All-reduce over the rank threads of one group: every rank adds the slots in rank order (x0 + x1 + ...), so
    every rank gets bitwise the same sum; with two ranks it is bitwise gloo's x0 + x1."""

    def __init__(self, world_size: int, timeout_s: float):
        self.barrier = threading.Barrier(world_size)
        self.slots: list[Any] = [None] * world_size
        self.timeout_s = timeout_s

    def _wait(self) -> None:
        with waiting_for_others():
            try:
                self.barrier.wait(self.timeout_s)
            except threading.BrokenBarrierError:
                raise TimeoutError(f"inline all-reduce: not every rank arrived within {self.timeout_s:g} s") from None

    def all_reduce(self, rank: int, t):
        self.slots[rank] = t
        self._wait()  # every rank has put its tensor
        total = self.slots[0].clone()
        for other in self.slots[1:]:
            total += other
        self._wait()  # every rank has read every slot: they may change now
        t.copy_(total)
        return t


class _Member:
    """One rank's handle on its group's InlineCollective (the collective interface: all_reduce, close)."""

    def __init__(self, collective: InlineCollective, rank: int):
        self.collective, self.rank = collective, rank

    def all_reduce(self, t):
        return self.collective.all_reduce(self.rank, t)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------------
# Channels: in-process queues


def _copy(item: Any) -> Any:
    """The item with its tensors cloned (what crossing a process boundary would give the consumer), but for buffers
    from Channel.empty: those are handed over as they are, as the local backend hands over their shared segment."""
    import torch

    if isinstance(item, torch.Tensor):
        from rlinf_mini.scheduler import codec

        return item if codec.any_lent() and codec.hand_over(item) is not None else item.detach().clone()
    if isinstance(item, dict):
        return {k: _copy(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(_copy(v) for v in item)
    return item


class _Expired(Exception):
    """A channel wait reached its deadline (turned into the transport's False outside the wait)."""


class InlineQueues:
    """The inline channel transport: one queue.Queue per key, in the driver's process."""

    def __init__(self, name: str, maxsize: int):
        self.name, self.maxsize = name, maxsize
        self.queues: dict[Hashable, queue.Queue] = {}
        self.lock = threading.Lock()
        self.closed = False

    def _queue(self, key: Hashable) -> queue.Queue:
        with self.lock:
            q = self.queues.get(key)
            if q is None:
                q = self.queues[key] = queue.Queue(self.maxsize)
            return q

    def _blocking(self, op, wait_name: str, deadline: float, check, slice_s: float) -> bool:
        """Retry `op(timeout)` in slices until it succeeds (True) or the deadline passes (False); the rank gives up
        its turn while it waits."""
        try:
            with tracer.span(wait_name), waiting_for_others():
                while True:
                    if self.closed:
                        raise ConnectionError(f"channel {self.name!r}: the run is shutting down")
                    if check is not None:
                        check()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _Expired  # an error on its way out: reported even while a hung rank holds the turn
                    try:
                        op(min(left, slice_s))
                        return True
                    except (queue.Full, queue.Empty):
                        continue
        except _Expired:
            return False

    def put(self, key: Hashable, item: Any, deadline: float, check, slice_s: float) -> bool:
        q, item = self._queue(key), _copy(item)
        try:
            q.put_nowait(item)
            return True
        except queue.Full:
            return self._blocking(lambda t: q.put(item, timeout=t), "wait_put", deadline, check, slice_s)

    def get(self, key: Hashable, deadline: float, check, slice_s: float) -> tuple[bool, Any]:
        q, got = self._queue(key), []
        try:
            return True, q.get_nowait()
        except queue.Empty:
            ok = self._blocking(lambda t: got.append(q.get(timeout=t)), "wait_get", deadline, check, slice_s)
            return ok, (got[0] if ok else None)

    def qsize(self, key: Hashable) -> int:
        return self._queue(key).qsize()

    def full_reason(self, key: Hashable) -> str:
        return "is its consumer alive and reading?"
