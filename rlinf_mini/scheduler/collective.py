"""Collectives across the ranks of one worker group: the actor's gradient and metric all-reduce.

    self.init_collective(timeout_s)     # in a worker method, once: every rank of the group must call it
    self.all_reduce(t)                  # sum over the group's ranks, in place; returns t

A collective has `all_reduce(t) -> t` (sum, in place) and `close()`. Two kinds:
- `TorchDistCollective` (local and ray backends, one process per rank): torch.distributed, gloo on the CPU and NCCL
  on a GPU, with the rendezvous the backend put in the environment: a file store on one machine (local:
  RLINF_MINI_STORE_FILE), a TCP store at rank 0 across machines (ray: MASTER_ADDR / MASTER_PORT). The local
  backend's CPU ranks sum their float and int64 tensors through shared memory instead (cluster.all_reduce 'shm',
  shm_all_reduce.py: a fraction of gloo's loopback round trips), gloo kept for the rest and the barriers.
  Ranks that share a GPU (collocated, or more devices than GPUs) use gloo over their CUDA tensors, since NCCL refuses
  two ranks on one GPU (`devices.collective_backend`); a timed-out all-reduce raises `CollectiveTimeout`.
- `rlinf_mini.scheduler.inline.InlineCollective` (inline backend, ranks are threads of one process).
With two ranks every kind gives bitwise the same sums (x + y); with more, the order of the additions may differ.

RLinf counterpart: `rlinf/scheduler/collective/` (its own collective groups over Ray actors); the actor's gradients
are reduced by FSDP there. Left out: broadcast, gather, send/recv (channels carry data between groups here).
"""

from __future__ import annotations

import datetime


class CollectiveTimeout(TimeoutError):
    """An all-reduce (NCCL or gloo) did not complete within cluster.timeout_s: a rank is missing or stuck."""


class TorchDistCollective:
    _shm = None  # the shared-memory sum (cluster.all_reduce 'shm'), where it applies

    def __init__(self, rank: int, world_size: int, device, timeout_s: float):
        import os

        import torch
        import torch.distributed as dist

        from rlinf_mini.scheduler import devices, shm_all_reduce

        self._dist, self.timeout_s = dist, timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        store_file = os.environ.get("RLINF_MINI_STORE_FILE")  # local: a file store on this machine (LocalBackend)
        if store_file:
            store = dist.FileStore(store_file, world_size)
            store.set_timeout(timeout)
        else:  # ray: a TCP store at rank 0's node (its actor picked the port)
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                  is_master=rank == 0, timeout=timeout)
        if device.type != "cuda":
            self.backend, self.why = "gloo", "CPU tensors"
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
            if store_file and os.environ.get("RLINF_MINI_ALL_REDUCE") == "shm" and shm_all_reduce.supported():
                self.backend, self.why = "shm", "CPU ranks on one machine (cluster.all_reduce)"
                self._shm = shm_all_reduce.ShmAllReduce(rank, world_size, os.path.basename(store_file), timeout_s,
                                                        dist.barrier)
            return
        torch.cuda.set_device(device)
        # Which GPU each rank is on is known only to that rank (its CUDA_VISIBLE_DEVICES, set by the Cluster):
        # exchange it through the rendezvous store, then pick the backend as --explain does (devices.py).
        store.set(f"gpus/{rank}", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        rank_gpus = [tuple(store.get(f"gpus/{r}").decode().split(",")) for r in range(world_size)]
        self.backend, self.why = devices.collective_backend(rank_gpus)
        if self.backend == "nccl":
            # Blocking wait: a collective that times out raises in this thread (reported below) instead of the
            # watchdog aborting the process, which the driver could only report as "died with signal SIGABRT".
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, timeout=timeout,
                                    device_id=device)
        else:  # ranks share a GPU: gloo all-reduces CUDA tensors (staged through host memory)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)

    def all_reduce(self, t):
        if self._shm is not None and self._shm.accepts(t):
            return self._shm.all_reduce(t)
        try:
            self._dist.all_reduce(t)
        except RuntimeError as e:  # DistBackendError is a RuntimeError
            text = str(e)
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise CollectiveTimeout(f"{self.backend} all_reduce of {tuple(t.shape)} did not complete within "
                                        f"{self.timeout_s:g} s (cluster.timeout_s): another rank of the group is "
                                        f"missing or stuck; NCCL_DEBUG=INFO says more") from e
            raise
        return t

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
