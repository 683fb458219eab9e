"""Stage 2 on GPUs: the device paths of weight sync (`stages/sync.py` is the stage; it uses these when the rollout's
model lives on a GPU). The rollout's weights live in one flat device buffer ([size] uint8, laid out like the shared
segment); actor rank 0 writes it by CUDA IPC when it is on the same GPU (a device-to-device copy), else through the
rollout's pinned shared host buffer (D2H, then one H2D copy by the rollout). The stamp is written after
`torch.cuda.synchronize`, so a rollout that sees it has every byte on the device.

RLinf counterpart: `rlinf/hybrid_engines/weight_syncer/` (CUDA IPC handles between collocated workers). Left out: an
NCCL broadcast to another GPU (the pinned host copy stands in).
"""

from __future__ import annotations

import math
import os
import pickle
import time
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers CUDA IPC with ForkingPickler, for the rollout's buffer)

from rlinf_mini.scheduler.shm import SharedSegment
from rlinf_mini.scheduler.tracer import span
from stages.weight_buffer import (
    WRITING,
    TensorSlot,
    WeightBufferHandle,
    model_weights,
    plan_layout,
    read_newest,
    wait_for_stamp,
)

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


class GpuWeightReceiver:
    """The rollout's side on a GPU: its parameters are views into one flat device buffer ([size] uint8, the shared
    segment's layout), which it offers to the actor by CUDA IPC; the shared segment holds the stamp and, pinned, the
    host copy for an actor on another GPU."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._views: dict[str, torch.Tensor] = {}  # (the CPU receiver's host views: none here)
        weights = model_weights(model)
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
        self._views.clear()
        self._stamp = None
        self.segment.close()

    def _wait_stamp(self, version: int, timeout: float, start: float) -> None:
        wait_for_stamp(self._stamp, version, timeout, start)

    def load_newest(self, model: torch.nn.Module, min_version: int, timeout: float) -> int:
        """Async PPO: copy the newest stamped version (>= min_version) into `model`, from the device buffer (CUDA
        IPC) or the host copy, redone if the actor wrote meanwhile (stages/weight_buffer.py::read_newest)."""
        weights = model_weights(model)

        def copy_out() -> None:
            host = int(self._stamp[1]) == _PATH_HOST
            with torch.no_grad():
                for slot in self.layout:
                    src = self.segment.view(slot.dtype, slot.shape, slot.offset) if host else \
                        _device_view(self.flat, slot)
                    weights[slot.name].copy_(src)
                if self.flat.is_cuda:
                    torch.cuda.synchronize(self.flat.device)  # the copy is done before the stamp is read again

        with span("wait_weights"):
            self.version = read_newest(self._stamp, copy_out, min_version, timeout)
        return self.version


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
        header[0] = WRITING  # first: an async reader copying now will read again (weight_buffer.read_newest)
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
