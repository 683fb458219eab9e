"""Inside a Ray backend rank: the actor that is one rank (scheduler/ray_backend.py starts one per rank).

`rendezvous()` (rank 0: this node's IP and a free port for the group's collective), `start()` (spec.env set before
torch is imported, the core pinning, the worker built), `call()` one group-method call, `stop()` the worker closed
and this process's channel ends and shared segments with it, `watch()` a call that never returns, which Ray fails
when the actor dies.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import socket
import struct
import sys
import time
from typing import Any

import ray

from rlinf_mini.scheduler.backend import RankSpec, Result
from rlinf_mini.scheduler.kernel_queues import KernelQueues, close_transport_resources
from rlinf_mini.scheduler.ray_channel import use_numpy_for_tensors, use_weights_mailbox

NODE_ENV = "RLINF_MINI_RAY_NODE"  # set in every rank: the Ray node id it runs on (stages/sync.py reads it)


def _ifname_of(ip: str) -> str | None:
    """The network interface that holds `ip` (Linux), for gloo/NCCL: they would otherwise pick one by hostname."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == ip:
            return name
    return None


@ray.remote(concurrency_groups={"watch": 1})
class RankActor:
    """One rank. Calls run in the default concurrency group (one at a time, in order); `watch` has its own thread."""

    def __init__(self):
        self.worker = None  # nothing else here: torch is imported in start(), after the environment is set

    def rendezvous(self) -> tuple[str, str]:
        """(this node's IP, a port free on it) for the group's collective (called on rank 0)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, str(s.getsockname()[1])

    def start(self, spec_bytes: bytes, master: tuple[str, str], mailbox: KernelQueues | None) -> tuple[Result, int]:
        # must stay False (tests check that pinning came first): CUDA reads CUDA_VISIBLE_DEVICES when it initializes
        cuda_before_pinning = "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()
        spec: RankSpec = pickle.loads(spec_bytes)  # bytes, so that Ray's unpickling of the arguments imports nothing
        ip, port = master
        env = {**spec.env, "MASTER_ADDR": ip, "MASTER_PORT": port, "LOCAL_RANK": "0",
               NODE_ENV: ray.get_runtime_context().get_node_id()}
        # gloo and NCCL pick an interface by hostname unless told: tell them the one that holds the master's IP
        ifname = _ifname_of(ip)
        if ifname:
            env = {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname, **os.environ, **env}
        os.environ.update(env)
        if spec.cores and set(spec.cores) <= os.sched_getaffinity(0):  # the Cluster counted this machine's cores
            os.sched_setaffinity(0, spec.cores)
        self.rank = spec.rank
        try:
            import torch

            from rlinf_mini.scheduler.collective import TorchDistCollective
            from rlinf_mini.scheduler.worker import build_worker

            use_numpy_for_tensors()
            use_weights_mailbox(mailbox)  # (a KernelQueues unpickles without torch: kernel_queues.py imports none)
            device = torch.device("cuda:0" if spec.gpus else "cpu")
            self.worker = build_worker(spec, device, lambda timeout_s: TorchDistCollective(
                spec.rank, spec.world_size, device, timeout_s))
            self.worker._cuda_before_pinning = cuda_before_pinning
            return (0, spec.rank, True, None), os.getpid()
        except BaseException:
            import traceback

            return (0, spec.rank, False, traceback.format_exc()), os.getpid()

    def call(self, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        from rlinf_mini.scheduler.worker import run_call

        return run_call(self.worker, method, args, kwargs)

    def stop(self) -> None:
        if self.worker is not None:
            worker, self.worker = self.worker, None
            try:
                worker.close()
            finally:  # as a local rank does: its channel ends and shared segments (the actor stays, idle)
                from rlinf_mini.scheduler import codec

                close_transport_resources()
                codec.close_process_resources()

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Never returns: Ray fails this call when the actor dies, and the driver reads the death from it."""
        while True:
            time.sleep(3600)
