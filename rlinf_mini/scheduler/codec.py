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
costs one memory copy and no allocation, and none at all when the producer built it in a segment lent by `lend`
(Channel.empty: a put of such a buffer sends only its segment's name; the rules are Channel.empty's).

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
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from rlinf_mini.scheduler.shm import SharedSegment

SHM_MIN_BYTES = 64 * 1024  # below this, pickling the bytes inline is cheaper than a shared-memory hop
_HEADER = 64  # bytes 0 and 1 of every pool segment are its busy flags; data starts at a 64-byte boundary
_IN_FLIGHT, _LENT = 0, 1  # the flags: sent and not yet dropped by its receiver / lent to this process's producer
_MIN_SEGMENT = _HEADER + (1 << 16)  # smaller payloads share this size, so a segment serves any of them


class _SegmentPool:
    """Per-process pool of send segments. A segment is free again once both flags are zero: its receiver zeroes
    _IN_FLIGHT when it drops the tensor, and a lent buffer's _LENT is zeroed when its producer drops it."""

    def __init__(self):
        self.segments: list[SharedSegment] = []
        self.lock = threading.Lock()

    def acquire(self, nbytes: int, flag: int = _IN_FLIGHT) -> SharedSegment:
        """A free segment of at least `nbytes`, with `flag` set."""
        with self.lock:
            for seg in self.segments:
                # the flags are read and written through the mmap: a byte access, where a torch index is a dispatch
                fits = seg.size - _HEADER >= nbytes and seg.size <= max(4 * (nbytes + _HEADER), _MIN_SEGMENT)
                if fits and seg._mmap[_IN_FLIGHT] == 0 and seg._mmap[_LENT] == 0:
                    seg._mmap[flag] = 1
                    return seg
            size = max(_MIN_SEGMENT, _HEADER + (1 << (nbytes - 1).bit_length()))  # powers of two: few distinct sizes
            seg = SharedSegment.create(size, tag="msg")
            seg.send_view = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, offset=_HEADER)  # [size - _HEADER] bytes
            seg._mmap[flag] = 1
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
# A small tensor's dtype travels as numpy's name of it: a short string, where a torch.dtype is a global that pickle
# writes by module and name and the receiver looks up again, for each tensor of each message.
_DTYPE_NAMES = {t: numpy.dtype(n).name for t, n in _NUMPY_DTYPES.items()}
_NAMED_DTYPES = {name: numpy.dtype(name) for name in _DTYPE_NAMES.values()}


def _reduce_tensor(obj: torch.Tensor) -> tuple:
    """How the codec pickles a tensor: raw bytes inline when small, through a pooled shared segment when large.
    (A reducer in the pickler's dispatch_table, not a persistent_id hook: that hook is a Python call for every
    object of every message.)"""
    t = obj.detach() if obj.requires_grad else obj
    nbytes = t.numel() * t.element_size()
    if nbytes >= SHM_MIN_BYTES and _lent:
        rec = hand_over(t)
        if rec is not None and rec.seg is not None:  # built in a lent segment: no copy, only its name travels
            rec.seg._mmap[_IN_FLIGHT] = 1  # its receiver zeroes this when it drops the tensor
            return _rebuild_shm, (rec.seg.name, rec.seg.size, t.dtype, tuple(t.shape))
    if not t.is_cpu:
        if nbytes >= SHM_MIN_BYTES:  # one copy: device straight into the shared segment, no host temporary
            seg = _send_pool.acquire(nbytes)
            _shm_tensor(seg, t.dtype, tuple(t.shape))[0].copy_(t)  # synchronous D2H (pageable destination)
            return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))
        t = t.cpu()  # small: one device-to-host copy, then its bytes inline
    if t.dtype in _NUMPY_DTYPES:  # numpy does the byte work: less overhead than torch's
        arr = t.numpy()  # a view; .tobytes() writes C order
        if nbytes < SHM_MIN_BYTES:
            return _rebuild_array, (arr.tobytes(), _DTYPE_NAMES[t.dtype], arr.shape)
        if arr.flags.c_contiguous:
            seg = _send_pool.acquire(nbytes)
            numpy.copyto(seg.send_view[:nbytes], arr.reshape(-1).view(numpy.uint8))
            return _rebuild_shm, (seg.name, seg.size, t.dtype, arr.shape)
    elif nbytes < SHM_MIN_BYTES:  # bfloat16 and friends: no numpy dtype, so raw bytes and a torch view
        return _rebuild_bytes, (t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), t.dtype,
                                tuple(t.shape))
    seg = _send_pool.acquire(nbytes)  # large and strided, or without a numpy dtype: torch copies into the segment
    _shm_tensor(seg, t.dtype, tuple(t.shape))[0].copy_(t)
    return _rebuild_shm, (seg.name, seg.size, t.dtype, tuple(t.shape))


def _rebuild_array(raw: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    # bytearray: a writable copy, so the tensor is an ordinary writable one (frombuffer over bytes is read-only)
    return torch.from_numpy(numpy.frombuffer(bytearray(raw), dtype=_NAMED_DTYPES[dtype]).reshape(shape))


def _rebuild_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def _rebuild_shm(name: str, size: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    # Zero copy: the tensor we return *is* the sender's segment. The segment goes back to its sender (_IN_FLIGHT 0)
    # when the last tensor or view using it is freed. A copy here would cost as much as the sender's copy.
    seg = _attach(name, size)
    out, arr = _shm_tensor(seg, dtype, shape)
    _when_freed(arr, _release, seg)  # `arr` is the object the tensor's storage holds on to
    return out


def _shm_tensor(seg: SharedSegment, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, Any]:
    """(tensor, numpy array) over the segment's bytes from _HEADER. Made through numpy (~5 us, where torch.frombuffer
    and .view take ~20 us); the tensor's storage keeps the array alive exactly as long as the last tensor or view
    using these bytes lives, so `_when_freed(arr, ...)` runs when they are all freed."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is not None:
        arr = numpy.frombuffer(seg._mmap, dtype=np_dtype, count=math.prod(shape), offset=_HEADER).reshape(shape)
        return torch.from_numpy(arr), arr
    # bfloat16 and friends have no numpy dtype: bytes, then a torch view
    arr = numpy.frombuffer(seg._mmap, dtype=numpy.uint8, count=math.prod(shape) * dtype.itemsize, offset=_HEADER)
    return torch.from_numpy(arr).view(dtype).view(shape), arr


def _release(seg: SharedSegment) -> None:
    try:
        seg._mmap[_IN_FLIGHT] = 0  # hand the segment back to its sender
    except ValueError:  # the mapping was closed at shutdown: nothing to hand back
        pass


_on_free: dict[int, tuple] = {}  # id(weakref) -> (the weakref, fn, args), until the array it watches is freed


def _when_freed(arr: Any, fn, *args) -> None:
    """Call fn(*args) when `arr` is freed: a weakref callback (0.1 us to set up, where weakref.finalize takes 0.8 us
    and calls back through Python-level bookkeeping; both run once per large message on each side)."""
    ref = weakref.ref(arr, _freed)
    _on_free[id(ref)] = (ref, fn, args)


def _freed(ref: weakref.ref) -> None:
    entry = _on_free.pop(id(ref), None)
    if entry is not None:  # (None only while the interpreter shuts down)
        entry[1](*entry[2])


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor, torch.nn.Parameter: _reduce_tensor}


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)  # the tensors rebuild themselves: _rebuild_array, _rebuild_bytes, _rebuild_shm


# ---------------------------------------------------------------------------------------------------------------------
# Buffers lent to a producer (Channel.empty): built in place, put by reference. The rules are Channel.empty's.


class LentBufferError(ValueError):
    """A buffer from Channel.empty() was put twice, or written after its put."""


@dataclass(eq=False)
class _Lent:
    """One buffer handed out by `lend`, for as long as its memory lives (in `_lent`, by its data address)."""

    nbytes: int
    seg: SharedSegment | None  # its pool segment; None: ordinary memory (small, or a backend without shared memory)
    owner: int  # the thread that took it: only that thread's put hands it over (inline ranks are threads)
    put_on: tuple = ()  # (channel name, key) it was put on; () until then
    version: int = -1  # the put tensor's version counter at the put (torch moves it on every in-place write)
    tensor: Any = None  # a weakref to the put tensor, whose version counter a later write moves
    sent: bool = False  # handed over by reference (its segment's name encoded, or passed on without a clone)


_lent: dict[int, _Lent] = {}  # data_ptr -> record; a record goes when the buffer's memory is freed


def any_lent() -> bool:
    """Whether this process holds buffers from Channel.empty (the rules' checks run only then)."""
    return bool(_lent)


def lend(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialized tensor for Channel.empty: in a pool segment when `shared` and at least SHM_MIN_BYTES (a put
    sends its name), else in ordinary memory (inline, Ray, small: a put goes as for any tensor). Either way it is
    recorded, so that the rules hold on every backend."""
    check_unwritten()
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)  # no bytes to share (and no address to know it by)
    if shared and nbytes >= SHM_MIN_BYTES:
        seg = _send_pool.acquire(nbytes, flag=_LENT)
        out, arr = _shm_tensor(seg, dtype, shape)
    else:
        seg = None
        arr = numpy.empty(nbytes, dtype=numpy.uint8)
        out = torch.from_numpy(arr).view(dtype).view(shape)
    ptr = out.data_ptr()
    rec = _lent[ptr] = _Lent(nbytes, seg, threading.get_ident())
    # when the last tensor or view of these bytes is freed: forget the record, then let the pool reuse the segment
    _when_freed(arr, _unlend, ptr, rec)
    return out


def _unlend(ptr: int, rec: _Lent) -> None:
    if _lent.get(ptr) is rec:
        _lent.pop(ptr, None)
    if rec.seg is not None:
        try:
            rec.seg._mmap[_LENT] = 0
        except ValueError:  # the mapping was closed at shutdown
            pass


def _own_record(t: torch.Tensor) -> _Lent | None:
    """The record of a lent buffer that `t` covers whole, if this thread took it (a view of part of one, or a buffer
    another thread took, is an ordinary tensor here)."""
    rec = _lent.get(t.data_ptr())
    if rec is None or rec.owner != threading.get_ident():
        return None
    if t.numel() * t.element_size() != rec.nbytes or not t.is_contiguous():
        return None
    return rec


def _where(put_on: tuple) -> str:
    return f"channel {put_on[0]!r} key {put_on[1]!r}"


def claim(item: Any, channel: str, key: Any) -> None:
    """Before a put on (channel, key): refuse the lent buffers in `item` that were put already, mark the others as
    put there, and report a write to any buffer after its put (LentBufferError). Channel.put calls it when `_lent`
    is not empty."""
    check_unwritten()
    _claim(item, (channel, key))


def _claim(item: Any, where: tuple) -> None:
    if isinstance(item, torch.Tensor):
        rec = _own_record(item)
        if rec is None:
            return
        if rec.put_on:
            raise LentBufferError(f"{_where(where)}: this buffer from Channel.empty() was put already, on "
                                  f"{_where(rec.put_on)}; a buffer travels once (its consumer reads it in place): "
                                  f"take a new one with empty() for each message, or put a clone")
        rec.put_on, rec.version, rec.tensor = where, item._version, weakref.ref(item)
    elif isinstance(item, dict):
        for v in item.values():
            _claim(v, where)
    elif isinstance(item, (list, tuple)):
        for v in item:
            _claim(v, where)


def check_unwritten() -> None:
    """LentBufferError if a lent buffer was written (through torch) after its put, reported once."""
    for rec in list(_lent.values()):
        t = rec.tensor() if rec.tensor is not None else None
        if t is not None and t._version != rec.version:
            rec.version = t._version
            raise LentBufferError(f"a buffer from Channel.empty() put on {_where(rec.put_on)} was written after its "
                                  f"put: its consumer reads these very bytes and may have seen the write. Fill a "
                                  f"buffer before putting it, and take a new one for the next message")


def hand_over(t: torch.Tensor) -> _Lent | None:
    """The record of `t` if it is a lent buffer claimed by the put under way and not yet handed over: the caller
    passes it on by reference, and it is marked so (a later encoding of the same tensor copies, as for any tensor)."""
    rec = _own_record(t)
    if rec is None or not rec.put_on or rec.sent:
        return None
    rec.sent = True
    return rec


def shared_segment_of(t: torch.Tensor) -> str | None:
    """The name of the shared segment whose bytes `t` uses (lent here, or received), or None: how a test sees that a
    zero-copy put made no copy (the consumer's tensor lies in the segment the producer filled)."""
    rec = _lent.get(t.data_ptr())
    if rec is not None and rec.seg is not None:
        return rec.seg.name
    ptr = t.data_ptr()
    for seg in list(_attached.values()) + _send_pool.segments:
        start = seg.data.data_ptr() if seg.data is not None else -1
        if start <= ptr < start + seg.size:
            return seg.name
    return None


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
