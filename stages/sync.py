"""Stage 2 — weight sync: the actor's new weights reach every rollout rank, versioned, at memory speed.

    rollout side (once):   receiver = WeightReceiver(model)          # allocates one shared buffer, binds params to it
                           handle = receiver.handle()                 # (name, size, layout): sent to the actor
    each sync:             sender.send(actor_model, [handles...], version)     # actor rank 0 writes every buffer
                           receiver.wait_for_version(version, timeout)         # each rollout rank checks the stamp

The rollout allocates its buffer once: one shared-memory segment holding every parameter and buffer of its model,
each at a 64-byte-aligned offset, plus a header whose first 8 bytes are the version stamp. On the CPU the rollout's
parameters *are* views into that segment, so the actor's copy lands directly in the weights the rollout infers with
(one memcpy per rollout rank, no serialization, no allocation). On a GPU the rollout copies the segment into its
device parameters after the stamp arrives. The actor writes the data first and the stamp last, so a rollout that sees
stamp v has every byte of version v. Only actor rank 0 sends: data-parallel ranks hold identical weights.

The version is the number of optimizer steps behind the weights. The rollout tags every action with it, so every
trajectory says which weights produced it (`rollout/staleness` in the metrics is actor version minus that tag).

RLinf counterpart: `EmbodiedRunner.update_rollout_weights` calling `actor.sync_model_to_rollout()` and
`rollout.sync_model_from_actor()` together; `rlinf/hybrid_engines/weight_syncer/` (bucket and patch syncers, which
broadcast over NCCL or CUDA IPC). Left out: buckets and sparse patches (a shared buffer needs neither on one machine),
NCCL between machines. Next stage: `stages/rollout.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rlinf_mini.scheduler.shm import SharedSegment
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import waiting_for_others

_ALIGN = 64
_HEADER = 64  # bytes 0..7: int64 version stamp; -1 = nothing written yet


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


def plan_layout(state: dict[str, torch.Tensor]) -> tuple[tuple[TensorSlot, ...], int]:
    """Give each tensor of a state dict an aligned offset after the header; returns (layout, total bytes)."""
    slots, offset = [], _HEADER
    for name, t in state.items():
        slots.append(TensorSlot(name, t.dtype, tuple(t.shape), offset))
        nbytes = t.numel() * t.element_size()
        offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return tuple(slots), offset


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, unwrapping DistributedDataParallel."""
    model = getattr(model, "module", model)
    return dict(model.state_dict(keep_vars=True))


class WeightReceiver:
    """The rollout's side: one shared buffer allocated at init; the model's weights live in (or load from) it."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        weights = _weights(model)
        self.layout, size = plan_layout(weights)
        self.segment = SharedSegment.create(size, tag="weights")
        self._stamp = self.segment.view(torch.int64, (1,), 0)
        self._stamp.fill_(-1)
        self.version = -1
        self._views = {s.name: self.segment.view(s.dtype, s.shape, s.offset) for s in self.layout}
        self.zero_copy = all(t.device.type == "cpu" for t in weights.values())
        for name, t in weights.items():
            self._views[name].copy_(t.detach())
            if self.zero_copy:
                t.data = self._views[name]  # the parameter now aliases the shared buffer

    def handle(self) -> WeightBufferHandle:
        return WeightBufferHandle(self.segment.name, self.segment.size, self.layout)

    def wait_for_version(self, version: int, timeout: float) -> float:
        """Block until the actor has stamped `version`; returns the seconds waited. Raises TimeoutError."""
        start = time.monotonic()
        with span("wait_weights"), waiting_for_others():  # the inline backend runs the actor meanwhile
            self._wait_stamp(version, timeout, start)
        if not self.zero_copy:
            with torch.no_grad(), span("weight_load"):
                for name, t in _weights(self.model).items():
                    t.copy_(self._views[name], non_blocking=True)
        self.version = version
        return time.monotonic() - start

    def _wait_stamp(self, version: int, timeout: float, start: float) -> None:
        while int(self._stamp[0]) != version:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"weight sync: version {version} did not arrive from actor rank 0 within "
                                   f"{timeout:g} s (buffer holds version {int(self._stamp[0])})")
            time.sleep(0.0002)

    def close(self) -> None:
        self._views.clear()
        self._stamp = None
        self.segment.close()


class WeightSender:
    """The actor's side: attaches each rollout buffer once, then copies every tensor into it and stamps it."""

    def __init__(self):
        self._segments: dict[str, SharedSegment] = {}

    def send(self, model: torch.nn.Module, handles: list[WeightBufferHandle], version: int) -> int:
        """Write `model`'s weights into every rollout buffer, then the version stamp. Returns bytes written."""
        weights = _weights(model)
        written = 0
        with torch.no_grad(), span("weight_send"):
            for h in handles:
                seg = self._segments.get(h.segment_name)
                if seg is None:
                    seg = self._segments[h.segment_name] = SharedSegment.attach(h.segment_name, h.size)
                if [s.name for s in h.layout] != list(weights):
                    raise ValueError("weight sync: the rollout's model has different parameters than the actor's "
                                     "(are actor.model and rollout.model the same architecture?)")
                for slot in h.layout:
                    src = weights[slot.name].detach()
                    seg.view(slot.dtype, slot.shape, slot.offset).copy_(src)
                    written += src.numel() * src.element_size()
                seg.view(torch.int64, (1,), 0).fill_(version)  # last: the stamp publishes the complete version
        return written

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
