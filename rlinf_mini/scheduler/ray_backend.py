"""The Ray backend: one Ray actor per rank, on one machine or over the nodes of a Ray cluster (RLinf's way).

    cluster.backend: ray                # a private Ray instance (ray.init(address="local")), stopped at the run's end
    cluster.ray_address: auto           # or HOST:PORT: join a running cluster (`ray start --head`); it stays running

- Nodes: node index n (RankSpec.node) is the n-th alive Ray node, the driver's first, then by node id.
- Ranks: a `_RankActor` pinned to its node (NodeAffinitySchedulingStrategy) with a token CPU share and no Ray GPU;
  `start()` sets spec.env (CUDA_VISIBLE_DEVICES, RANK, OMP_*, ...) and only then imports torch and builds the worker.
  A group call is one actor call per rank, collected with ray.wait; a never-returning `watch()` call, which Ray fails
  when the actor dies, is how exit_status sees a death (kill -9 included).
- Collective: MASTER_ADDR/PORT come from rank 0's `rendezvous()` (its node's IP, a port free there), passed to every
  rank's `start()` as an ObjectRef, so launch does not wait for it.
- Channels: one async actor keeps every channel's keyed, bounded asyncio queues; a put or get is one call to it.
  Large items go through the object store (only the ObjectRef through the queue), small ones as codec bytes. A put
  that knows a slot is free does not wait for the actor's answer (pipelined, RayQueues); a get waits for its item.
  What a 786 KB message costs (profiled on 2 cores shared with other jobs, load 11-14): ~10 ms of CPU over four
  processes (producer ~4.5: ray.put ~1.3, the put call and the owner's side of Ray's borrowing protocol; queue
  actor ~3.5 for two calls; consumer ~2.5: the get call, ray.get of a borrowed ref 1.5-2.4 ms; raylet ~1.8),
  where ray.put in one process and ray.get in another cost ~2.3 ms. On a busy machine a message costs its CPU, so
  pipelining, which hides round trips, gains ~20 % there. The floor is the two actor calls: a call to an async
  actor costs ~1.5-2.1 ms of CPU (caller and actor, measured with an empty method), so a put call and a get call on
  top of the object store's ~2.3 ms cap a 786 KB message at ~0.35-0.45x where the CPU is the limit. Tried, no
  less CPU in total: items by value through the actor (no nested ObjectRef, but a copy in the actor), a threaded
  instead of an async actor (~0.4 ms less per call). Left out: a get that takes several queued items in one call,
  which would hand a key's items to one consumer ahead of its gets (and past the bound).
- Weight sync across nodes (stages/sync.py) uses the same queues (`weights_mailbox`).

RLinf counterpart: `rlinf/scheduler/cluster/cluster.py` (ray.init, node order), `worker/worker_group.py` (one actor
per rank, node affinity, env vars), `channel/channel.py` + `channel_worker.py` (queues in an actor). Left out: node
groups, per-method concurrency, Ray's own GPU accounting (the Cluster picks the GPUs).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import socket
import struct
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Hashable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_mini.scheduler import faults, tracer
from rlinf_mini.scheduler.backend import Backend, GroupRanks, RankSpec, Result

CPU_SHARE = 0.01  # Ray CPUs per rank: a token, so placement never waits for CPU accounting (pinning is by spec.env)
NODE_ENV = "RLINF_MINI_RAY_NODE"  # set in every rank: the Ray node id it runs on (stages/sync.py reads it)
CHANNEL_ACTOR = "rlinf_mini_channels_"  # + run id: the queue actor's name in the job's namespace (ranks look it up)
WATCH_EVERY_S = 0.05  # exit_status asks Ray about the watch calls at most this often
# An item with this many tensor bytes or more goes through the object store by ObjectRef; a smaller one travels as
# bytes inside the queue actor's calls: an ObjectRef nested in a call costs Ray's borrowing protocol (measured here:
# put + get of a small dict 4.9 ms by ObjectRef, 1.9 ms by value).
BY_REF_MIN_BYTES = 64 * 1024  # the codec pickles smaller tensors inline (codec.SHM_MIN_BYTES)
_ANSWER_S = 30.0  # an actor call that takes no time on its side must answer within this, or the actor is gone
MAX_IN_FLIGHT = 16  # pipelined puts per key and process without an answer: beyond, the producer waits for the oldest
_UNBOUNDED_ROOM = 1 << 30  # the free slots an unbounded queue reports


def _import_roots() -> str:
    """The driver's own import roots (a checkout, tests/), so that a Ray worker imports the classes the driver names
    (site-packages is the workers' already)."""
    roots = [p or os.getcwd() for p in sys.path]  # "": the current directory
    roots = [p for p in roots if os.path.isdir(p) and "-packages" not in p and not p.startswith(sys.base_prefix)]
    roots += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(os.path.abspath(p) for p in roots))


class RayBackend(Backend):
    name = "ray"

    def __init__(self, cfg):
        self.timeout_s = cfg.timeout_s
        self._joined = False  # we called ray.init (and so call ray.shutdown at the end)
        if not ray.is_initialized():  # else the caller's session (a test's, a notebook's): used, and left alone
            common = dict(runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}}, logging_level="WARNING",
                          log_to_driver=True)
            if cfg.ray_address:  # a running cluster: ray.shutdown() only disconnects from it
                ray.init(address=cfg.ray_address, **common)
            else:  # "local", not None: None would join whatever /tmp/ray/ray_current_cluster names (a dead run's)
                ray.init(address="local", include_dashboard=False, object_store_memory=1 << 30, **common)
            self._joined = True
        try:
            self.nodes = self._node_order()
            if len(self.nodes) < cfg.num_nodes:
                raise RuntimeError(f"cluster.num_nodes={cfg.num_nodes}, but the Ray cluster has {len(self.nodes)} "
                                   f"alive node(s)")
        except BaseException:
            self.shutdown()
            raise
        use_numpy_for_tensors()
        self.groups: list[RayRanks] = []
        self._channels = None  # the queue actor, made at the first channel

    @staticmethod
    def _node_order() -> list[dict]:
        """Alive Ray nodes, the driver's first, then by node id: node index n is the n-th."""
        mine = ray.get_runtime_context().get_node_id()
        alive = [n for n in ray.nodes() if n["Alive"]]
        return sorted(alive, key=lambda n: (n["NodeID"] != mine, n["NodeID"]))

    def launch(self, group, specs: list[RankSpec]) -> RayRanks:
        ranks = RayRanks(self, group.name, specs)
        self.groups.append(ranks)
        return ranks

    def channel_transport(self, name: str, maxsize: int, default_timeout: float) -> RayQueues:
        if self._channels is None:
            self._channels = _channel_actor(self.nodes[0]["NodeID"])
        actor = self._channels
        if not ray.get(actor.create.remote(name, maxsize), timeout=_ANSWER_S + 60):  # the first call waits its start
            raise ValueError(f"channel {name!r} already exists")
        return RayQueues(name, actor, maxsize)

    def shutdown(self) -> None:
        # Idempotent, and never calls Ray once the session is gone: any Ray call would start a new local instance
        # (Ray's auto-init), e.g. from the second Ctrl-C, where every group's kill() ends up here.
        if getattr(self, "_closed", False) or not ray.is_initialized():
            return
        self._closed = True
        for ranks in getattr(self, "groups", []):
            ranks.kill_actors()
        if getattr(self, "_channels", None) is None:
            self._channels = _channel_actor(None, create=False)  # a rank may have made it (weights_mailbox)
        if getattr(self, "_channels", None) is not None:
            ray.kill(self._channels)
            self._channels = None
        if self._joined:
            ray.shutdown()  # a private instance stops (its raylet, GCS, workers); a joined cluster is only left
            self._joined = False


def _tensor_to_numpy(t) -> tuple:
    """How a tensor crosses Ray here: as a numpy array, which Ray's pickle-5 path puts in the object store out of band
    (one copy in) and hands back without a copy; torch's own pickling goes through torch.save (ray.put + ray.get of
    786 KB measured 4.9 ms that way, 3.1 ms this way). On the CPU, as the local codec does; dtypes numpy lacks
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
    # envs may write into theirs), so it gets its own memory: 0.14 ms for 786 KB, 1.3 ms for 9.6 MB (measured),
    # 2 % and 8 % of what the message costs through a channel.
    t = torch.from_numpy(arr.copy())
    return t if dtype is None else t.view(dtype).view(shape)


def use_numpy_for_tensors() -> None:
    """Register the tensor serializer above in this process (the driver, every rank: after torch is imported)."""
    import torch

    ray.util.register_serializer(torch.Tensor, serializer=_tensor_to_numpy, deserializer=_tensor_from_numpy)


def _died(e: BaseException) -> str:
    """One line from Ray's (long) actor-death message."""
    text = str(e)
    for marker in ("Worker exit detail: ", "The actor is dead because "):
        if marker in text:
            return "Ray actor died: " + text.split(marker, 1)[1].split("\n", 1)[0].split(". ", 1)[0].strip()
    return "Ray actor died: " + (text.strip().splitlines() or [type(e).__name__])[-1]


class RayRanks(GroupRanks):
    def __init__(self, backend: RayBackend, name: str, specs: list[RankSpec]):
        self.name, self._backend = name, backend
        self.pids: list[int | None] = [None] * len(specs)  # known once each rank has started
        self._lock = threading.Lock()  # driver threads (channel waits checking liveness) read results together
        self._pending: dict[Any, tuple[int, int]] = {}  # ObjectRef of a call -> (call id, rank)
        self._dead: list[str | None] = [None] * len(specs)
        self._watch_checked = 0.0
        self._stopping = False
        self._stop_refs: list = []
        self.actors = []
        for spec in specs:
            node_id = backend.nodes[spec.node]["NodeID"]
            # num_gpus=0: the Cluster chose the rank's GPUs; start() sets CUDA_VISIBLE_DEVICES over Ray's own value
            self.actors.append(_RankActor.options(
                num_cpus=CPU_SHARE, num_gpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote())
        master = self.actors[0].rendezvous.remote()  # resolved by Ray before any start() runs
        self._watch = [a.watch.remote() for a in self.actors]
        for spec, actor in zip(specs, self.actors, strict=True):
            # a Ray worker's environment is its raylet's, not the driver's: hand over the driver's fault plan
            spec.env.setdefault(faults.ENV_VAR, os.environ.get(faults.ENV_VAR, ""))
            self._pending[actor.start.remote(pickle.dumps(spec), master)] = (0, spec.rank)

    def submit(self, ranks: list[int], call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        for r in ranks:
            ref = self.actors[r].call.remote(method, args, kwargs)  # the call id stays here (a Ray arg costs ~0.1 ms)
            with self._lock:
                self._pending[ref] = (call_id, r)

    def results(self, block_s: float = 0.0) -> list[Result]:
        with self._lock:
            refs = list(self._pending) if ray.is_initialized() else []  # (a Ray call now would start a new Ray)
        if not refs:
            time.sleep(block_s)
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=block_s)  # ray.wait costs ~5 us
        if not ready:
            return []
        if len(refs) > 1:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out = []
        with self._lock:
            ready = [ref for ref in ready if ref in self._pending]  # another driver thread may have taken some
            try:  # one ray.get for all (~50 us each); a failed one makes us read them one by one
                values = dict(zip(ready, ray.get(ready, timeout=_ANSWER_S), strict=True))
            except Exception:
                values = {}
            for ref in ready:
                call_id, rank = self._pending.pop(ref)
                try:
                    value = values[ref] if ref in values else ray.get(ref, timeout=_ANSWER_S)
                except ray.exceptions.RayActorError as e:  # the rank is gone: exit_status reports it
                    self._dead[rank] = self._dead[rank] or _died(e)
                    continue
                except Exception as e:  # e.g. a result Ray could not pickle: the call's failure
                    out.append((call_id, rank, False, f"{type(e).__name__}: {e}"))
                    continue
                if call_id == 0:
                    value, self.pids[rank] = value
                    out.append(value)
                else:
                    out.append((call_id, rank, *value))
        return out

    def exit_status(self, rank: int) -> str | None:
        if self._stopping or not ray.is_initialized():
            return None
        now = time.monotonic()
        if self._dead[rank] is None and now - self._watch_checked > WATCH_EVERY_S:
            self._watch_checked = now
            ended, _ = ray.wait(self._watch, num_returns=len(self._watch), timeout=0)
            for r, ref in enumerate(self._watch):
                if ref in ended and self._dead[r] is None:
                    try:
                        ray.get(ref, timeout=_ANSWER_S)
                        self._dead[r] = "Ray actor ended"  # watch() never returns: cannot happen
                    except Exception as e:
                        self._dead[r] = _died(e)
        return self._dead[rank]

    def request_stop(self) -> None:
        self._stopping = True
        if not ray.is_initialized():  # the session is gone, and the actors with it
            return
        # queued behind the current call: the worker closes (envs, shared buffers) and the actor stays, idle
        self._stop_refs = [a.stop.remote() for r, a in enumerate(self.actors) if self._dead[r] is None]

    def finish_stop(self, deadline: float) -> None:
        if not ray.is_initialized():
            return
        if self._stop_refs:
            ray.wait(self._stop_refs, num_returns=len(self._stop_refs), timeout=max(0.0, deadline - time.monotonic()))
        self.kill_actors()
        # watch() fails once its actor is really gone: wait for that, so that no actor outlives the group
        ray.wait(self._watch, num_returns=len(self._watch), timeout=5.0)

    def kill(self) -> None:
        """The second Ctrl-C (the driver exits right after): kill every actor and stop the Ray instance we started,
        whose agents would otherwise outlive an os._exit."""
        self.kill_actors()
        self._backend.shutdown()

    def kill_actors(self) -> None:
        self._stopping = True
        if not ray.is_initialized():  # the backend shut down already
            return
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except ValueError:  # not an actor handle any more (already gone)
                pass


# ---------------------------------------------------------------------------------------------------------------------
# Inside a rank's actor


def _ifname_of(ip: str) -> str | None:
    """The network interface that holds `ip` (Linux), for gloo/NCCL: they would otherwise pick one by hostname."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == ip:
            return name
    return None


@ray.remote(concurrency_groups={"watch": 1})
class _RankActor:
    """One rank. Calls run in the default concurrency group (one at a time, in order); `watch` has its own thread."""

    def __init__(self):
        self.worker = None  # nothing else here: torch is imported in start(), after the environment is set

    def rendezvous(self) -> tuple[str, str]:
        """(this node's IP, a port free on it) for the group's collective (called on rank 0)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, str(s.getsockname()[1])

    def start(self, spec_bytes: bytes, master: tuple[str, str]) -> tuple[Result, int]:
        # must stay False (tests check that pinning came first): CUDA reads CUDA_VISIBLE_DEVICES when it initializes
        cuda_before_pinning = "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()
        spec: RankSpec = pickle.loads(spec_bytes)  # bytes, so that Ray's unpickling of the arguments imports nothing
        ip, port = master
        env = {**spec.env, "MASTER_ADDR": ip, "MASTER_PORT": port, "LOCAL_RANK": "0",
               NODE_ENV: ray.get_runtime_context().get_node_id()}
        # gloo and NCCL pick an interface by hostname unless told: tell them the one that holds the master's IP
        ifname = _ifname_of(ip)
        if ifname:
            env = {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname, **os.environ, **env}
        os.environ.update(env)
        if spec.cores and set(spec.cores) <= os.sched_getaffinity(0):  # the Cluster counted this machine's cores
            os.sched_setaffinity(0, spec.cores)
        self.rank = spec.rank
        try:
            import torch

            from rlinf_mini.scheduler.collective import TorchDistCollective
            from rlinf_mini.scheduler.worker import build_worker

            use_numpy_for_tensors()
            if spec.cores:
                torch.set_num_threads(len(spec.cores))
            device = torch.device("cuda:0" if spec.gpus else "cpu")
            self.worker = build_worker(spec, device, lambda timeout_s: TorchDistCollective(
                spec.rank, spec.world_size, device, timeout_s))
            self.worker._cuda_before_pinning = cuda_before_pinning
            return (0, spec.rank, True, None), os.getpid()
        except BaseException:
            import traceback

            return (0, spec.rank, False, traceback.format_exc()), os.getpid()

    def call(self, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        from rlinf_mini.scheduler.worker import run_call

        return run_call(self.worker, method, args, kwargs)

    def stop(self) -> None:
        if self.worker is not None:
            worker, self.worker = self.worker, None
            worker.close()

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Never returns: Ray fails this call when the actor dies, and the driver reads the death from it."""
        while True:
            time.sleep(3600)


# ---------------------------------------------------------------------------------------------------------------------
# Channels: keyed queues in one async actor, items in the object store


@ray.remote
class _ChannelActor:
    """Every channel's keyed queues (RLinf: ChannelWorker). Holds ObjectRefs (wrapped in a list, so Ray passes them
    through instead of resolving them), never the items.

    An async actor may run two calls of one caller out of order (measured: a swap after ~140 puts). A pipelined put
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
            return ray.get(ref, timeout=wait_s + _ANSWER_S)
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
            return True, ray.get(wrapped[0], timeout=_ANSWER_S)
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


def _channel_actor(node_id: str | None, create: bool = True):
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
                                 scheduling_strategy=strategy).remote()


def weights_mailbox() -> RayQueues:
    """Inside a rank: an unbounded channel in the run's queue actor, for weights sent to a rank on another node
    (stages/sync.py keys it by the receiver's buffer)."""
    actor = _channel_actor(None)
    ray.get(actor.create.remote("_weights", 0), timeout=_ANSWER_S)  # False when another rank made it: the same
    return RayQueues("_weights", actor, 0)
