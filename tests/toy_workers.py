"""Workers used by the runtime tests (a module, so that spawned processes can import them by name)."""

from __future__ import annotations

import os
import time

import torch

from rlinf_mini.scheduler.worker import Worker

LENT_BATCH = (16, 3, 64, 64)  # 196 KB of uint8: over the codec's SHM_MIN_BYTES, so local lends a shared segment


def batch_pattern(i: int) -> torch.Tensor:
    """uint8 LENT_BATCH: a different byte pattern for every i."""
    n = LENT_BATCH[0] * LENT_BATCH[1] * LENT_BATCH[2] * LENT_BATCH[3]
    return ((torch.arange(n) * (i + 1) + i) % 251).to(torch.uint8).view(LENT_BATCH)


def _ray_gpu_ids() -> list[str] | None:
    """The GPUs Ray assigned this process (a Ray rank actor), or None outside Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return [str(i) for i in ray.get_gpu_ids()]


class EchoWorker(Worker):
    def __init__(self, cfg, tag: str = ""):
        super().__init__(cfg)
        self.tag = tag
        self.calls = 0

    def info(self) -> dict:
        self.calls += 1
        return {"rank": self._rank, "world_size": self._world_size, "group": self._group_name, "tag": self.tag,
                "cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "calls": self.calls, "pid": os.getpid(),
                "cuda_before_pinning": self._cuda_before_pinning, "ray_gpu_ids": _ray_gpu_ids()}

    def add(self, a, b=0):
        return a + b + self._rank

    def mirror(self, text: str) -> tuple[int, str]:
        return self._rank, text[::-1]

    def fail(self, rank: int):
        if self._rank == rank:
            raise ValueError(f"planned failure on rank {rank}")
        return "ok"

    def sleep(self, seconds: float):
        time.sleep(seconds)
        return seconds

    def produce(self, channel, items: list, key):
        for item in items:
            channel.put(item, key=key)
        return len(items)

    def consume(self, channel, n: int, key, timeout: float | None = None):
        return [channel.get(key=key, timeout=timeout) for _ in range(n)]

    def produce_in_place(self, channel, n: int, key) -> list[str | None]:
        """n batches, batch i built as batch_pattern(i) in a channel.empty() buffer and put without a copy; returns
        the shared segment each was built in."""
        from rlinf_mini.scheduler import codec

        names = []
        for i in range(n):
            buf = channel.empty(LENT_BATCH, torch.uint8)
            buf.copy_(batch_pattern(i))
            names.append(codec.shared_segment_of(buf))
            channel.put({"obs": buf, "i": i}, key=key)
        return names

    def unpicklable(self):
        return lambda: None  # a lambda cannot be pickled back to the driver

    def draw(self) -> tuple:
        """One number from each global generator a worker may use (for the checkpoint RNG test)."""
        import random

        import numpy as np

        return random.random(), float(np.random.rand()), float(torch.rand(1))

    def exit_hard(self, code: int):
        os._exit(code)


class BrokenWorker(Worker):
    def __init__(self, cfg):
        super().__init__(cfg)
        raise RuntimeError("constructor failed on purpose")

    def info(self):
        return None


class KillsItselfWhilePickled:
    """A result whose pickling kills the process that pickles it (a worker dying halfway through writing a result)."""

    def __reduce__(self):
        os.kill(os.getpid(), 9)


class DebugWorker(Worker):
    def stop_here(self, x: int) -> int:
        y = x + self._rank
        breakpoint()  # the inline backend runs this in the driver's process: a debugger stops here
        return y

    def die_while_returning(self):
        return KillsItselfWhilePickled()
