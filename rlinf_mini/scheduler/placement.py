"""The placement data types: what `stages/placement.py` produces from `cluster.component_placement` and what the
scheduler consumes (`WorkerGroup.launch` starts one rank per `ProcessPlacement`, `Cluster` maps its devices to GPUs or
CPU cores, and to nodes). Standard library only: the driver imports this before any process exists.

RLinf counterpart: `rlinf/scheduler/placement/placement.py` (`PlacementStrategy`, `FlexiblePlacementStrategy`'s
`hardware_ranks_list`) and `rlinf/utils/placement.py::PlacementMode`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PlacementMode(enum.Enum):
    COLLOCATED = "collocated"  # all components on the same devices; they take turns (offload/reload)
    DISAGGREGATED = "disaggregated"  # each component on its own devices; they overlap through pipelining
    HYBRID = "hybrid"  # some share, some do not (e.g. env | rollout pipelined, actor over both)


@dataclass(frozen=True)
class ProcessPlacement:
    rank: int  # rank of the process within its component's worker group
    devices: tuple[int, ...]  # device ids it runs on: one, or several when the process owns more than one


@dataclass(frozen=True)
class PlacementStrategy:
    """RLinf's FlexiblePlacementStrategy: the devices of each rank of one component, in rank order."""

    component: str
    placements: tuple[ProcessPlacement, ...]

    @property
    def world_size(self) -> int:
        return len(self.placements)

    def devices(self) -> set[int]:
        return {device for placement in self.placements for device in placement.devices}
