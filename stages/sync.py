"""Stage 2 — weight sync: the actor's new weights reach every rollout rank, versioned, at memory speed.

    rollout side (once):   receiver = WeightReceiver(model)          # allocates one shared buffer, binds params to it
                           handle = receiver.handle()                 # (name, size, layout): sent to the actor
    each sync:             sender.send(actor_model, [handles...], version)     # actor rank 0 writes every buffer
                           receiver.wait_for_version(version, timeout)         # each rollout rank checks the stamp

The rollout allocates its buffer once: one shared-memory segment holding every parameter and buffer of its model,
each at a 64-byte-aligned offset, plus a header whose first 8 bytes are the version stamp. On the CPU the rollout's
parameters *are* views into that segment, so the actor's copy lands directly in the weights the rollout infers with
(one memcpy per rollout rank, no serialization, no allocation). On a GPU (`GpuWeightReceiver`) the parameters are
views of one flat device buffer: actor rank 0 on the same GPU writes it by CUDA IPC, device to device; from another
GPU it writes the pinned segment and the rollout loads it with one H2D copy. The actor writes the data first (and
waits for the device) and the stamp last, so a rollout that sees stamp v has every byte of version v. Only actor
rank 0 sends: data-parallel ranks hold identical weights.

The version is the number of optimizer steps behind the weights. The rollout tags every action with it, so every
trajectory says which weights produced it (`rollout/staleness` in the metrics is actor version minus that tag).

RLinf counterpart: `EmbodiedRunner.update_rollout_weights` calling `actor.sync_model_to_rollout()` and
`rollout.sync_model_from_actor()` together; `rlinf/hybrid_engines/weight_syncer/` (bucket and patch syncers, which
broadcast over NCCL or CUDA IPC). Left out: buckets and sparse patches (a shared buffer needs neither on one machine),
an NCCL broadcast to another GPU (the pinned host copy stands in), NCCL between machines. Next stage:
`stages/rollout.py`.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers CUDA IPC with ForkingPickler, for the rollout's buffer)

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
        self._gpu = GpuSender()

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
                if h.gpu:  # the rollout's weights are on a GPU: a device path below (CUDA IPC or pinned host)
                    written += self._gpu.send(weights, h, seg, version)
                    continue
                for slot in h.layout:
                    src = weights[slot.name].detach()
                    seg.view(slot.dtype, slot.shape, slot.offset).copy_(src)
                    written += src.numel() * src.element_size()
                seg.view(torch.int64, (1,), 0).fill_(version)  # last: the stamp publishes the complete version
        return written

    def close(self) -> None:
        self._gpu.close()
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()


def make_weight_receiver(model: torch.nn.Module) -> WeightReceiver | GpuWeightReceiver:
    """The receiver for where the rollout's model lives: the shared buffer on the CPU, a device buffer on a GPU."""
    if all(t.device.type == "cpu" for t in _weights(model).values()):
        return WeightReceiver(model)
    return GpuWeightReceiver(model)


# --------------------------------------------------------------------------------------------------------------------
# On a GPU: the rollout's weights live in one flat device buffer; actor rank 0 writes it by CUDA IPC when it is on
# the same GPU (a device-to-device copy), else through the rollout's pinned shared host buffer (D2H, then H2D).

_PATH_IPC, _PATH_HOST = 1, 2  # header bytes 8..15: how the last version arrived (the receiver loads only for HOST)


def gpu_id(device: torch.device) -> str:
    """The physical identity of a CUDA device (its UUID), the same in every process whatever its numbering."""
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "")
    return uuid or f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}:{device.index or 0}"


def pin(seg: SharedSegment) -> bool:
    """Page-lock a shared segment in this process (cudaHostRegister), so copies to and from it run at DMA speed and
    asynchronously. False where the driver refuses: the copies then go through pageable memory, slower but right."""
    cudart = torch.cuda.cudart()
    register = getattr(cudart, "cudaHostRegister", None)
    if register is None or seg.size == 0:
        return False
    try:
        ok = int(register(seg.data.data_ptr(), seg.size, 0)) == 0  # flags 0: cudaHostRegisterDefault
    except (RuntimeError, TypeError, ValueError):
        ok = False
    if not ok:
        _clear_cuda_error()
    return ok


def _clear_cuda_error() -> None:
    """Reset CUDA's last error after a refused registration: torch checks it after every kernel launch and would
    report the refusal there, as a failure of an unrelated kernel."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in paths:  # the runtime torch loaded (a cudart linked statically into torch has no path here)
            ctypes.CDLL(path).cudaGetLastError()
    except OSError:
        pass


def unpin(seg: SharedSegment) -> None:
    unregister = getattr(torch.cuda.cudart(), "cudaHostUnregister", None)
    if unregister is not None and seg.data is not None:
        unregister(seg.data.data_ptr())


def _device_view(flat: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    """The slot's tensor inside a flat uint8 buffer laid out like the shared segment ([size] bytes)."""
    nbytes = math.prod(slot.shape) * slot.dtype.itemsize
    return flat[slot.offset : slot.offset + nbytes].view(slot.dtype).view(slot.shape)


class GpuWeightReceiver(WeightReceiver):
    """The rollout's side on a GPU: its parameters are views into one flat device buffer ([size] uint8, the shared
    segment's layout), which it offers to the actor by CUDA IPC; the shared segment holds the stamp and, pinned, the
    host copy for an actor on another GPU."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._views: dict[str, torch.Tensor] = {}  # (the CPU receiver's host views: none here)
        weights = _weights(model)
        self.layout, size = plan_layout(weights)
        device = next(iter(weights.values())).device
        self.flat = torch.empty(size, dtype=torch.uint8, device=device)  # [size] bytes; 0..63 unused (the header)
        with torch.no_grad():
            for slot in self.layout:
                view = _device_view(self.flat, slot)
                view.copy_(weights[slot.name].detach())
                weights[slot.name].data = view  # the parameter now aliases the device buffer
        self.segment = SharedSegment.create(size, tag="weights")  # reserved: /dev/shm must hold it (shm.py)
        self._stamp = self.segment.view(torch.int64, (2,), 0)  # [version, path]
        self._stamp.fill_(-1)
        self.version = -1
        self.zero_copy = False
        self.pinned = pin(self.segment)
        self.gpu = gpu_id(device)
        self._ipc = self._share(self.flat)

    @staticmethod
    def _share(flat: torch.Tensor) -> bytes:
        return bytes(ForkingPickler.dumps(flat))  # torch.multiprocessing's reducer: a CUDA IPC handle

    def handle(self) -> WeightBufferHandle:
        return WeightBufferHandle(self.segment.name, self.segment.size, self.layout, gpu=self.gpu,
                                  cuda_ipc=self._ipc)

    def wait_for_version(self, version: int, timeout: float) -> float:
        """Block until the actor has stamped `version`; load it from the host buffer unless it came by CUDA IPC."""
        start = time.monotonic()
        with span("wait_weights"):
            self._wait_stamp(version, timeout, start)
        if int(self._stamp[1]) == _PATH_HOST:
            with torch.no_grad(), span("weight_load"):
                # one H2D copy of the whole buffer: same layout on both sides (the header bytes land unused)
                self.flat.copy_(self.segment.data, non_blocking=self.pinned)
                if self.flat.is_cuda:  # (always, but for the CPU test of this protocol)
                    torch.cuda.synchronize(self.flat.device)  # inference must not start before the copy is done
        self.version = version
        return time.monotonic() - start

    def close(self) -> None:
        if self.pinned:
            unpin(self.segment)
            self.pinned = False
        self.flat = None
        super().close()


class GpuSender:
    """Actor rank 0's device paths, per rollout buffer: CUDA IPC on its own GPU, pinned host copy elsewhere."""

    def __init__(self):
        self._ipc: dict[str, torch.Tensor] = {}  # segment name -> the rollout's flat device buffer, opened once
        self._pinned: dict[str, SharedSegment] = {}

    def path(self, weights: dict[str, torch.Tensor], h: WeightBufferHandle) -> str:
        """'cuda ipc' when the rollout's buffer is on this process's GPU, else 'pinned host copy'."""
        device = next(iter(weights.values())).device
        if device.type == "cuda" and h.cuda_ipc and h.gpu == gpu_id(device):
            return "cuda ipc"
        return "pinned host copy"

    def send(self, weights: dict[str, torch.Tensor], h: WeightBufferHandle, seg: SharedSegment, version: int) -> int:
        written = 0
        header = seg.view(torch.int64, (2,), 0)  # [version, path]
        if self.path(weights, h) == "cuda ipc":
            flat = self._ipc.get(h.segment_name)
            if flat is None:
                flat = self._ipc[h.segment_name] = pickle.loads(h.cuda_ipc)  # opens the rollout's device memory
            for slot in h.layout:
                src = weights[slot.name].detach()
                _device_view(flat, slot).copy_(src)  # device to device, on this GPU
                written += src.numel() * src.element_size()
            if flat.is_cuda:  # (always, but for the CPU test of this protocol)
                torch.cuda.synchronize(flat.device)  # the stamp below must not run ahead of the copies
            header[1] = _PATH_IPC
        else:
            if h.segment_name not in self._pinned:
                self._pinned[h.segment_name] = seg if pin(seg) else None
            pinned = self._pinned[h.segment_name] is not None
            for slot in h.layout:
                src = weights[slot.name].detach()
                seg.view(slot.dtype, slot.shape, slot.offset).copy_(src, non_blocking=pinned and src.is_cuda)
                written += src.numel() * src.element_size()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # every D2H copy has landed before the stamp
            header[1] = _PATH_HOST
        header[0] = version  # last: the stamp publishes the complete version
        return written

    def close(self) -> None:
        for seg in self._pinned.values():
            if seg is not None:
                unpin(seg)
        self._pinned.clear()
        self._ipc.clear()
