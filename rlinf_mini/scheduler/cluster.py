"""Cluster: the devices and nodes a run has, the backend that starts ranks on them, and the run's cleanup.

    cluster = Cluster(cfg.cluster)     # cfg.cluster.num_devices devices over cfg.cluster.num_nodes nodes
    ...                                # WorkerGroup.launch(cluster, ...) asks rank_spec() for each rank
    cluster.shutdown()                 # stops every group and the backend, removes the run's shared memory

Devices are numbered globally, as in RLinf: node n holds devices n*D ... n*D + D - 1 (D = num_devices / num_nodes).
A rank placed on GPU device d gets CUDA_VISIBLE_DEVICES set to the d-th entry of the driver's own CUDA_VISIBLE_DEVICES
(index or UUID, as the user gave it) before torch is imported in it, so inside it its GPU is cuda:0 (RLinf binds GPUs
the same way, through environment variables); when the placement names more devices than there are GPUs, device d
uses GPU d mod the GPU count (scheduler/devices.py decides). Without GPUs, a node's CPU cores are split evenly over its
D virtual devices; a rank on virtual device d is pinned to that device's cores. A rank's torch thread count comes from
its placement alone (devices.rank_threads), on every backend and device type, so that the same config gives the same
float sums on one node or several, whatever CPUs each has. So the same YAML runs on a laptop and on a GPU box, and on
one backend or another (`cluster.backend`: backend.py).

RLinf counterpart: `rlinf/scheduler/cluster/cluster.py::Cluster` (a Ray-based singleton with node probes and manager
actors). Left out: node groups, heterogeneous nodes.
"""

from __future__ import annotations

import atexit
import os
import time

from rlinf_mini.config import ClusterConfig
from rlinf_mini.scheduler import devices, shm
from rlinf_mini.scheduler.backend import Backend, RankSpec
from rlinf_mini.scheduler.placement import ProcessPlacement


def make_backend(cfg: ClusterConfig, preload: tuple[str, ...] = (), gpus_per_node: int = 0) -> Backend:
    """The backend `cluster.backend` names (imported here, so a run pays only for the one it uses). `gpus_per_node`:
    the GPUs each node needs (the Ray backend checks its cluster has them)."""
    if cfg.backend == "inline":
        from rlinf_mini.scheduler.inline import InlineBackend

        return InlineBackend(cfg.timeout_s)
    if cfg.backend == "ray":
        from rlinf_mini.scheduler.ray_backend import RayBackend

        return RayBackend(cfg, gpus_per_node)
    from rlinf_mini.scheduler.local import LocalBackend

    return LocalBackend(cfg.timeout_s, preload, spin=cfg.channel_wait == "spin",
                        fork_server=cfg.rank_start == "forkserver", all_reduce=cfg.all_reduce)


class Cluster:
    def __init__(self, cfg: ClusterConfig, preload: tuple[str, ...] = (),
                 device_plan: devices.DevicePlan | None = None):
        """`preload`: modules every rank will import (the model's, say); the local backend's fork server imports
        them once, if this cluster is the one that starts it (one server per driver process: scheduler/local.py).
        `device_plan`: the run's every rank (train.py's RunPlan), from which a rank's share of its GPU is counted (a
        Cluster without it gives each rank its GPUs whole)."""
        import torch

        self.cfg = cfg
        self.num_gpus = torch.cuda.device_count()
        self.device_type = "cuda" if self.num_gpus else "cpu"
        self.visible_gpus = devices.visible_gpus(os.environ, self.num_gpus)  # the driver's GPUs, as the user named them
        self.num_devices = devices.resolve_num_devices(cfg.num_devices, self.num_gpus)  # -1: every visible GPU
        self.num_nodes = cfg.num_nodes
        self.devices_per_node = self.num_devices // cfg.num_nodes
        self.timeout_s = cfg.timeout_s
        self.run_id = shm.new_run_id()
        shm.sweep_dead_runs()  # segments of earlier runs whose driver was killed (kill -9 leaves them behind)
        os.environ["RLINF_MINI_RUN_ID"] = self.run_id  # the driver's own channel segments carry the run id too
        self.groups: list = []
        self._cores = sorted(os.sched_getaffinity(0))
        self._closed = False
        self._gpu_ranks = devices.ranks_per_gpu(*device_plan.rank_devices(), max(1, self.devices_per_node)) \
            if device_plan is not None else None
        gpus_per_node = min(self.devices_per_node, len(self.visible_gpus)) if self.device_type == "cuda" else 0
        self.backend = make_backend(cfg, preload, gpus_per_node)
        atexit.register(self.shutdown)

    def device_cores(self, device: int) -> list[int]:
        """The CPU cores of virtual device `device` on its node: an even share, or one shared core when the node's
        devices outnumber its cores (every node is taken to have this machine's cores)."""
        n, d, local = len(self._cores), self.devices_per_node, device % self.devices_per_node
        if d >= n:
            return [self._cores[local % n]]
        return self._cores[local * n // d : (local + 1) * n // d]

    def rank_spec(self, group, placement: ProcessPlacement) -> RankSpec:
        """Where and how one rank of `group` starts: its node, its GPUs or CPU cores, its environment."""
        node = placement.devices[0] // self.devices_per_node
        env = {"RANK": str(placement.rank), "WORLD_SIZE": str(group.world_size), "RLINF_MINI_GROUP": group.name,
               "RLINF_MINI_RUN_ID": self.run_id}
        gpus: tuple[str, ...] = ()
        cores: tuple[int, ...] = ()
        if self.device_type == "cuda":
            env |= devices.rank_device_env(placement.devices, self.num_devices, self.visible_gpus)
            gpus = tuple(env["CUDA_VISIBLE_DEVICES"].split(","))
        else:
            cores = tuple(sorted({c for d in placement.devices for c in self.device_cores(d)}))
            env["CUDA_VISIBLE_DEVICES"] = ""
        threads = devices.rank_threads(placement.devices, self.cfg.threads_per_device)
        counts = self._gpu_ranks if self._gpu_ranks is not None else {(node, g): 1 for g in gpus}
        share = devices.gpu_share(gpus, node, counts)
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        # OpenMP threads spin after each parallel region by default; with several processes sharing cores that
        # spinning starves the others (docs/performance.md). Passive threads sleep instead.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        return RankSpec(group_name=group.name, rank=placement.rank, world_size=group.world_size,
                        cls_module=group.cls.__module__, cls_name=group.cls.__qualname__, cfg=group.cfg,
                        args=group.args, devices=placement.devices, node=node, gpus=gpus, cores=cores, threads=threads,
                        gpu_share=share, env=env)

    def check_workers(self) -> None:
        """Raise if any rank of any group has ended (a rank only ends when told to), or if any pending call of any
        group failed."""
        for group in self.groups:
            group._check_alive()
        for group in self.groups:  # a call that failed in another group ends this wait too
            if not group._closed:
                group._drain()
                group._raise_failed_call()

    def kill_now(self) -> None:
        """The second Ctrl-C: kill every rank at once and remove the run's shared memory (no grace period)."""
        for group in self.groups:
            group._ranks.kill()
        shm.sweep(self.run_id)

    def shutdown(self) -> None:
        """Stop every worker group and the backend, and remove the run's shared memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # All groups stop together, so a worker stuck in a channel get costs one grace period, not one per group.
        for group in self.groups:
            group.request_stop()
        self.backend.shutdown()  # closes the channels: a rank blocked in a get ends it now, not at the deadline
        deadline = time.monotonic() + 3.0
        for group in self.groups:
            group.finish_stop(deadline)
        from rlinf_mini.scheduler import codec

        codec.close_process_resources()
        shm.sweep(self.run_id)
        if os.environ.get("RLINF_MINI_RUN_ID") == self.run_id:
            del os.environ["RLINF_MINI_RUN_ID"]
        atexit.unregister(self.shutdown)
