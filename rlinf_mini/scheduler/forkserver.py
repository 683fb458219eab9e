"""The local backend's fork server: one per driver process, it imported torch once, and every rank is forked
from it.

Each rank is a process forked from this server, one per driver, which imported torch once
(`multiprocessing`'s "forkserver" start method, the default from Python 3.14 on Linux), so a rank starts without
importing torch; the plain path, cluster.rank_start 'spawn' (local.py), starts each rank as a fresh interpreter that
imports it itself (`python -m benchmarks --only backends`, row "local: rank start", and docs/performance.md).
The server is a fresh interpreter, not a copy of the driver: it has no threads, no CUDA context and none of the
driver's state, so the fork is safe. Under `python -m rlinf_mini.train` it is a fork of the driver instead, made before
anything computes (`start_fork_server_here`: the run does not import torch twice). Ranks are named "<group>:<rank>"
in `ps -o comm` and top, the server SERVER_NAME; their command line is the server's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading

SERVER_NAME = "rlmini-forksrv"  # the fork server's process name in `ps -o comm` and top; a rank's is "<group>:<rank>"

# What the fork server imports once, so that no rank pays for it: torch (most of a rank's start), torch._dynamo
# (a torch optimizer imports it at its first add_param_group, in every actor rank otherwise) and the
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
    process goes on: a run's ranks start without importing torch again (docs/performance.md has the saving).

    Call it before this process runs any torch op (`python -m rlinf_mini.train` does, once the config is read, before
    RunPlan builds the model): libgomp's thread pool, made at the first parallel op, does not survive a fork
    (the child of a process that ran one matmul hangs at its own first). The rest is checked here: Linux,
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
        alive_r, alive_w = os.pipe()  # the server ends when the driver, alive_w's one holder, is gone (ranks close it)
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
    left to end at its lifeline's end-of-file, its interpreter teardown (torch loaded) delayed the exit."""
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



def _set_process_name(name: str) -> None:
    """Name this process in `ps -o comm` and top (Linux keeps 15 bytes); its command line stays what it was (the
    driver's, for a fork of the driver)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
