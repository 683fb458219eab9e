"""Workers used by the runtime tests (a module, so that spawned processes can import them by name)."""

from __future__ import annotations

import os
import time

import torch

from rlinf_mini.scheduler.worker import Worker


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
                "cuda_before_pinning": self._cuda_before_pinning}

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
