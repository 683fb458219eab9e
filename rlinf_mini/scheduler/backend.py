"""The backend interface: how ranks run and talk. `cluster.backend` picks one; the stages and runners never know which.

    local   scheduler/local.py        one torch.multiprocessing process per rank, pipes, kernel-queue channels (default)
    inline  scheduler/inline.py       every rank a thread of the driver: breakpoint() in a worker method stops there
    ray     scheduler/ray_backend.py  one Ray actor per rank, on one machine or several (cluster.num_nodes)

A backend implements four things, and nothing else differs between them:

1. Start a rank with its device: `Backend.launch(group, specs) -> GroupRanks`. `specs[r]` (a `RankSpec`, made by
   the Cluster) says which worker class to build with which arguments, on which node, devices and CPU cores, with which
   environment. Returns at once; the rank builds its worker and reports `(0, rank, ok, traceback)` as its first result.
2. Call a method on ranks and collect results or failures: `GroupRanks.submit(ranks, call_id, method, args,
   kwargs)` returns at once; `GroupRanks.results(block_s)` hands over the `Result`s that arrived, waiting up to
   `block_s` for the first. A rank runs its calls in order, one at a time (`run_call` in worker.py), and a call that
   raises is a result with ok=False and the traceback as value.
3. A channel transport: `Backend.channel_transport(name, maxsize, default_timeout) -> ChannelTransport`, the keyed
   queues behind one `Channel`, picklable into group calls (see channel.py for its three methods).
4. Liveness: `GroupRanks.exit_status(rank)` is None while the rank lives, else how it ended ("signal SIGKILL", "exit
   code 3", "Ray actor died: ..."); the Cluster polls it while the driver waits, so a death anywhere ends every wait.
   Stopping: `request_stop()` (finish the current call, close, exit), `finish_stop(deadline)` (then terminate and
   kill what is left), `kill()` (the second Ctrl-C: at once).

RLinf counterpart: RLinf has one backend, Ray (`rlinf/scheduler/worker/worker_group.py` creates Ray actors;
`rlinf/scheduler/channel/channel.py` keeps queues in a Ray actor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Result = tuple[int, int, bool, Any]  # (call id, rank, ok, value or traceback); call id 0 = the worker was built


@dataclass
class RankSpec:
    """Everything one rank needs to start, decided by the Cluster before any rank starts."""

    group_name: str
    rank: int
    world_size: int
    cls_module: str  # the worker class, by name: a spawned process or a Ray actor imports it
    cls_name: str
    cfg: Any
    args: tuple
    devices: tuple[int, ...]  # global device ids (over all nodes)
    node: int  # the node that holds them: device // devices_per_node
    gpus: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries of its GPUs on that node; () on CPU devices
    cores: tuple[int, ...] = ()  # CPU cores to pin to (CPU devices, local backend); () = no pinning
    # torch's intra-op threads (and OMP/MKL's): from the placement alone, never from the node's cores, since the
    # thread count decides how a float sum is split (2 threads instead of 1 changed eval/return at step 0)
    threads: int = 1
    gpu_share: float = 0.0  # Ray's num_gpus: its share of its first GPU (1 / the run's ranks on it)
    env: dict[str, str] = field(default_factory=dict)  # environment set before torch is imported in the rank


class GroupRanks:
    """A backend's handle on the ranks of one worker group."""

    pids: list[int | None]

    def submit(self, ranks: list[int], call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        raise NotImplementedError

    def results(self, block_s: float = 0.0) -> list[Result]:
        raise NotImplementedError

    def exit_status(self, rank: int) -> str | None:
        raise NotImplementedError

    def request_stop(self) -> None:
        raise NotImplementedError

    def finish_stop(self, deadline: float) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class Backend:
    name: str

    def launch(self, group, specs: list[RankSpec]) -> GroupRanks:
        raise NotImplementedError

    def channel_transport(self, name: str, maxsize: int, default_timeout: float):
        raise NotImplementedError

    def wait_note(self) -> str:
        """Anything the backend knows about why a wait is taking long, appended to the driver's timeout message."""
        return ""

    def shutdown(self) -> None:
        """Release what the backend holds in the driver (servers, queues, a Ray session it started)."""
