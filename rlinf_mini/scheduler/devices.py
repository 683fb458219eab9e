"""Device decisions, as pure functions: which GPU a rank gets, which collective its group uses, how weights move.

    visible = visible_gpus(os.environ, torch.cuda.device_count())   # the parent's GPUs, as the user named them
    rank_device_env((0,), num_devices=2, visible=["4", "5"])        # {"CUDA_VISIBLE_DEVICES": "4"}
    collective_backend([("4",), ("4",)])                            # ("gloo", "ranks 0 and 1 share GPU 4: ...")
    device_plan(strategies, num_devices=2, num_gpus=8)              # all of it for one placement: --explain, tests

Device d of `component_placement` is GPU d of the parent's visible GPUs (d mod their count when the config names
more devices than there are GPUs), so `CUDA_VISIBLE_DEVICES=4,5 python -m rlinf_mini.train` runs on physical GPUs
4 and 5, and UUID entries pass through unchanged. Nothing here starts a process or imports torch: the driver,
`--explain` and the tests call it with a GPU count, real or faked.

RLinf counterpart: `rlinf/scheduler/hardware/accelerators/nvidia_gpu.py::get_accelerator_env_var` (binding by
CUDA_VISIBLE_DEVICES), the IPC-or-NCCL choice of `rlinf/scheduler/collective/`. Left out: other accelerators, nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlinf_mini.scheduler.placement import PlacementStrategy

CPU_DEFAULT_DEVICES = 2  # cluster.num_devices = -1 on a machine without a GPU: two shares of the CPU cores


def rank_threads(placement_devices: tuple[int, ...], threads_per_device: int) -> int:
    """torch's intra-op threads (and OMP/MKL's) for a rank placed on `placement_devices`, on any backend, node and
    device type: `cluster.threads_per_device` per device, never the node's core count. A float sum split over 2
    threads is not the 1-thread sum (embodied_mlp's eval/return at step 0: 0.00928457360714674 with 1,
    ...174450159 with 2), so a count from the node would give other bits on 2 nodes, or on nodes with other CPU
    shares."""
    return threads_per_device * len(placement_devices)


def ranks_per_gpu(rank_devices: list[tuple[int, ...]], rank_gpus: list[tuple[str, ...]],
                  devices_per_node: int) -> dict[tuple[int, str], int]:
    """How many ranks of the run use each GPU, by (node, CUDA_VISIBLE_DEVICES entry): rank r is on devices
    rank_devices[r] (node = its first device // devices_per_node) and GPUs rank_gpus[r]."""
    counts: dict[tuple[int, str], int] = {}
    for devs, gpus in zip(rank_devices, rank_gpus, strict=True):
        for g in gpus:
            key = (devs[0] // devices_per_node, g)
            counts[key] = counts.get(key, 0) + 1
    return counts


def gpu_share(gpus: tuple[str, ...], node: int, counts: dict[tuple[int, str], int]) -> float:
    """The share of its first GPU a rank asks Ray for (`num_gpus`, in that GPU's bundle: ray_gpus.py): 1 / the run's
    ranks on it, rounded down to Ray's resolution (1e-4) so that the shares of one GPU sum to at most 1. Its other
    GPUs (a rank that owns several) are the run's by their bundles' reservation. 0 on CPU devices, or for a GPU the
    counts do not hold."""
    n = counts.get((node, gpus[0])) if gpus else None
    return int(10_000 / n) / 10_000 if n else 0.0


def visible_gpus(environ: Mapping[str, str], gpu_count: int) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs), in CUDA's order.

    `gpu_count` is what CUDA reports (torch.cuda.device_count()); it already honours CUDA_VISIBLE_DEVICES, and CUDA
    ignores the entries after an invalid one, so the list is cut to that count."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return [str(i) for i in range(gpu_count)]
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    return entries[:gpu_count]


def resolve_num_devices(num_devices: int, gpu_count: int) -> int:
    """cluster.num_devices as used: -1 means every visible GPU (RLinf: the GPUs are the devices), or 2 CPU shares."""
    if num_devices == -1:
        return gpu_count if gpu_count else CPU_DEFAULT_DEVICES
    return num_devices


def gpus_of_rank(devices: tuple[int, ...], visible: list[str]) -> tuple[str, ...]:
    """The GPUs (CUDA_VISIBLE_DEVICES entries) of a rank placed on `devices`: device d is visible[d mod count]; a
    rank that owns several devices sees each of their GPUs once, in device order. () without GPUs."""
    if not visible:
        return ()
    gpus: list[str] = []
    for d in devices:
        entry = visible[d % len(visible)]
        if entry not in gpus:
            gpus.append(entry)
    return tuple(gpus)


def rank_device_env(placement_devices: tuple[int, ...], num_devices: int, visible: list[str]) -> dict[str, str]:
    """The CUDA_VISIBLE_DEVICES a rank starts with: its GPUs' entries as the parent named them ('' = no GPU, so the
    rank's torch sees none and works on the CPU)."""
    out_of_range = [d for d in placement_devices if not 0 <= d < num_devices]
    if out_of_range:  # the placement parser rejects these first; a direct caller gets the same one line
        raise ValueError(f"device(s) {out_of_range} out of range for cluster.num_devices={num_devices}")
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus_of_rank(placement_devices, visible))}


def fewer_devices_note(num_devices: int, visible: list[str]) -> str | None:
    """One line when the config uses fewer devices than there are GPUs (said once, at start), else None."""
    if visible and num_devices < len(visible):
        return (f"note: cluster.num_devices = {num_devices} uses GPU(s) {','.join(visible[:num_devices])} of the "
                f"{len(visible)} visible; --cluster.num-devices {len(visible)} (or -1) uses them all")
    return None


def shared_gpu(rank_gpus: list[tuple[str, ...]]) -> tuple[int, int, str] | None:
    """The first two ranks whose GPUs overlap, and the GPU: (rank a, rank b, entry), or None."""
    owner: dict[str, int] = {}
    for rank, gpus in enumerate(rank_gpus):
        for g in gpus:
            if g in owner:
                return owner[g], rank, g
            owner[g] = rank
    return None


def collective_backend(rank_gpus: list[tuple[str, ...]], grad_bytes: int = 0) -> tuple[str, str]:
    """The torch.distributed backend of one group whose rank r runs on GPUs rank_gpus[r] (() = CPU), and why.

    NCCL needs one GPU per rank ("Duplicate GPU detected" otherwise); ranks sharing a GPU (collocated, or more
    devices than GPUs) all-reduce their CUDA tensors with gloo, which stages them through host memory."""
    if len(rank_gpus) <= 1:
        return "none", "one rank: no all-reduce"
    if not any(rank_gpus):
        return "gloo", "CPU tensors"
    shared = shared_gpu(rank_gpus)
    if shared is not None:
        a, b, g = shared
        cost = f"{grad_bytes / 1e6:.1f} MB" if grad_bytes else "the flat gradient"
        return "gloo", (f"ranks {a} and {b} share GPU {g} and NCCL refuses two ranks on one GPU: gloo all-reduces "
                        f"the CUDA tensors through host memory (a device->host and a host->device copy of {cost} "
                        f"per optimizer step)")
    return "nccl", "one GPU per rank"


def sync_path(actor_gpus: tuple[str, ...], rollout_gpus: tuple[str, ...], other_node: bool = False) -> str:
    """How actor rank 0's weights reach a rollout rank (stages/sync.py): 'shared buffer' on the CPU (the rollout's
    parameters live in shared memory), 'cuda ipc' on actor rank 0's own GPU (the actor copies device to device into
    the rollout's parameters), 'pinned host copy' on another GPU (device -> pinned shared buffer -> device), and from
    another node (Ray) through the object store."""
    if other_node:
        return "Ray object store (another node)"
    if not actor_gpus or not rollout_gpus:
        return "shared buffer"
    if rollout_gpus[0] == actor_gpus[0]:
        return "cuda ipc"
    return "pinned host copy"


# --------------------------------------------------------------------------------------------------------------------
# One config on a given number of GPUs


@dataclass(frozen=True)
class ComponentDevices:
    component: str
    devices: tuple[tuple[int, ...], ...]  # placement devices of each rank
    gpus: tuple[tuple[str, ...], ...]  # CUDA_VISIBLE_DEVICES entries of each rank; () = CPU


@dataclass(frozen=True)
class DevicePlan:
    num_gpus: int
    num_devices: int  # cluster.num_devices as resolved
    components: tuple[ComponentDevices, ...]
    collective: tuple[str, str]  # the actor group's (backend, why)
    sync: tuple[str, ...]  # path to each rollout rank
    note: str | None  # fewer devices than GPUs
    num_nodes: int = 1
    threads_per_device: int = 1  # cluster.threads_per_device

    def rank_devices(self) -> tuple[list[tuple[int, ...]], list[tuple[str, ...]]]:
        """Every rank of every component: (its devices, its GPUs), in the same order."""
        return ([d for c in self.components for d in c.devices], [g for c in self.components for g in c.gpus])

    def component(self, name: str) -> ComponentDevices:
        return next(c for c in self.components if c.component == name)

    def describe(self) -> list[str]:
        """The plan's lines for --explain."""
        where = f"{self.num_gpus} GPU(s)" if self.num_gpus else "no GPU: virtual CPU devices"
        lines = [f"devices: {self.num_devices} device(s) on {where}"]
        if self.num_nodes > 1:
            d = self.num_devices // self.num_nodes
            lines.append(f"  nodes: {self.num_nodes} (Ray: the driver's, then by node id): " + ", ".join(
                f"node {n} devices {n * d}-{n * d + d - 1}" for n in range(self.num_nodes)))
        lines.append(f"  torch threads per rank: {self.threads_per_device} per device it holds, on every node and "
                     "backend (cluster.threads_per_device)")
        for c in self.components:
            per_rank = ", ".join(f"{r}:{'+'.join(g) if g else 'cpu'}" for r, g in enumerate(c.gpus))
            lines.append(f"  {c.component} ranks -> GPU: {per_rank}")
        lines.append(f"  actor collective: {self.collective[0]} ({self.collective[1]})")
        lines.append(f"  weight sync to rollout ranks: {', '.join(self.sync)}")
        if self.note:
            lines.append(f"  {self.note}")
        return lines


def device_plan(strategies: dict[str, PlacementStrategy], num_devices: int, num_gpus: int,
                visible: list[str] | None = None, grad_bytes: int = 0, num_nodes: int = 1,
                threads_per_device: int = 1) -> DevicePlan:
    """Devices, the actor's collective and the weight-sync path of placed components (the strategies of
    stages/placement.py for `num_devices` devices: "env", "rollout", "actor", or "rollout", "reward", "actor" for
    reasoning) on `num_gpus` GPUs (0 = CPU).

    `visible` defaults to GPUs '0'..'num_gpus-1' (what an unset CUDA_VISIBLE_DEVICES means)."""
    visible = [str(i) for i in range(num_gpus)] if visible is None else visible[:num_gpus]

    def node_of(devs: tuple[int, ...]) -> int:
        return devs[0] // max(1, num_devices // num_nodes)

    comps = []
    for name in strategies:
        devs = tuple(p.devices for p in strategies[name].placements)
        comps.append(ComponentDevices(name, devs, tuple(gpus_of_rank(d, visible) for d in devs)))
    by_name = {c.component: c for c in comps}
    actor, rollout = by_name["actor"], by_name["rollout"]
    return DevicePlan(
        num_gpus=num_gpus, num_devices=num_devices, components=tuple(comps),
        collective=collective_backend(list(actor.gpus), grad_bytes),
        sync=tuple(sync_path(actor.gpus[0], g, node_of(d) != node_of(actor.devices[0]))
                   for g, d in zip(rollout.gpus, rollout.devices, strict=True)),
        note=fewer_devices_note(num_devices, visible), num_nodes=num_nodes, threads_per_device=threads_per_device)
