"""The Ray backend's ranks: one Ray actor per rank, on one machine or the nodes of a Ray cluster (RLinf's way).

- Which Ray: `ray_address()`. '' follows ray.init's rule: RAY_ADDRESS (what `ray job submit` and KubeRay set), else
  the cluster Ray's temp folder names (`ray start --head`), if it answers; else a private instance, stopped at the end.
- Nodes: node index n (RankSpec.node) is the n-th alive Ray node, the driver's first, then by node id; a config that
  needs more nodes or GPUs than the cluster has is one line (ConfigError) before any actor starts.
- Ranks: a `RankActor` (ray_rank_actor.py) pinned to its node with a token CPU share; on GPUs, in the Ray bundle
  of its first GPU with its share of it (`num_gpus`), pinned to the GPU Ray reserved there (ray_gpus.py); `start()`
  sets spec.env (CUDA_VISIBLE_DEVICES, RANK, OMP_*, ...) before torch. A group call is one actor call per rank,
  collected with ray.wait; a never-returning `watch()` call, which Ray fails when the actor dies, is how exit_status
  sees a death.
- Collective: MASTER_ADDR/PORT from rank 0's `rendezvous()`, handed to every `start()` as an ObjectRef.
- Channels, by one rule: a one-node run (cluster.num_nodes 1: every rank pinned to the driver's node) uses the local
  backend's kernel queues (kernel_queues.py: a ChannelServer in the driver, socketpairs handed to each rank's actor
  process, large tensors through the codec's shared memory), which no Ray call is in; a run on more nodes uses the
  queue actor (scheduler/ray_channel.py), which every node reaches. (embodied_mlp's whole step, ray / local: 0.28
  through the queue actor, 1.23 [0.94-1.44] this way, under load: benchmarks/ray_backend.py --step.) The same rule
  picks the ranks' weight mailbox (stages/sync.py): a one-node run's is a kernel-queue channel of the driver's
  server, handed to each rank's start(). Rank actors run at the driver's niceness (ray_channel.at_our_niceness).

RLinf counterpart: `rlinf/scheduler/cluster/cluster.py` (ray.init, node order), `worker/worker_group.py` (one actor
per rank, node affinity, env vars). Left out: node groups, per-method concurrency. Differs: RLinf asks Ray for no
GPU and pins the placement's.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_mini.config import ConfigError
from rlinf_mini.scheduler import faults
from rlinf_mini.scheduler.backend import Backend, GroupRanks, RankSpec, Result
from rlinf_mini.scheduler.kernel_queues import MAX_BOUND, ChannelServer, KernelQueues, close_transport_resources
from rlinf_mini.scheduler.ray_channel import (
    ANSWER_S,
    WEIGHTS_CHANNEL,
    RayQueues,
    at_our_niceness,
    channel_actor,
    use_numpy_for_tensors,
)
from rlinf_mini.scheduler.ray_gpus import RayGpus
from rlinf_mini.scheduler.ray_rank_actor import RankActor

CPU_SHARE = 0.01  # Ray CPUs per rank: a token, so placement never waits for CPU accounting (pinning is by spec.env)
WATCH_EVERY_S = 0.05  # exit_status asks Ray about the watch calls at most this often
_ANSWER_S = ANSWER_S


def _import_roots() -> str:
    """The driver's own import roots (a checkout, tests/), so that a Ray worker imports the classes the driver names
    (site-packages is the workers' already)."""
    roots = [p or os.getcwd() for p in sys.path]  # "": the current directory
    roots = [p for p in roots if os.path.isdir(p) and "-packages" not in p and not p.startswith(sys.base_prefix)]
    roots += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(os.path.abspath(p) for p in roots))


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something listens at HOST:PORT (a Ray cluster's GCS)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def ray_address(configured: str, environ) -> tuple[str, str | None]:
    """(what to hand ray.init, a note for the user or None). `configured` ('auto', HOST:PORT) goes to Ray as it is;
    '' is ray.init's own rule: RAY_ADDRESS, else the address in Ray's temp folder (ray_current_cluster, written by
    `ray start --head`) if a cluster answers there, else 'local': a private instance. A killed `ray start` or test
    cluster leaves that file naming a dead address, which ray.init would try to join: such a file is passed over."""
    if configured:
        return configured, None
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"], None
    from ray._common.utils import get_ray_address_file

    path = get_ray_address_file(None)  # honours RAY_TMPDIR / TMPDIR, as ray.init does
    try:
        with open(path) as f:
            named = f.read().strip()
    except OSError:
        return "local", None
    if named and _answers(named):
        return named, None
    return "local", f"note: {path} names {named or 'nothing'}, where no Ray cluster answers: a private Ray instance"


class RayBackend(Backend):
    name = "ray"

    def __init__(self, cfg, gpus_per_node: int = 0):
        """`gpus_per_node`: the GPUs each node needs for the placement (0 on CPU devices)."""
        self.timeout_s = cfg.timeout_s
        self._joined = False  # we called ray.init (and so call ray.shutdown at the end)
        if not ray.is_initialized():  # else the caller's session (a test's, a notebook's): used, and left alone
            address, note = ray_address(cfg.ray_address, os.environ)
            if note:
                print(note, file=sys.stderr)
            common = dict(runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}}, logging_level="WARNING",
                          log_to_driver=True)
            if address == "local":
                ray.init(address="local", include_dashboard=False, object_store_memory=1 << 30, **common)
            else:  # a running cluster: ray.shutdown() only disconnects from it
                if ":" in address and "://" not in address and not _answers(address):  # Ray retries for minutes
                    named = "cluster.ray_address" if cfg.ray_address else "RAY_ADDRESS"
                    raise ConfigError(f"{named}: no Ray cluster answers at {address}")
                ray.init(address=address, **common)
            self._joined = True
        try:
            self.nodes = self._node_order()
            self._check_capacity(cfg, gpus_per_node)
        except BaseException:
            self.shutdown()
            raise
        use_numpy_for_tensors()
        self.groups: list[RayRanks] = []
        self.gpus = RayGpus(cfg.timeout_s)  # the placement's GPUs, reserved as each group launches
        self._channels = None  # the queue actor, made at the first channel that needs it
        self._channel_names: set[str] = set()
        # every rank on the driver's node (node 0 is the driver's: _node_order): channels in kernel queues, served
        # by this driver, and the ranks' weight mailbox among them (None: weights_mailbox() in the queue actor)
        self.same_node_channels = cfg.num_nodes == 1  # (benchmarks set it False to measure the queue actor here)
        self._channel_server: ChannelServer | None = None
        self.weights_mailbox: KernelQueues | None = None
        if self.same_node_channels:
            self._channel_server = ChannelServer()
            self._channel_server.create(WEIGHTS_CHANNEL, 0)  # unbounded: a notice per sync, taken at once
            self.weights_mailbox = KernelQueues(WEIGHTS_CHANNEL, self._channel_server.address,
                                                self._channel_server.authkey, cfg.timeout_s)
            self._channel_names.add(WEIGHTS_CHANNEL)

    def _check_capacity(self, cfg, gpus_per_node: int) -> None:
        """One line, before any actor starts, when the Ray cluster lacks the nodes or GPUs the config asks for (an
        actor asking Ray for a GPU no node has would wait for ever)."""
        where = f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
        if len(self.nodes) < cfg.num_nodes:
            raise ConfigError(f"cluster.num_nodes: {cfg.num_nodes}, but {where} has {len(self.nodes)} alive node(s)")
        for n, node in enumerate(self.nodes[:cfg.num_nodes]):
            has = node["Resources"].get("GPU", 0)
            if has < gpus_per_node:
                raise ConfigError(f"cluster.num_devices: the placement needs {gpus_per_node} GPU(s) on each of "
                                  f"{cfg.num_nodes} node(s), but Ray node {n} ({node['NodeManagerAddress']}) of "
                                  f"{where} has {has:g}")

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

    def channel_transport(self, name: str, maxsize: int, default_timeout: float) -> KernelQueues | RayQueues:
        if name in self._channel_names:
            raise ValueError(f"channel {name!r} already exists")
        if self.same_node_channels and maxsize <= MAX_BOUND:  # (a larger bound: the queue actor holds it)
            self._channel_server.create(name, maxsize)
            self._channel_names.add(name)
            return KernelQueues(name, self._channel_server.address, self._channel_server.authkey, default_timeout)
        if self._channels is None:
            self._channels = channel_actor(self.nodes[0]["NodeID"])
        actor = self._channels
        if not ray.get(actor.create.remote(name, maxsize), timeout=_ANSWER_S + 60):  # the first call waits its start
            raise ValueError(f"channel {name!r} already exists")
        self._channel_names.add(name)
        return RayQueues(name, actor, maxsize)

    def shutdown(self) -> None:
        # Idempotent, and never calls Ray once the session is gone: any Ray call would start a new local instance
        # (Ray's auto-init), e.g. from the second Ctrl-C, where every group's kill() ends up here.
        if getattr(self, "_channel_server", None) is not None:  # a rank blocked in a get sees EOF and ends it
            self._channel_server.close()
            self._channel_server = None
            close_transport_resources()
        if getattr(self, "_closed", False) or not ray.is_initialized():
            return
        self._closed = True
        for ranks in getattr(self, "groups", []):
            ranks.kill_actors()
        if getattr(self, "gpus", None) is not None:
            self.gpus.release()
        if getattr(self, "_channels", None) is None:
            self._channels = channel_actor(None, create=False)  # a rank may have made it (weights_mailbox)
        if getattr(self, "_channels", None) is not None:
            ray.kill(self._channels)
            self._channels = None
        if self._joined:
            ray.shutdown()  # a private instance stops (its raylet, GCS, workers); a joined cluster is only left
            self._joined = False


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
        backend.gpus.reserve([(backend.nodes[s.node]["NodeID"], g) for s in specs for g in s.gpus])
        for spec in specs:
            node_id = backend.nodes[spec.node]["NodeID"]
            where = dict(num_cpus=CPU_SHARE, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
            if spec.gpus:  # in its first GPU's bundle, pinned to the GPUs Ray reserved (ray_gpus.py)
                where = dict(num_cpus=0, num_gpus=spec.gpu_share, scheduling_strategy=backend.gpus.strategy(
                    node_id, spec.gpus[0]))
                spec.env["CUDA_VISIBLE_DEVICES"] = ",".join(backend.gpus.assigned(node_id, g) for g in spec.gpus)
            self.actors.append(RankActor.options(max_restarts=0, runtime_env=at_our_niceness(), **where).remote())
        master = self.actors[0].rendezvous.remote()  # resolved by Ray before any start() runs
        self._watch = [a.watch.remote() for a in self.actors]
        for spec, actor in zip(specs, self.actors, strict=True):
            # a Ray worker's environment is its raylet's, not the driver's: hand over the driver's fault plan
            spec.env.setdefault(faults.ENV_VAR, os.environ.get(faults.ENV_VAR, ""))
            self._pending[actor.start.remote(pickle.dumps(spec), master, backend.weights_mailbox)] = (0, spec.rank)

    def submit(self, ranks: list[int], call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        for r in ranks:
            ref = self.actors[r].call.remote(method, args, kwargs)  # the call id stays here: one argument less
            with self._lock:
                self._pending[ref] = (call_id, r)

    def results(self, block_s: float = 0.0) -> list[Result]:
        with self._lock:
            refs = list(self._pending) if ray.is_initialized() else []  # (a Ray call now would start a new Ray)
        if not refs:
            time.sleep(block_s)
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=block_s)  # ray.wait is cheap: it asks no worker
        if not ready:
            return []
        if len(refs) > 1:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out = []
        with self._lock:
            ready = [ref for ref in ready if ref in self._pending]  # another driver thread may have taken some
            try:  # one ray.get for all (each ray.get is a round trip); a failed one makes us read them one by one
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
