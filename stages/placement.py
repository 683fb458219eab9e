"""Stage 1 — placement: `cluster.component_placement` strings -> the devices of every rank, and the mode.

    placement = HybridComponentPlacement({"actor": "0-7", "env": "0-3", "rollout": "4-7"}, num_devices=8)
    placement.get_strategy("rollout").placements[1]   # ProcessPlacement(rank=1, devices=(5,))
    placement.placement_mode                          # PlacementMode.HYBRID
    print(placement.describe())                       # device 0: actor[0] env[0] ... / mode: hybrid

Input: the config's `cluster.component_placement` dict (component name(s) -> placement string) and the number of
devices (`cluster.num_devices`: GPUs, or shares of the CPU cores without GPUs). Output: one `PlacementStrategy` per
component, the device ids of each of its ranks, from which a worker group starts one process per rank; and the
`PlacementMode` of the whole layout (the data types live in `rlinf_mini/scheduler/placement.py`: the scheduler
consumes them). No torch: the driver imports this before any process exists.

Grammar (RLinf's, see the `ComponentPlacement` docstring there):

    key       := name ("," name)*              each name gets its own worker group; they share the devices
    value     := segment ("," segment)*
    segment   := devices [":" processes]
    devices   := "all" | int | int "-" int       ranges are inclusive; "all" is 0..num_devices-1
    processes := int | int "-" int               contiguous from 0 over all segments

    "all"          one process per device
    "3"            one process, on device 3
    "0-3"          4 processes, process p on device p
    "0,2,4-5"      4 processes, on devices 0, 2, 4 and 5
    "0-3:0-7"      8 processes, 2 per device: process p on device p // 2
    "0-3:0-1"      2 processes owning 2 devices each: (0, 1) and (2, 3)
    "0-1:0-3,2-3"  processes 0-3 on devices 0-1 (2 per device), then processes 4 and 5 on devices 2 and 3

In each segment the numbers of devices and processes must divide one another. Mode: all components on the same
device set -> COLLOCATED; pairwise disjoint sets -> DISAGGREGATED; anything else -> HYBRID.

RLinf counterparts: `rlinf/scheduler/placement/placement.py::ComponentPlacement` (the parser, `get_strategy`,
`get_world_size`, `get_hardware_ranks`, `components`, `placement_mode`); `rlinf/utils/placement.py::
HybridComponentPlacement` and `PlacementMode`; our `PlacementStrategy` is `FlexiblePlacementStrategy`
(`hardware_ranks_list`: the devices of each process). RLinf's HybridComponentPlacement always reports HYBRID; ours
classifies the layout, so `env,rollout,actor: all` reads as COLLOCATED.

Device ids are global over the nodes (`cluster.num_nodes`: node n holds devices n*D ... n*D + D - 1; the Ray backend
places each rank on its node). Left out: node groups (the dict form `{node_group, placement}`, robots, the `node`
label), `PlacementMode.AUTO`, and the TP-aware `ModelParallelComponentPlacement`.
RLinf also demands ascending device ranks across segments; we only reject duplicates. The strings RLinf reads
and we refuse, each for a named reason, are listed under `_parse_placement`.

Next stage: `stages/sync.py`, which moves weights from actor ranks to rollout ranks placed here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from rlinf_mini.scheduler.placement import PlacementMode, PlacementStrategy, ProcessPlacement

_RANGE = re.compile(r"([0-9]+)\s*(?:-\s*([0-9]+))?")  # "3", "0-3" or "0 - 3"; no sign, so "-1" is rejected


class PlacementError(ValueError):
    """A bad placement: one line naming the key, 'cluster.component_placement.<key>: ...'."""


# --------------------------------------------------------------------------------------------------------------------
# Parsing one placement string


def _python_int_range(text: str) -> bool:
    """True where RLinf's rank parser reads `text`: each side of one '-' through Python's int()."""
    parts = text.split("-")
    try:
        return len(parts) <= 2 and all(isinstance(int(part), int) for part in parts)
    except ValueError:
        return False


def _parse_range(text: str, what: str, fail: Callable[[str], PlacementError]) -> list[int]:
    match = _RANGE.fullmatch(text.strip())
    if match is None:
        if _python_int_range(text):
            raise fail(f"{what} {text.strip()!r}: a sign, '_' or a non-ASCII digit is Python int() syntax that RLinf "
                       "reads too; write plain digits 0-9")
        raise fail(f"{what} {text.strip()!r} is not an int or an inclusive range 'a-b'")
    start = int(match[1])
    end = start if match[2] is None else int(match[2])
    if end < start:
        raise fail(f"{what} {text.strip()!r} ends before it starts")
    return list(range(start, end + 1))


def _parse_placement(key: str, value: str, num_devices: int) -> list[tuple[int, ...]]:
    """One placement string -> the device ids of each process, indexed by process rank.

    As RLinf 0.3.0 (`rlinf/scheduler/placement/placement.py::_parse_rank_map`, `rlinf/scheduler/cluster/utils.py::
    parse_rank_config`): an int from YAML is its digits (placement.py:327); empty segments are skipped ('0-3,',
    placement.py:448); 'all' in any case (utils.py:480); spaces inside a range ('0 - 3', int() strips them). Refused,
    each a quirk RLinf accepts:
    - no segment at all ('', ','): RLinf places the component on no process (world size 0, placement.py:414);
    - process ranks of the first segment not from 0 ('0-3:1-4'): RLinf checks contiguity only from the second
      segment on (placement.py:506), so a group of 4 processes would hold rank 4;
    - '+3', '1_0', non-ASCII digits: RLinf reads ranks with Python's int() (utils.py:496), which takes them;
    - YAML 1.1 numbers: unquoted `1:0` is base 60 (OmegaConf reads 60, RLinf places device 60) and `010` octal (8):
      the loader refuses both by name (rlinf_mini/config/yaml_tree.py).
    """

    def fail(problem: str) -> PlacementError:
        return PlacementError(f"cluster.component_placement.{key}: {problem} (in {value!r})")

    text = str(value).strip()  # an int, if YAML read "0" as one
    if not text:
        raise fail("empty placement; expected e.g. 'all', '0', '0-3', '0,2' or '0-3:0-7'")
    process_devices: list[tuple[int, ...]] = []
    used: set[int] = set()
    for segment in text.split(","):
        if not segment.strip():
            continue  # '0-3,' or '0,,1': RLinf skips an empty segment
        device_text, has_processes, process_text = segment.partition(":")
        if not device_text.strip():
            raise fail(f"empty device ranks in segment {segment.strip()!r}")
        if ":" in process_text:
            raise fail(f"segment {segment.strip()!r} has more than one ':'")
        if device_text.strip().lower() == "all":
            devices = list(range(num_devices))
        else:
            devices = _parse_range(device_text, "device ranks", fail)
        for device in devices:
            if device >= num_devices:
                raise fail(
                    f"device {device} is out of range for num_devices={num_devices} "
                    "(cluster.num_devices: GPUs, or shares of the CPU cores without GPUs)"
                )
            if device in used:
                raise fail(f"device {device} is listed twice")
            used.add(device)

        first = len(process_devices)  # the next process rank
        if has_processes:
            processes = _parse_range(process_text, "process ranks", fail)
            if processes[0] != first:
                raise fail(f"process ranks {process_text.strip()!r} must start at {first} (contiguous from 0)")
        else:
            processes = list(range(first, first + len(devices)))

        n_devices, n_processes = len(devices), len(processes)
        if n_devices % n_processes and n_processes % n_devices:
            raise fail(f"{n_devices} devices and {n_processes} processes: one number must divide the other")
        if n_processes >= n_devices:  # processes share devices: consecutive ranks on the same device
            per_device = n_processes // n_devices
            process_devices += [(devices[i // per_device],) for i in range(n_processes)]
        else:  # each process owns a consecutive run of devices
            per_process = n_devices // n_processes
            process_devices += [tuple(devices[i * per_process : (i + 1) * per_process]) for i in range(n_processes)]
    if not process_devices:
        raise fail("no segment: the component would run on no process; expected e.g. 'all', '0', '0-3'")
    return process_devices


# --------------------------------------------------------------------------------------------------------------------
# The whole cluster.component_placement section


class ComponentPlacement:
    """Parses every key of `cluster.component_placement`; one PlacementStrategy per component."""

    def __init__(self, component_placement: dict[str, str], num_devices: int):
        if not component_placement:
            raise PlacementError("cluster.component_placement: empty; place at least one component")
        self.num_devices = num_devices
        self.components: list[str] = []
        self._strategies: dict[str, PlacementStrategy] = {}
        for key, value in component_placement.items():
            names = [name.strip() for name in str(key).split(",")]
            if "" in names:
                raise PlacementError(f"cluster.component_placement.{key}: empty component name in key {str(key)!r}")
            process_devices = _parse_placement(key, value, num_devices)
            placements = tuple(ProcessPlacement(rank, devices) for rank, devices in enumerate(process_devices))
            for name in names:
                if name in self._strategies:
                    raise PlacementError(
                        f"cluster.component_placement.{key}: component {name!r} is placed twice "
                        "(each component may appear under one key only)"
                    )
                self._strategies[name] = PlacementStrategy(name, placements)
                self.components.append(name)
        self._placement_mode = self._classify()

    def _classify(self) -> PlacementMode:
        device_sets = [frozenset(strategy.devices()) for strategy in self._strategies.values()]
        if all(devices == device_sets[0] for devices in device_sets):
            return PlacementMode.COLLOCATED
        if sum(map(len, device_sets)) == len(frozenset().union(*device_sets)):  # no device counted twice
            return PlacementMode.DISAGGREGATED
        return PlacementMode.HYBRID

    def get_strategy(self, component: str) -> PlacementStrategy:
        if component not in self._strategies:
            raise PlacementError(
                f"cluster.component_placement.{component}: unknown component; known: {', '.join(self.components)}"
            )
        return self._strategies[component]

    def get_world_size(self, component: str) -> int:
        return self.get_strategy(component).world_size

    def get_hardware_ranks(self, component: str) -> list[int]:
        return sorted(self.get_strategy(component).devices())

    @property
    def placement_mode(self) -> PlacementMode:
        return self._placement_mode

    def describe(self) -> str:
        """One line per device with the ranks on it ('device 0: actor[0] env[0]'), then the mode."""
        lines = []
        for device in range(self.num_devices):
            ranks = [
                f"{name}[{placement.rank}]"
                for name in sorted(self.components)
                for placement in self._strategies[name].placements
                if device in placement.devices
            ]
            lines.append(f"device {device}: {' '.join(ranks) or '(idle)'}")
        lines.append(f"mode: {self.placement_mode.value}")
        return "\n".join(lines)


def _require_exactly(placement: ComponentPlacement, names: tuple[str, ...], kind: str) -> None:
    """PlacementError unless `placement` places exactly the components `names` (the `kind` of run needs them)."""
    for name in names:
        if name not in placement.components:
            raise PlacementError(f"cluster.component_placement.{name}: missing; the {kind} placement needs "
                                 f"{', '.join(names)} (placed: {', '.join(placement.components)})")
    for name in placement.components:
        if name not in names:
            raise PlacementError(f"cluster.component_placement: unknown component {name!r} (known: {', '.join(names)})")


class HybridComponentPlacement(ComponentPlacement):
    """The embodied placement: requires components 'actor', 'rollout' and 'env' (missing one -> PlacementError)."""

    def __init__(self, component_placement: dict[str, str], num_devices: int):
        super().__init__(component_placement, num_devices)
        _require_exactly(self, ("actor", "rollout", "env"), "embodied")


class ReasoningComponentPlacement(ComponentPlacement):
    """The reasoning placement: requires components 'actor', 'rollout' and 'reward' (RLinf's reasoning runs use
    ModelParallelComponentPlacement; without tensor parallelism its layout rules reduce to these)."""

    def __init__(self, component_placement: dict[str, str], num_devices: int):
        super().__init__(component_placement, num_devices)
        _require_exactly(self, ("actor", "rollout", "reward"), "reasoning")


def actor_pieces(env_world_size: int, actor_world_size: int) -> tuple[int, int]:
    """(pieces per env rank, pieces per actor rank): how a step's trajectories are cut between the env ranks that make
    them and the actor ranks that train on them, so that every actor rank gets an equal share (RLinf sends each env
    rank's batch split over the actor ranks the same way)."""
    lcm = math.lcm(env_world_size, actor_world_size)
    return lcm // env_world_size, lcm // actor_world_size


def env_ranks_of_rollout(rollout_rank: int, env_world_size: int, rollout_world_size: int) -> list[int]:
    """The env ranks served by one rollout rank: a contiguous block of env_world_size / rollout_world_size."""
    per = env_world_size // rollout_world_size
    return list(range(rollout_rank * per, (rollout_rank + 1) * per))
