"""The weight buffer's layout, shared by the CPU and the GPU sync paths (stages/sync.py, stages/sync_gpu.py): a leaf
both import, so neither reaches into the other.

    layout, size = plan_layout(model_weights(model))   # every tensor's aligned offset after a 64-byte header
    WeightBufferHandle(segment_name, size, layout, ...)  # what the actor needs to write one rollout rank's buffer

The header's first int64 is the version stamp (-1: nothing written yet; WRITING while the actor writes), written
last so that a reader who sees a version sees all of it. A reader that copies while the actor may write (async PPO's
rollout, `read_newest`) reads the stamp before and after its copy and keeps the copy only if both agree (a seqlock).
"""


from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_ALIGN = 64
_HEADER = 64  # bytes 0..7: int64 version stamp; -1 = nothing written yet
WRITING = -2  # the stamp while the actor writes a new version (set before the first byte, replaced by it last)


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the segment


@dataclass(frozen=True)
class WeightBufferHandle:
    """What the actor needs to write into one rollout rank's buffer (small and picklable)."""

    segment_name: str
    size: int
    layout: tuple[TensorSlot, ...]
    node: str = ""  # the Ray node id the buffer is on ("" off Ray: the actor's machine)
    mailbox: Any = None  # on Ray: a channel transport reaching the rollout rank from any node (key: segment_name)
    gpu: str = ""  # the rollout's GPU (its UUID) when its weights live on one; "" = the CPU shared-buffer path
    cuda_ipc: bytes = b""  # the rollout's flat device buffer, pickled for CUDA IPC (opened only on that same GPU)


def plan_layout(state: dict[str, torch.Tensor]) -> tuple[tuple[TensorSlot, ...], int]:
    """Give each tensor of a state dict an aligned offset after the header; returns (layout, total bytes)."""
    slots, offset = [], _HEADER
    for name, t in state.items():
        slots.append(TensorSlot(name, t.dtype, tuple(t.shape), offset))
        nbytes = t.numel() * t.element_size()
        offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return tuple(slots), offset


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, unwrapping DistributedDataParallel."""
    model = getattr(model, "module", model)
    return dict(model.state_dict(keep_vars=True))


def wait_for_stamp(stamp: torch.Tensor, version: int, timeout: float, start: float) -> None:
    """Spin until the header's stamp [0] reads `version`, or raise TimeoutError once `timeout` has passed."""
    while int(stamp[0]) != version:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"weight sync: version {version} did not arrive from actor rank 0 within "
                               f"{timeout:g} s (buffer holds version {int(stamp[0])})")
        time.sleep(0.0002)


def read_newest(stamp: torch.Tensor, copy_out: Callable[[], None], min_version: int, timeout: float) -> int:
    """A torn-free read of the newest stamped version, once it is >= min_version: `copy_out` copies the buffer into
    the reader's own weights, and is redone if the stamp moved meanwhile (the actor wrote during the copy). Returns
    the version copied; raises TimeoutError when min_version has not appeared within `timeout`."""
    start = time.monotonic()
    while True:
        before = int(stamp[0])
        if before >= min_version:
            copy_out()
            if int(stamp[0]) == before:
                return before
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"weight sync: version >= {min_version} did not arrive from actor rank 0 within "
                               f"{timeout:g} s (buffer holds version {int(stamp[0])})")
        time.sleep(0.0002)
