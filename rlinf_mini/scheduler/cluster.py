"""Cluster: the devices of this machine, and the processes started on them.

    cluster = Cluster(cfg.cluster)     # cfg.cluster.num_devices devices: GPUs if visible, else shares of the CPU
    ...                                # WorkerGroup.launch(cluster, ...) calls cluster.allocate() once per rank
    cluster.shutdown()                 # stops every group, the channel server, and removes the run's shared memory

A process placed on GPU device d starts with CUDA_VISIBLE_DEVICES set to the d-th entry of the driver's own
CUDA_VISIBLE_DEVICES (index or UUID, as the user gave it), so inside it the GPU is cuda:0 (RLinf binds GPUs the same
way, through environment variables, not Ray resources); when the placement names more devices than there are GPUs,
device d uses GPU d mod the GPU count (scheduler/devices.py decides). On a machine without GPUs, the CPU cores are split
evenly over `cluster.num_devices` virtual devices; a process placed on virtual device d is pinned to that device's
cores (sched_setaffinity) and gets as many torch threads, set before torch is imported in it. So the same YAML runs
on a laptop and on a GPU box.

RLinf counterpart: `rlinf/scheduler/cluster/cluster.py::Cluster` (a Ray-based singleton with node probes and manager
actors). Left out: multiple nodes, node groups, Ray.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
import socket
import time
from typing import Any

import torch
import torch.multiprocessing

from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler import devices, shm
from rlinf_mini.scheduler.channel import ChannelServer
from rlinf_mini.scheduler.worker import WorkerDiedError, worker_main


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """Set environment variables around a spawn: the child process inherits the environment at exec time."""
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self.num_gpus = torch.cuda.device_count()
        self.device_type = "cuda" if self.num_gpus else "cpu"
        self.visible_gpus = devices.visible_gpus(os.environ, self.num_gpus)  # the driver's GPUs, as the user named them
        self.num_devices = devices.resolve_num_devices(cfg.num_devices, self.num_gpus)  # -1: every visible GPU
        self.timeout_s = cfg.timeout_s
        self.run_id = f"{os.getpid()}{secrets.token_hex(2)}"
        self.mp_context = torch.multiprocessing.get_context("spawn")
        self.channel_server = ChannelServer()
        self.groups: list = []
        self._cores = sorted(os.sched_getaffinity(0))
        self._closed = False
        os.environ["RLINF_MINI_RUN_ID"] = self.run_id  # the driver's own channel segments carry the run id too
        atexit.register(self.shutdown)

    def device_cores(self, device: int) -> list[int]:
        """The CPU cores of virtual device `device`: an even share, or one shared core when devices outnumber cores."""
        n, d = len(self._cores), self.num_devices
        if d >= n:
            return [self._cores[device % n]]
        return self._cores[device * n // d : (device + 1) * n // d]

    def allocate(self, group, placement, cmd_pipe, result_pipe) -> Any:
        """Start the process of one rank of `group` on `placement.devices`."""
        if not self.groups or self.groups[-1] is not group:
            self.groups.append(group)
            group._master_port = _free_port()  # rendezvous of the group's torch.distributed process group
        env = {
            "RANK": str(placement.rank),
            "WORLD_SIZE": str(group.world_size),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(group._master_port),
            "RLINF_MINI_GROUP": group.name,
            "RLINF_MINI_RUN_ID": self.run_id,
        }
        cores = None
        if self.device_type == "cuda":
            env |= devices.rank_device_env(placement.devices, self.num_devices, self.visible_gpus)
        else:
            cores = sorted({c for d in placement.devices for c in self.device_cores(d)})
            env |= {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(len(cores)), "MKL_NUM_THREADS": str(len(cores))}
        # OpenMP threads spin after each parallel region by default; with several processes sharing cores that
        # spinning starves the others (a 400 KB copy measured 8 ms instead of 30 us). Passive threads sleep instead.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        proc = self.mp_context.Process(
            target=worker_main,
            args=(group.cls.__module__, group.cls.__qualname__, group.cfg, group.args, cores, cmd_pipe, result_pipe),
            name=f"{group.name}:{placement.rank}",
            daemon=True,
        )
        with _environ(env):
            proc.start()
        return proc

    def check_workers(self) -> None:
        """Raise if any worker process of any group has exited (a worker only exits when told to), or if any pending
        call of any group failed."""
        for group in self.groups:
            if group._closed:
                continue
            for rank, proc in enumerate(group.procs):
                if proc.exitcode is not None:
                    group._drain()  # a constructor failure carries a traceback: raise that instead
                    code = proc.exitcode
                    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                    raise WorkerDiedError(f"{group.name} rank {rank} (pid {proc.pid}) died with {how}")
        for group in self.groups:  # a call that failed in another group ends this wait too
            if not group._closed:
                group._drain()
                group._raise_failed_call()

    def kill_now(self) -> None:
        """The second Ctrl-C: SIGKILL every worker at once and remove the run's shared memory (no grace period)."""
        for group in self.groups:
            for proc in group.procs:
                if proc.exitcode is None:
                    with contextlib.suppress(OSError):
                        os.kill(proc.pid, signal.SIGKILL)
        shm.sweep(self.run_id)

    def shutdown(self) -> None:
        """Stop every worker group, the channel server, and remove the run's shared memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # All groups stop together, so a worker stuck in a channel get costs one grace period, not one per group.
        for group in self.groups:
            group.request_stop()
        deadline = time.monotonic() + 3.0
        for group in self.groups:
            group.finish_stop(deadline)
        self.channel_server.close()
        from rlinf_mini.scheduler.channel import close_process_resources

        close_process_resources()
        shm.sweep(self.run_id)
        if os.environ.get("RLINF_MINI_RUN_ID") == self.run_id:
            del os.environ["RLINF_MINI_RUN_ID"]
        atexit.unregister(self.shutdown)
