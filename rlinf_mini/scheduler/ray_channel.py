"""The Ray backend's channel transport across nodes: keyed, bounded queues in one async actor; large items by
producer-owned ref. (A one-node run's channels are the local backend's kernel queues instead: ray_backend.py.)

    queues = RayQueues(name, channel_actor(node_id), maxsize)   # what RayBackend.channel_transport returns

- A put of an item with >= BY_REF_MIN_BYTES of tensors ray.put()s it in the producer, which owns the object; the
  queue actor holds only its ObjectRef (metadata), and the consumer's ray.get() moves the payload once, from the
  producer's object store to the consumer's. Smaller items travel as codec bytes inside the actor's calls.
- A put that knows a slot is free does not wait for the actor's answer (pipelined, `_Outbox`); its turn keeps each
  key FIFO per producer. A get is one round trip. Bound, timeouts and liveness checks are the other backends'.
- Tensors cross Ray as numpy arrays (`use_numpy_for_tensors`), out of band in the object store. Weight sync across
  nodes (stages/sync.py) uses the same queues (`weights_mailbox`; one node: the kernel queues the backend made).
  Costs: benchmarks/ray_backend.py (--channels).

RLinf counterpart: `rlinf/scheduler/channel/channel.py` + `channel_worker.py` (queues in an actor; RLinf moves the
payloads by its workers' own send/recv). Left out: a get of several items per call (it hands a key's items to one
consumer ahead of its gets); the payload pulled from the producer's actor, the queue holding (producer, id) only:
no faster at 786 KB (`python -m benchmarks.ray_backend --designs` compares the two; docs/performance.md).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Hashable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_mini.scheduler import tracer

CHANNEL_ACTOR = "rlinf_mini_channels_"  # + run id: the queue actor's name in the job's namespace (ranks look it up)
# An item with this many tensor bytes or more goes through the object store by ObjectRef; a smaller one travels as
# bytes inside the queue actor's calls: an ObjectRef nested in a call costs Ray's borrowing protocol, which a small
# item's copy does not (docs/performance.md).
BY_REF_MIN_BYTES = 64 * 1024  # the codec pickles smaller tensors inline (codec.SHM_MIN_BYTES)
ANSWER_S = 30.0  # an actor call that takes no time on its side must answer within this, or the actor is gone
MAX_IN_FLIGHT = 16  # pipelined puts per key and process without an answer: beyond, the producer waits for the oldest
_UNBOUNDED_ROOM = 1 << 30  # the free slots an unbounded queue reports


def _tensor_to_numpy(t) -> tuple:
    """How a tensor crosses Ray here: as a numpy array, which Ray's pickle-5 path puts in the object store out of band
    (one copy in) and hands back without a copy; torch's own pickling goes through torch.save, which copies more.
    On the CPU, as the local codec does; dtypes numpy lacks
    (bfloat16) travel as bytes."""
    import torch

    t = t.detach().cpu().contiguous()
    try:
        return t.numpy(), None, ()
    except TypeError:
        return t.view(-1).view(torch.uint8).numpy(), t.dtype, tuple(t.shape)


def _tensor_from_numpy(state: tuple):
    import torch

    arr, dtype, shape = state
    # The object store's buffer is read-only (numpy says so; the mapping itself is writable, so a write would change
    # the stored object under Ray). A received tensor is the receiver's own on every backend (the rollout and the
    # envs may write into theirs), so it gets its own memory: one copy, small beside what the message costs
    # through a channel (docs/performance.md).
    t = torch.from_numpy(arr.copy())
    return t if dtype is None else t.view(dtype).view(shape)


def use_numpy_for_tensors() -> None:
    """Register the tensor serializer above in this process (the driver, every rank: after torch is imported)."""
    import torch

    ray.util.register_serializer(torch.Tensor, serializer=_tensor_to_numpy, deserializer=_tensor_from_numpy)


@ray.remote
class _ChannelActor:
    """Every channel's keyed queues (RLinf: ChannelWorker). Holds ObjectRefs (wrapped in a list, so Ray passes them
    through instead of resolving them), never the items.

    An async actor may run two calls of one caller out of order (within a few hundred puts). A pipelined put
    carries its producer's turn (producer id, sequence number per key): it goes into the queue only after the
    producer's previous one, so each key stays FIFO per producer."""

    def __init__(self):
        self.maxsize: dict[str, int] = {}
        self.queues: dict[tuple[str, Hashable], asyncio.Queue] = {}
        self.next_seq: dict[tuple[str, Hashable, str], int] = {}  # (channel, key, producer) -> the turn to come
        self.turns = asyncio.Condition()

    def _queue(self, channel: str, key: Hashable) -> asyncio.Queue:
        q = self.queues.get((channel, key))
        if q is None:
            q = self.queues[(channel, key)] = asyncio.Queue(self.maxsize.get(channel, 0))
        return q

    async def create(self, channel: str, maxsize: int) -> bool:
        if channel in self.maxsize:
            return False
        self.maxsize[channel] = maxsize
        return True

    def _room(self, q: asyncio.Queue) -> int:
        return q.maxsize - q.qsize() if q.maxsize > 0 else _UNBOUNDED_ROOM

    async def put(self, channel: str, key: Hashable, wrapped: Any, timeout: float,
                  turn: tuple[str, int] | None = None) -> tuple[float, int]:
        """(seconds it waited for room, free slots left after it), or (-1.0, 0) if no room came within `timeout`.
        `turn`: (producer, seq) of a pipelined put, which waits for the producer's put seq - 1 first."""
        q = self._queue(channel, key)
        if turn is None:
            return await self._put(q, wrapped, timeout)
        producer, seq = turn
        me = (channel, key, producer)
        start = time.monotonic()
        try:
            async with self.turns:  # the previous put of this producer was lost (it died) if this ever times out
                await asyncio.wait_for(self.turns.wait_for(lambda: self.next_seq.get(me, 0) >= seq), timeout)
        except asyncio.TimeoutError:
            return -1.0, 0
        try:
            waited, room = await self._put(q, wrapped, max(0.0, timeout - (time.monotonic() - start)))
            return waited, room
        finally:  # inserted or given up: the producer's next put may go
            async with self.turns:
                self.next_seq[me] = max(self.next_seq.get(me, 0), seq + 1)
                self.turns.notify_all()

    async def _put(self, q: asyncio.Queue, wrapped: Any, timeout: float) -> tuple[float, int]:
        if not q.full():
            q.put_nowait(wrapped)
            return 0.0, self._room(q)
        start = time.monotonic()
        try:
            await asyncio.wait_for(q.put(wrapped), timeout)
            return time.monotonic() - start, self._room(q)
        except asyncio.TimeoutError:
            return -1.0, 0

    async def get(self, channel: str, key: Hashable, timeout: float) -> tuple[float, list | None]:
        """(seconds waited, the wrapped ObjectRef), or (-1.0, None) if nothing came within `timeout`."""
        q = self._queue(channel, key)
        if not q.empty():
            return 0.0, q.get_nowait()
        start = time.monotonic()
        try:
            wrapped = await asyncio.wait_for(q.get(), timeout)
            return time.monotonic() - start, wrapped
        except asyncio.TimeoutError:
            return -1.0, None

    async def qsize(self, channel: str, key: Hashable) -> int:
        return self._queue(channel, key).qsize()


def _tensor_bytes(item: Any) -> int:
    """The bytes of the tensors and arrays in `item` (through dicts, lists and tuples)."""
    if isinstance(item, dict):
        return sum(_tensor_bytes(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(_tensor_bytes(v) for v in item)
    nbytes = getattr(item, "nbytes", None)  # torch.Tensor and numpy.ndarray
    return nbytes if isinstance(nbytes, int) else 0


class _Outbox:
    """One process's pipelined puts to one key of one channel: how many slots it knows are free, and the puts the
    queue actor has not answered yet (their ObjectRefs, oldest first, with the timeout each was given)."""

    def __init__(self, producer: str):
        self.lock = threading.Lock()  # a Channel may be used from several threads of a process
        self.producer = producer  # who the queue actor orders these puts as (this process, this channel handle)
        self.seq = 0  # the next put's turn
        self.room = 0  # free slots known for sure (none, until a put's answer says)
        self.in_flight: deque[tuple[Any, float]] = deque()


_PRODUCER_ID = uuid.uuid4().hex  # this process, as a producer the queue actor orders
_outboxes: dict[tuple[str, Hashable], _Outbox] = {}  # (channel uid, key) -> this process's outbox
_outboxes_lock = threading.Lock()


class RayQueues:
    """The Ray channel transport (channel.py): a handle on one channel's queues in the `_ChannelActor`; picklable
    into group calls (a Ray actor handle pickles).

    A put is pipelined when it cannot wait: the producer sends it and returns without waiting for the queue actor's
    answer, as long as it knows the key has a free slot for it (the last answer said how many were free; consumers
    only free more). With a single producer on a key that is exact: the put could not have blocked, so the bound
    (maxsize) and a full put's timeout behave as unpipelined; only the answer's round trip is saved. A put that may
    have to wait (no slot known free) waits, as before, for all of this process's puts to the key and then for its
    own answer. (With several producers on one key a pipelined put can meet a full queue after all: it then waits in
    the queue actor up to its timeout, and if it fails, the producer's next put, get or qsize on that key raises the
    ChannelTimeout.)"""

    def __init__(self, name: str, actor, maxsize: int):
        self.name, self.actor, self.maxsize = name, actor, maxsize
        self.uid = uuid.uuid4().hex  # per channel made: a process's outboxes are by this, not by the reusable name

    def _outbox(self, key: Hashable) -> _Outbox:
        box = _outboxes.get((self.uid, key))
        if box is None:
            with _outboxes_lock:
                box = _outboxes.setdefault((self.uid, key), _Outbox(f"{_PRODUCER_ID}-{self.uid}"))
        return box

    def _session(self) -> None:
        if not ray.is_initialized():  # the run's Ray session ended (any Ray call would start a new one)
            raise ConnectionError(f"channel {self.name!r}: the run's Ray session has ended")

    def _ask(self, ref, wait_s: float):
        try:
            return ray.get(ref, timeout=wait_s + ANSWER_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise ConnectionError(f"channel {self.name!r}: its queue actor is gone ({type(e).__name__})") from None

    def _answered(self, key: Hashable, box: _Outbox, ref, wait_s: float) -> None:
        waited, room = self._ask(ref, wait_s)
        if waited < 0:
            from rlinf_mini.scheduler.channel import ChannelTimeout

            raise ChannelTimeout(f"channel {self.name!r} key {key!r}: an earlier put of this process found it "
                                 f"still full after {wait_s:.2g} s ({self.full_reason(key)})")
        box.room = room - len(box.in_flight)  # the puts still in flight take slots after this one's answer

    def _reap(self, key: Hashable, box: _Outbox, wait_all: bool = False, keep: int = 0) -> None:
        """Read the answers of this process's puts to `key` that have come (all, waiting for them, if `wait_all`; or
        the oldest, waiting, until at most `keep` are left)."""
        if box.in_flight and not wait_all:
            refs = [ref for ref, _ in box.in_flight]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(done)
            while box.in_flight and box.in_flight[0][0] in done:
                ref, wait_s = box.in_flight.popleft()
                self._answered(key, box, ref, wait_s)
        while box.in_flight and (wait_all or len(box.in_flight) > keep):
            ref, wait_s = box.in_flight.popleft()
            self._answered(key, box, ref, wait_s)

    def _until(self, op, wait_name: str, deadline: float, check, slice_s: float):
        """Ask the queue actor `op(timeout)`: one call when it can answer at once (a round trip is the cost of a put
        or get here), else one per slice, checking liveness between them in the driver, until it succeeds or the
        deadline passes. A wait is traced as `wait_name` once the actor reports it."""
        start = time.monotonic_ns()
        waited_at_all = False
        while True:
            if check is not None:
                check()
            left = deadline - time.monotonic()
            wait_s = max(0.0, min(left, slice_s) if check is not None else left)
            waited, value = self._ask(op(wait_s), wait_s)
            waited_at_all = waited_at_all or waited != 0.0
            if waited >= 0 or left <= 0:
                if waited_at_all:
                    tracer.record(wait_name, start, time.monotonic_ns())
                return (True, value) if waited >= 0 else (False, None)

    def put(self, key: Hashable, item: Any, deadline: float, check, slice_s: float) -> bool:
        self._session()
        if _tensor_bytes(item) >= BY_REF_MIN_BYTES:
            wrapped: Any = [ray.put(item)]  # the item goes to the object store; the queue holds its ObjectRef
        else:  # the house codec's bytes (small tensors as raw bytes), held by the queue actor as they are
            from rlinf_mini.scheduler import codec

            wrapped = codec.dumps(item)
        box = self._outbox(key)
        with box.lock:
            self._reap(key, box, keep=MAX_IN_FLIGHT - 1)
            if box.room <= 0 and self.maxsize > 0:  # no slot known free: this process's earlier puts go first...
                self._reap(key, box, wait_all=True)  # ...and their answers say how many are free now
            if box.room > 0 or self.maxsize <= 0:  # a slot is free for sure: send, and do not wait for the answer
                timeout = max(0.0, deadline - time.monotonic())
                ref = self.actor.put.remote(self.name, key, wrapped, timeout, (box.producer, box.seq))
                box.seq += 1
                box.room -= 1
                box.in_flight.append((ref, timeout))
                return True
            ok, room = self._until(lambda t: self.actor.put.remote(self.name, key, wrapped, t), "wait_put",
                                   deadline, check, slice_s)
            box.room = room if ok else 0
            return ok

    def get(self, key: Hashable, deadline: float, check, slice_s: float) -> tuple[bool, Any]:
        self._session()
        self._settle(key)
        ok, wrapped = self._until(lambda t: self.actor.get.remote(self.name, key, t), "wait_get", deadline, check,
                                  slice_s)
        if not ok:
            return False, None
        if isinstance(wrapped, bytes):
            from rlinf_mini.scheduler import codec

            return True, codec.loads(wrapped)
        try:
            return True, ray.get(wrapped[0], timeout=ANSWER_S)
        except ray.exceptions.ObjectLostError as e:  # its producer died with the object (the cluster reports it)
            raise ConnectionError(f"channel {self.name!r} key {key!r}: the item was lost ({type(e).__name__})") \
                from None

    def _settle(self, key: Hashable) -> None:
        """Wait until this process's puts to `key` are in the queue (before it reads the key itself)."""
        box = _outboxes.get((self.uid, key))
        if box is not None and box.in_flight:
            with box.lock:
                self._reap(key, box, wait_all=True)

    def qsize(self, key: Hashable) -> int:
        self._session()
        self._settle(key)
        return self._ask(self.actor.qsize.remote(self.name, key), 0.0)

    def full_reason(self, key: Hashable) -> str:
        return "is its consumer alive and reading?"


# Ray starts its workers at niceness 15 (its daemons run at the driver's). Our actors are the run's compute, as a
# local rank is, at the driver's niceness: at 15, beside other work on shared cores, the actor ranks get a fraction
# of a core and training slows (docs/performance.md). (Ray's job manager does the same for the driver.)
WORKER_NICENESS_ENV = "RAY_worker_niceness"


def at_our_niceness() -> dict:
    """The runtime_env of an actor of ours: the job's (Ray merges env_vars), its process at this process's niceness
    (the driver's; a rank has the driver's)."""
    return {"env_vars": {WORKER_NICENESS_ENV: str(os.getpriority(os.PRIO_PROCESS, 0))}}


def channel_actor(node_id: str | None, create: bool = True):
    """The run's queue actor (one per run id), made on `node_id` by whoever asks first; None if absent and not
    `create`."""
    name = CHANNEL_ACTOR + os.environ.get("RLINF_MINI_RUN_ID", "")
    if not create:
        try:
            return ray.get_actor(name)
        except ValueError:
            return None
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False) if node_id else "DEFAULT"
    return _ChannelActor.options(name=name, get_if_exists=True, num_cpus=0, max_concurrency=1000,
                                 scheduling_strategy=strategy, runtime_env=at_our_niceness()).remote()


WEIGHTS_CHANNEL = "_weights"
_mailbox: Any = None  # this rank's weight mailbox when its backend made one (a one-node run's kernel queues)


def use_weights_mailbox(transport: Any) -> None:
    """In a rank, at its start: the mailbox its backend made (None: the queue actor's, made on demand)."""
    global _mailbox
    _mailbox = transport


def weights_mailbox() -> Any:
    """Inside a rank: an unbounded channel for weights sent to a rank on another node, and for a same-node rank's
    notice (stages/sync.py keys it by the receiver's buffer). A one-node run's is kernel queues in the driver
    (RayBackend); else a channel in the run's queue actor, which every node reaches."""
    if _mailbox is not None:
        return _mailbox
    actor = channel_actor(None)
    ray.get(actor.create.remote(WEIGHTS_CHANNEL, 0), timeout=ANSWER_S)  # False when another rank made it: the same
    return RayQueues(WEIGHTS_CHANNEL, actor, 0)
