"""Collectives across the ranks of one worker group: the actor's gradient and metric all-reduce.

    self.init_collective(timeout_s)     # in a worker method, once: every rank of the group must call it
    self.all_reduce(t)                  # sum over the group's ranks, in place; returns t

A collective has `all_reduce(t) -> t` (sum, in place) and `close()`. Two kinds:
- `TorchDistCollective` (local and ray backends, one process per rank): torch.distributed, gloo on the CPU and NCCL
  on a GPU, with the rendezvous (MASTER_ADDR / MASTER_PORT, RANK, WORLD_SIZE) the backend put in the environment.
- `rlinf_mini.scheduler.inline.InlineCollective` (inline backend, ranks are threads of one process).
With two ranks every kind gives bitwise the same sums (x + y); with more, the order of the additions may differ.

RLinf counterpart: `rlinf/scheduler/collective/` (its own collective groups over Ray actors); the actor's gradients
are reduced by FSDP there. Left out: broadcast, gather, send/recv (channels carry data between groups here).
"""

from __future__ import annotations

import datetime


class TorchDistCollective:
    def __init__(self, rank: int, world_size: int, device, timeout_s: float):
        import torch.distributed as dist

        self._dist = dist
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))

    def all_reduce(self, t):
        self._dist.all_reduce(t)
        return t

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
