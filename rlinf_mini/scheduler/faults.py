"""Fault injection: make one worker fail on purpose, the way real runs fail, to prove the runtime copes.

    RLINF_MINI_FAULT="group=ActorGroup,rank=1,method=run_training,call=2,kind=raise" python -m rlinf_mini.train ...

Each worker process reads RLINF_MINI_FAULT once at start (it inherits the driver's environment). When the worker of
`group` and `rank` (either may be left out: every group / every rank) starts its `call`-th call (1-based, default 1)
of `method`, the fault fires:

    raise   the method raises FaultInjected (an ordinary exception: the driver reports it with the traceback)
    exit    os._exit(3): the process ends without cleanup (exit code 3)
    kill9   the process sends itself SIGKILL (as the OOM killer does)
    segv    the process sends itself SIGSEGV (as a crashing C extension does)
    hang    the method sleeps forever (a deadlock, a stuck simulator, a lost collective)
    nan     the method runs, but `poison(loss)` turns its loss into NaN (the one hook, in stages/actor_core.py)

When RLINF_MINI_FAULT is unset, the worker's command loop pays one `is None` check per call and nothing else.
Tests use this module through the environment variable too, so the same faults can be tried from a shell.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

ENV_VAR = "RLINF_MINI_FAULT"
KINDS = ("raise", "exit", "kill9", "segv", "hang", "nan")


class FaultInjected(RuntimeError):
    """The exception of kind=raise."""


@dataclasses.dataclass
class Fault:
    method: str
    kind: str
    group: str | None = None
    rank: int | None = None
    call: int = 1
    calls_seen: int = 0  # calls of `method` in this process so far


def parse(text: str) -> Fault:
    """'group=G,rank=R,method=M,call=N,kind=K' -> Fault; raises ValueError naming the bad part."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in ("group", "rank", "method", "call", "kind"):
            raise ValueError(f"{ENV_VAR}: cannot read {part!r} (expected group=, rank=, method=, call=, kind=)")
        fields[name] = value
    if "method" not in fields or fields.get("kind") not in KINDS:
        raise ValueError(f"{ENV_VAR}: needs method= and kind= (one of {', '.join(KINDS)}), got {text!r}")
    try:
        rank = int(fields["rank"]) if "rank" in fields else None
        call = int(fields.get("call", "1"))
    except ValueError:
        raise ValueError(f"{ENV_VAR}: rank and call must be integers, got {text!r}") from None
    return Fault(method=fields["method"], kind=fields["kind"], group=fields.get("group"), rank=rank, call=call)


def for_this_worker(group: str, rank: int) -> Fault | None:
    """The fault planned for this worker process, or None (the common case)."""
    text = os.environ.get(ENV_VAR)
    if not text:
        return None
    fault = parse(text)
    if (fault.group is not None and fault.group != group) or (fault.rank is not None and fault.rank != rank):
        return None
    fault.group, fault.rank = group, rank
    return fault


_nan_armed = False  # set by a firing kind=nan fault; read by poison()


def before_call(fault: Fault, method: str) -> None:
    """Called by the worker's command loop before each call when a fault is planned for this process."""
    global _nan_armed
    if method != fault.method:
        return
    fault.calls_seen += 1
    if fault.calls_seen != fault.call:
        return
    where = f"{method}() call {fault.call}"
    # one line, with the wall time, so that a test (or a person) can tell how long the driver took to react
    print(f"[rlmini fault] {fault.group} rank {fault.rank} pid {os.getpid()}: {fault.kind} in {where} "
          f"at t={time.time():.3f}", file=sys.stderr, flush=True)
    if fault.kind == "raise":
        raise FaultInjected(f"injected fault in {where}")
    if fault.kind == "exit":
        os._exit(3)
    if fault.kind == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "segv":
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # Python's faulthandler must not turn it into a traceback
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "nan":
        _nan_armed = True


def poison(loss):
    """The loss, or NaN in its place while a kind=nan fault is firing (only during the planned call)."""
    return loss * float("nan") if _nan_armed else loss


def disarm() -> None:
    """End a kind=nan fault's call: later calls compute real losses again."""
    global _nan_armed
    _nan_armed = False
