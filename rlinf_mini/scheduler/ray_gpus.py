"""The Ray backend's GPUs: Ray decides which physical GPU each of the placement's GPUs is, and the ranks pin that.

    gpus = RayGpus(timeout_s)
    gpus.reserve([(node_id, entry), ...])   # the placement's GPUs: Ray node id, the driver's CUDA_VISIBLE_DEVICES entry
    gpus.strategy(node_id, entry)           # the scheduling strategy of a rank whose first GPU that is
    gpus.assigned(node_id, entry)           # the GPU Ray reserved for it, as the node names it ('1')
    gpus.release()

- One placement group per GPU of the placement, of one bundle {"GPU": 1}, held to its node (Ray's `ray.io/node-id`
  label). Ray reserves a whole GPU for it, one no other job holds, and which one is Ray's choice: on a node where
  another job took GPU 0, the placement's GPU 0 is GPU 1 (tests/test_ray.py).
- A rank runs in the bundle of its first GPU, asking for its share (`num_gpus` = 1 / the run's ranks on that GPU:
  devices.gpu_share), so the ranks the placement puts on one GPU are on one physical GPU, and ranks it keeps apart
  are apart (the sync path, CUDA IPC or a host copy, is chosen from the placement). Ray packs bare fractional
  requests by its own rule and could put two of them together; a bundle per GPU leaves it no such choice.
- Which GPU a bundle holds is fixed when Ray commits it: a zero-CPU task in the bundle reads `ray.get_gpu_ids()`
  once; the ranks start with CUDA_VISIBLE_DEVICES set to it (a rank that owns several GPUs: each one's bundle's).
- The groups go with the run (release(); Ray removes a job's groups when its driver dies).

RLinf counterpart: none; RLinf asks Ray for no GPU and pins the placement's (veRL's RayResourcePool reserves a bundle
per GPU the same way).
"""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=0)
def _bundle_gpu() -> str:
    ids = ray.get_gpu_ids()  # [1]: the one GPU of the bundle this task runs in
    return str(ids[0])


class RayGpus:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._groups: dict[tuple[str, str], tuple] = {}  # (node id, entry) -> (placement group, Ray's GPU id)

    def reserve(self, keys: list[tuple[str, str]]) -> None:
        """A GPU bundle for each (node id, entry) not reserved yet, all asked for at once; raises if Ray has not
        granted them all within the timeout (TimeoutError: another job holds the GPUs; the ones granted go back)."""
        new = [k for k in dict.fromkeys(keys) if k not in self._groups]
        if not new:
            return
        groups = [placement_group([{"GPU": 1}], bundle_label_selector=[{"ray.io/node-id": node}]) for node, _ in new]
        refs = [g.ready() for g in groups]
        ready, _ = ray.wait(refs, num_returns=len(groups), timeout=self.timeout_s)
        if len(ready) < len(groups):
            for g in groups:
                remove_placement_group(g)
            missing = [f"GPU {entry} of node {node[:8]}" for (node, entry), ref in zip(new, refs, strict=True)
                       if ref not in ready]
            raise TimeoutError(f"Ray reserved no GPU for {', '.join(missing) or 'the placement'} within "
                               f"cluster.timeout_s={self.timeout_s:g} s: another job holds the node's GPUs")
        probes = [_bundle_gpu.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(g, 0)).remote()
                  for g in groups]
        for key, group, gpu in zip(new, groups, ray.get(probes, timeout=self.timeout_s), strict=True):
            self._groups[key] = (group, gpu)

    def strategy(self, node: str, entry: str) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(self._groups[(node, entry)][0], placement_group_bundle_index=0)

    def assigned(self, node: str, entry: str) -> str:
        return self._groups[(node, entry)][1]

    def release(self) -> None:
        groups, self._groups = self._groups, {}
        for group, _ in groups.values():
            remove_placement_group(group)
