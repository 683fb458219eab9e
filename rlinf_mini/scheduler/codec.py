"""The one message codec of the local backend: group calls (pipes) and channels (kernel queues) both send `frame(obj)`
and read `unframe(bytes)`. A frame has one reader: reading it frees what it carries, so a group call to several ranks
frames its command once per rank.

    msg = frame(obj, inline_max=INLINE_MAX)     # bytes: b"P" + pickle, or b"B" + the name of a shared blob
    obj = unframe(msg)

Tensors leave the pickle: a tensor under `SHM_MIN_BYTES` is pickled as its raw bytes (through numpy: ~3 us, where
torch's own pickling costs ~150 us); a larger one is copied once into a shared-memory segment from this process's
pool and travels as (segment name, dtype, shape). The receiver maps the segment without a copy and the segment is
free again (its busy flag zeroed) when the receiver drops the tensor. A pickle longer than `inline_max` (many small
tensors, a long string) travels the same way, as a blob the receiver copies out and frees at once, so a pipe write
stays under PIPE_BUF (atomic) and a socket message stays small. Segments are set up once and reused: a large payload
costs one memory copy and no allocation.

Why one codec: group calls and channels each had their own framing and their own way to spill to shared memory (and
group calls shared tensors through torch's file-descriptor passing, whose helper thread dies with its worker: a
result read after its sender was killed failed to unpickle instead of reporting the death).
"""

from __future__ import annotations

import atexit
import copyreg
import io
import math
import pickle
import threading
import weakref
from typing import Any

import numpy
import torch

from rlinf_mini.scheduler.shm import SharedSegment

SHM_MIN_BYTES = 64 * 1024  # below this, pickling the bytes inline is cheaper than a shared-memory hop
_HEADER = 64  # byte 0 of every pool segment is its busy flag; data starts at a 64-byte boundary
_MIN_SEGMENT = _HEADER + (1 << 16)  # smaller payloads share this size, so a segment serves any of them


class _SegmentPool:
    """Per-process pool of send segments. A segment is free again once its receiver zeroed the busy flag."""

    def __init__(self):
        self.segments: list[SharedSegment] = []
        self.lock = threading.Lock()

    def acquire(self, nbytes: int) -> SharedSegment:
        with self.lock:
            for seg in self.segments:
                # the flag is read and written through the mmap: ~0.1 us, where a torch index costs ~5 us
                fits = seg.size - _HEADER >= nbytes and seg.size <= max(4 * (nbytes + _HEADER), _MIN_SEGMENT)
                if fits and seg._mmap[0] == 0:
                    seg._mmap[0] = 1
                    return seg
            size = max(_MIN_SEGMENT, _HEADER + (1 << (nbytes - 1).bit_length()))  # powers of two: few distinct sizes
            seg = SharedSegment.create(size, tag="msg")
            seg.send_view = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, offset=_HEADER)  # [size - _HEADER] bytes
            seg._mmap[0] = 1
            self.segments.append(seg)
            return seg

    def close(self) -> None:
        for seg in self.segments:
            seg.send_view = None  # the view exports the mapping's buffer: drop it so that the mapping can close
            seg.close()
        self.segments.clear()


_send_pool = _SegmentPool()
_attached: dict[str, SharedSegment] = {}  # receive side: segments opened once per process, by name
_attached_lock = threading.Lock()


def _attach(name: str, size: int) -> SharedSegment:
    seg = _attached.get(name)
    if seg is None:
        with _attached_lock:
            seg = _attached.get(name)
            if seg is None:
                seg = _attached[name] = SharedSegment.attach(name, size)
    return seg


def close_process_resources() -> None:
    """Unmap this process's pool and attached segments (when a worker stops; the pool's owner removes its files)."""
    _send_pool.close()
    for seg in _attached.values():
        seg.close()
    _attached.clear()


atexit.register(close_process_resources)

# ---------------------------------------------------------------------------------------------------------------------
# Tensors

_NUMPY_DTYPES = {torch.uint8: numpy.uint8, torch.int8: numpy.int8, torch.int16: numpy.int16, torch.int32: numpy.int32,
                 torch.int64: numpy.int64, torch.float16: numpy.float16, torch.float32: numpy.float32,
                 torch.float64: numpy.float64, torch.bool: numpy.bool_}


def _reduce_tensor(obj: torch.Tensor) -> tuple:
    """How the codec pickles a tensor: raw bytes inline when small, through a pooled shared segment when large.
    (A reducer in the pickler's dispatch_table, not a persistent_id hook: that hook is a Python call for every
    object of every message.)"""
    t = obj.detach() if obj.requires_grad else obj
    nbytes = t.numel() * t.element_size()
    if not t.is_cpu:
        if nbytes >= SHM_MIN_BYTES:  # one copy: device straight into the shared segment, no host temporary
            seg = _send_pool.acquire(nbytes)
            _shm_tensor(seg, t.dtype, tuple(t.shape)).copy_(t)  # synchronous D2H (pageable destination)
            return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))
        t = t.cpu()  # small: one device-to-host copy, then its bytes inline
    if t.dtype in _NUMPY_DTYPES:  # numpy does the byte work: ~3 us small, ~13 us less than torch for 786 KB
        arr = t.numpy()  # a view; .tobytes() writes C order
        if nbytes < SHM_MIN_BYTES:
            return _rebuild_array, (arr.tobytes(), t.dtype, arr.shape)
        if arr.flags.c_contiguous:
            seg = _send_pool.acquire(nbytes)
            numpy.copyto(seg.send_view[:nbytes], arr.reshape(-1).view(numpy.uint8))
            return _rebuild_shm, (seg.name, seg.size, t.dtype, arr.shape)
    elif nbytes < SHM_MIN_BYTES:  # bfloat16 and friends: no numpy dtype, so raw bytes and a torch view
        return _rebuild_bytes, (t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), t.dtype,
                                tuple(t.shape))
    seg = _send_pool.acquire(nbytes)  # large and strided, or without a numpy dtype: torch copies into the segment
    _shm_tensor(seg, t.dtype, tuple(t.shape)).copy_(t)
    return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))


def _rebuild_array(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    # bytearray: a writable copy, so the tensor is an ordinary writable one (frombuffer over bytes is read-only)
    return torch.from_numpy(numpy.frombuffer(bytearray(raw), dtype=_NUMPY_DTYPES[dtype]).reshape(shape))


def _rebuild_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def _rebuild_shm(name: str, size: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    # Zero copy: the tensor we return *is* the sender's segment. The segment goes back to its sender (flag 0)
    # when the last tensor or view using it is freed. A copy here would cost as much as the sender's copy.
    return _shm_tensor(_attach(name, size), dtype, shape, on_free=_release)


def _shm_tensor(seg: SharedSegment, dtype: torch.dtype, shape: tuple[int, ...], on_free=None) -> torch.Tensor:
    """A tensor over the segment's bytes from _HEADER. Made through numpy (~5 us, where torch.frombuffer and
    .view take ~20 us); `on_free(seg)` runs when the last tensor or view using these bytes is freed (torch.from_numpy
    keeps the numpy array alive exactly that long)."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is not None:
        arr = numpy.frombuffer(seg._mmap, dtype=np_dtype, count=math.prod(shape), offset=_HEADER).reshape(shape)
        out = torch.from_numpy(arr)
    else:  # bfloat16 and friends have no numpy dtype: bytes, then a torch view
        arr = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, count=math.prod(shape) * dtype.itemsize, offset=_HEADER)
        out = torch.from_numpy(arr).view(dtype).view(shape)
    if on_free is not None:
        weakref.finalize(arr, on_free, seg)  # `arr` is the object the tensor's storage holds on to
    return out


def _release(seg: SharedSegment) -> None:
    try:
        seg._mmap[0] = 0  # hand the segment back to its sender
    except ValueError:  # the mapping was closed at shutdown: nothing to hand back
        pass


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor, torch.nn.Parameter: _reduce_tensor}


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)  # the tensors rebuild themselves: _rebuild_array, _rebuild_bytes, _rebuild_shm


# ---------------------------------------------------------------------------------------------------------------------
# Frames: one message on a pipe or a socket


def frame(obj: Any, inline_max: int) -> bytes:
    """`obj` as one message of at most inline_max + 1 bytes (a longer pickle goes into a pooled blob)."""
    payload = dumps(obj)
    if len(payload) <= inline_max:
        return b"P" + payload
    seg = _send_pool.acquire(len(payload))
    seg._mmap[_HEADER:_HEADER + len(payload)] = payload
    return b"B" + pickle.dumps((seg.name, seg.size, len(payload)))


def unframe(msg: bytes) -> Any:
    if msg[:1] == b"P":
        return loads(msg[1:])
    name, size, n = pickle.loads(msg[1:])
    seg = _attach(name, size)
    payload = bytes(seg._mmap[_HEADER:_HEADER + n])  # copied out, so the blob is free again at once
    _release(seg)
    return loads(payload)
