"""The all-reduce of CPU ranks on one machine through a shared-memory segment (cluster.all_reduce: 'shm').

gloo sends a tensor over loopback TCP and wakes its own threads: on these 2-core machines one all-reduce of the MLP's
gradients (80k floats, 320 KB) takes ~1.6 ms and even a 2-element one ~0.6 ms, while the forward, backward and Adam
step it sits between take ~1.7 ms. Here every rank copies its tensor into its slot of a segment, posts the call's
number, waits until every rank has posted it, and sums the slots in rank order: ~0.1 ms, two memory copies and the
additions (benchmarks/backends.py measures both).

    segment: [W] sync words, one per 64-byte line (rank r's: the number of the last call it posted)
             [2][W] slots of `slot` bytes (call k uses buffer k % 2)

Why two buffers are enough: rank r writes buffer k % 2 at call k only after it saw every rank post k - 1, and a
rank posts k - 1 only after it finished reading call k - 2's buffer (the same one). Why the order is safe: on x86-64
a store is never seen before an earlier store of the same core, so a rank that sees a peer's call number also sees
the slot that peer wrote before it; elsewhere (ARM's weaker ordering) the collective stays on gloo.
The sums are the slots added in rank order on every rank: with two ranks bitwise gloo's (x + y), with more the order
of the additions may differ from gloo's. A slot too small for a call grows the segment (every rank makes the same
call with the same shape, so every rank grows at the same call; a gloo barrier orders the creation and the attach).
Waits spin for SPIN_S, then sleep in short steps, and end in CollectiveTimeout after timeout_s.
The segments are named after the group's rendezvous file, so the run's sweep removes them whatever happens.
"""

from __future__ import annotations

import platform
import time

import numpy as np
import torch

from rlinf_mini.scheduler import shm

SPIN_S = 200e-6
SLEEP_S = 50e-6
LINE = 64  # bytes: one sync word per cache line, so a rank's posts do not invalidate its peers' lines


def supported() -> bool:
    """x86-64 only: the store order the sync words rely on (module docstring)."""
    return platform.machine().lower() in ("x86_64", "amd64")


class ShmAllReduce:
    def __init__(self, rank: int, world_size: int, base_name: str, timeout_s: float, barrier):
        """`base_name`: unique to the group in this run (its rendezvous file's name); `barrier()`: the group's gloo
        barrier, for the (rare) growth of the segment."""
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.base_name, self.barrier = base_name, barrier
        self.calls = 0  # calls completed by this rank
        self.generation = 0
        self.segment: shm.SharedSegment | None = None
        self.slot = 0  # bytes per slot of the current segment

    def _grow(self, nbytes: int) -> None:
        slot = max(4096, -(-2 * nbytes // LINE) * LINE)  # twice the need, whole lines: few regrowths
        size = LINE * self.world_size + 2 * self.world_size * slot
        name = f"{self.base_name}_ar{self.generation}"
        self.generation += 1
        new = shm.SharedSegment(name, size, create=True) if self.rank == 0 else None
        self.barrier()  # rank 0 made it (zeroed: fallocate) before the others open it
        if new is None:
            new = shm.SharedSegment.attach(name, size)
        if self.segment is not None:  # every rank is past the last call on it (the barrier)
            self.posted = None  # a live numpy view would keep the old mapping
            self.segment.close()
        self.segment, self.slot = new, slot
        # [W] call numbers posted (column 0 of one line per rank); numpy: a plain 8-byte load/store, no torch dispatch
        self.posted = np.frombuffer(new._mmap, dtype=np.int64, count=self.world_size * (LINE // 8)).reshape(
            self.world_size, LINE // 8)[:, 0]
        self.posted[self.rank] = self.calls

    def _slot(self, buffer: int, rank: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        offset = LINE * self.world_size + (buffer * self.world_size + rank) * self.slot
        return self.segment.view(dtype, (numel,), offset)

    @staticmethod
    def accepts(t: torch.Tensor) -> bool:
        """CPU float and int64 tensors (what the actors reduce); anything else goes to gloo."""
        return t.device.type == "cpu" and (t.is_floating_point() or t.dtype == torch.int64)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` (a CPU tensor) over the ranks, in place; returns t."""
        if t.numel() == 0:  # nothing to sum (every rank has the same shape, so every rank skips this call)
            return t
        nbytes = t.numel() * t.element_size()
        if self.segment is None or nbytes > self.slot:
            self._grow(nbytes)
        call = self.calls + 1
        buffer = call % 2
        self._slot(buffer, self.rank, t.dtype, t.numel()).copy_(t.reshape(-1))
        self.posted[self.rank] = call  # after the copy: a peer that sees `call` sees the slot (x86-64 store order)
        self._wait_for(call, t)
        slots = [self._slot(buffer, r, t.dtype, t.numel()) for r in range(self.world_size)]
        total = slots[0] + slots[1] if self.world_size > 1 else slots[0].clone()
        for s in slots[2:]:
            total += s
        t.copy_(total.view_as(t))
        self.calls = call
        return t

    def _wait_for(self, call: int, t: torch.Tensor) -> None:
        start = time.perf_counter()
        while self.posted.min() < call:
            waited = time.perf_counter() - start
            if waited > SPIN_S:
                if waited > self.timeout_s:
                    from rlinf_mini.scheduler.collective import CollectiveTimeout

                    missing = [r for r in range(self.world_size) if self.posted[r] < call]
                    raise CollectiveTimeout(f"shm all_reduce of {tuple(t.shape)} did not complete within "
                                            f"{self.timeout_s:g} s (cluster.timeout_s): rank(s) {missing} of the "
                                            f"group never reached call {call}")
                time.sleep(SLEEP_S)

    def close(self) -> None:
        if self.segment is not None:
            self.posted = None
            self.segment.close()
            self.segment = None
