"""Stage 1: placement strings -> devices per rank, the mode, and one-line errors that name the key."""

import re

import pytest

from stages.placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    PlacementError,
    PlacementMode,
    PlacementStrategy,
    ProcessPlacement,
)


def rank_devices(value: str, num_devices: int = 8) -> list[tuple[int, ...]]:
    strategy = ComponentPlacement({"actor": value}, num_devices).get_strategy("actor")
    assert [p.rank for p in strategy.placements] == list(range(strategy.world_size))
    return [p.devices for p in strategy.placements]


# --------------------------------------------------------------------------------------------------------------------
# Grammar


@pytest.mark.parametrize(
    "value, num_devices, expected",
    [
        ("all", 4, [(0,), (1,), (2,), (3,)]),
        ("3", 8, [(3,)]),
        (" 0 ", 8, [(0,)]),
        ("0-3", 8, [(0,), (1,), (2,), (3,)]),
        ("2-2", 8, [(2,)]),
        ("0,2,4-5", 8, [(0,), (2,), (4,), (5,)]),
        ("0, 2", 8, [(0,), (2,)]),
        ("0-3:0-7", 8, [(p // 2,) for p in range(8)]),  # 2 processes per device
        ("0-3:0-1", 8, [(0, 1), (2, 3)]),  # each process owns 2 devices
        ("0-3:0", 8, [(0, 1, 2, 3)]),  # one process owns all 4
        ("0:0-2", 8, [(0,), (0,), (0,)]),
        ("all:0-7", 4, [(p // 2,) for p in range(8)]),
        ("0-1:0-3,2-3", 8, [(0,), (0,), (1,), (1,), (2,), (3,)]),  # processes 4, 5 continue the count
        ("0-1,2-5:2-3", 8, [(0,), (1,), (2, 3), (4, 5)]),
        ("4-7", 8, [(4,), (5,), (6,), (7,)]),
    ],
)
def test_grammar(value, num_devices, expected):
    assert rank_devices(value, num_devices) == expected


def test_int_value_from_yaml_is_accepted():
    assert rank_devices(0) == [(0,)]  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------------
# Oracle: RLinf 0.3.0's parser, written out as a plain loop from rlinf/scheduler/placement/placement.py::_parse_rank_map
# and rlinf/scheduler/cluster/utils.py::parse_rank_config (their rules, not their code)


def rlinf_process_devices(value, num_devices: int) -> list[tuple[int, ...]]:
    """The devices of each process rank as RLinf reads a placement value; AssertionError/ValueError where it fails."""

    def ranks(text, available):
        text = str(text)
        if text.lower() == "all":
            assert available is not None
            return list(range(available))
        out = set()
        for part in text.split(","):
            if part.strip() == "":
                continue
            ends = part.strip().split("-")
            if len(ends) not in (1, 2):
                raise ValueError(part)
            start, end = int(ends[0]), int(ends[-1])  # Python's int(): strips spaces, takes '+3' and '1_0'
            assert end >= start
            if available is not None:
                assert 0 <= start <= end <= available - 1
            out.update(range(start, end + 1))
        return sorted(out)

    devices_of: dict[int, tuple[int, ...]] = {}
    seen_devices: list[int] = []
    seen_processes: list[int] = []
    for part in str(value).strip().split(","):
        part = part.strip()
        if part == "":
            continue
        sides = part.split(":")
        assert 1 <= len(sides) <= 2
        devices = ranks(sides[0].strip(), num_devices)
        assert devices and set(devices).isdisjoint(seen_devices)
        assert not seen_devices or devices[0] > seen_devices[-1]  # ascending over segments
        seen_devices += devices
        if len(sides) == 2:
            assert sides[1].strip() != "all"
            processes = ranks(sides[1].strip(), None)
        else:
            start = max(seen_processes) + 1 if seen_processes else 0
            processes = list(range(start, start + len(devices)))
        assert processes and set(processes).isdisjoint(seen_processes)
        assert not seen_processes or processes[0] == seen_processes[-1] + 1  # not checked for the first segment
        assert processes == list(range(processes[0], processes[0] + len(processes)))
        seen_processes += processes
        assert len(processes) % len(devices) == 0 or len(devices) % len(processes) == 0
        if len(devices) >= len(processes):
            per = len(devices) // len(processes)
            for i, p in enumerate(processes):
                devices_of[p] = tuple(devices[i * per:(i + 1) * per])
        else:
            per = len(processes) // len(devices)
            for i, p in enumerate(processes):
                devices_of[p] = (devices[i // per],)
    return [devices_of[p] for p in sorted(devices_of)]


HELD_OUT = [  # strings RLinf users write, several of which rlinf_mini refused before
    ("all", 4), (0, 8), (5, 8), ("1", 8), ("0-7", 8), ("4-7", 8), ("0-3:0-7", 4), ("0-3:0-1", 4), ("0:0-3", 2),
    ("0-1:0-3,2-3", 4), ("0-1,2-5:2-3", 8), ("0,2,4-5", 8), ("ALL", 4), ("All:0-7", 4), ("0 - 3", 8),
    ("0- 3 : 0 -7", 4), ("0-3,", 4), ("0,,1", 4), (" 2 , 3 ", 4), ("00-03", 4), ("0-1:00-03", 2),
]


@pytest.mark.parametrize(("value", "num_devices"), HELD_OUT, ids=[repr(v) for v, _ in HELD_OUT])
def test_rlinf_placement_strings_place_every_rank_where_rlinf_does(value, num_devices):
    assert rank_devices(value, num_devices) == rlinf_process_devices(value, num_devices)


QUIRKS = [  # RLinf accepts these; each is refused by name (the reasons: stages/placement.py::_parse_placement)
    ("", "empty placement"),  # RLinf: a component with no process
    (",", "no segment"),
    ("0-3:1-4", "must start at 0"),  # RLinf: processes 1-4, a group of 4 holding rank 4
    ("+3", "Python int() syntax"),
    ("1_0", "Python int() syntax"),
    ("0-+3", "Python int() syntax"),
    ("\u0663", "Python int() syntax"),  # an Arabic-Indic 3
]


@pytest.mark.parametrize(("value", "fragment"), QUIRKS, ids=[repr(v) for v, _ in QUIRKS])
def test_rlinf_quirks_are_refused_by_name(value, fragment):
    rlinf_process_devices(value, 16)  # RLinf takes it (without an error)
    with pytest.raises(PlacementError, match=re.escape(fragment)):
        ComponentPlacement({"actor": value}, 16)


def test_yaml_int_forms_read_as_rlinf_reads_them(tmp_path):
    """YAML ints are their digits, as in RLinf (placement.py:327 str()s them); base 60 and octal are refused."""
    from rlinf_mini.config import ConfigError, load_config

    for text, devices in (("0", [(0,)]), ("3", [(3,)]), ("+1", [(1,)]), ("0x2", [(2,)]), ("0-1", [(0,), (1,)])):
        path = tmp_path / "c.yaml"
        path.write_text(f"cluster:\n  num_devices: 4\n  component_placement:\n    actor: {text}\n    env,rollout: 0\n")
        placed = load_config(["--config", str(path)]).cluster.component_placement["actor"]
        assert rank_devices(placed, 4) == devices
    for text, why in (("1:0", "base-60"), ("010", "octal")):  # OmegaConf: 60 and 8; RLinf places devices 60 and 8
        path.write_text(f"cluster:\n  num_devices: 4\n  component_placement:\n    actor: {text}\n    env,rollout: 0\n")
        with pytest.raises(ConfigError, match=why):
            load_config(["--config", str(path)])


def test_strategy_dataclasses():
    strategy = ComponentPlacement({"actor": "0-3:0-1"}, 4).get_strategy("actor")
    assert strategy == PlacementStrategy("actor", (ProcessPlacement(0, (0, 1)), ProcessPlacement(1, (2, 3))))
    assert strategy.world_size == 2
    assert strategy.devices() == {0, 1, 2, 3}


def test_multi_component_key_gives_each_its_own_group():
    placement = ComponentPlacement({"env,rollout, actor": "0-1", "reward": "2"}, 4)
    assert placement.components == ["env", "rollout", "actor", "reward"]
    for name in ("env", "rollout", "actor"):
        strategy = placement.get_strategy(name)
        assert strategy.component == name
        assert [p.devices for p in strategy.placements] == [(0,), (1,)]
    assert placement.get_world_size("reward") == 1
    assert placement.get_hardware_ranks("reward") == [2]


# --------------------------------------------------------------------------------------------------------------------
# Modes


@pytest.mark.parametrize("cls", [ComponentPlacement, HybridComponentPlacement])
@pytest.mark.parametrize(
    "config, mode",
    [
        ({"env,rollout,actor": "all"}, PlacementMode.COLLOCATED),
        ({"env": "0", "rollout": "1", "actor": "2-3"}, PlacementMode.DISAGGREGATED),
        ({"env": "0", "rollout": "1", "actor": "0-1"}, PlacementMode.HYBRID),
        ({"env": "0-1", "rollout": "0-3:0-1", "actor": "0-3"}, PlacementMode.HYBRID),
        ({"env": "0-1:0-3", "rollout": "0-1", "actor": "1,0"}, PlacementMode.COLLOCATED),  # same set, any order
    ],
)
def test_modes(cls, config, mode):
    assert cls(config, 4).placement_mode is mode


def test_single_component_is_collocated():
    assert ComponentPlacement({"actor": "0-1"}, 4).placement_mode is PlacementMode.COLLOCATED


def test_rlinf_embodied_example():
    # examples/embodiment/config/maniskill_ppo_openvla.yaml: actor on all 8 GPUs, env | rollout split 4 + 4.
    placement = HybridComponentPlacement({"actor": "0-7", "env": "0-3", "rollout": "4-7"}, 8)
    assert placement.components == ["actor", "env", "rollout"]
    assert [placement.get_world_size(c) for c in placement.components] == [8, 4, 4]
    assert placement.get_hardware_ranks("actor") == list(range(8))
    assert placement.get_hardware_ranks("env") == [0, 1, 2, 3]
    assert placement.get_hardware_ranks("rollout") == [4, 5, 6, 7]
    assert [p.devices for p in placement.get_strategy("rollout").placements] == [(4,), (5,), (6,), (7,)]
    assert placement.placement_mode is PlacementMode.HYBRID


# --------------------------------------------------------------------------------------------------------------------
# describe()


def test_describe():
    text = ComponentPlacement({"env": "0", "rollout": "1", "actor": "0-1:0-3"}, 3).describe()
    assert text.splitlines() == [
        "device 0: actor[0] actor[1] env[0]",
        "device 1: actor[2] actor[3] rollout[0]",
        "device 2: (idle)",
        "mode: hybrid",
    ]


def test_describe_collocated_and_multi_device_process():
    assert "device 0: actor[0] env[0] rollout[0]" in ComponentPlacement({"env,rollout,actor": "all"}, 2).describe()
    text = ComponentPlacement({"actor": "0-1:0"}, 2).describe()
    assert text.splitlines() == ["device 0: actor[0]", "device 1: actor[0]", "mode: collocated"]


# --------------------------------------------------------------------------------------------------------------------
# Errors: one line, naming the key


def assert_one_line_error(config, num_devices, *fragments):
    with pytest.raises(PlacementError) as info:
        HybridComponentPlacement(config, num_devices)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("", "empty placement"),
        ("   ", "empty placement"),
        ("0-", "'0-'"),
        ("a-b", "'a-b'"),
        ("3-1", "ends before it starts"),
        (",", "no segment"),
        (":0-3", "empty device ranks"),
        ("-1", "'-1'"),
        ("0:1:2", "more than one ':'"),
        ("0-3:", "process ranks ''"),
        ("0-3:all", "process ranks 'all'"),
        ("0-3:1-4", "must start at 0"),
        ("0-1,2-3:0-1", "must start at 2"),
        ("0-2:0-1", "3 devices and 2 processes"),
        ("0-1:0-2", "2 devices and 3 processes"),
        ("0-1,1", "device 1 is listed twice"),
        ("all,0", "device 0 is listed twice"),
        ("0-4", "device 4 is out of range for num_devices=4"),
        ("7", "cluster.num_devices: GPUs, or shares of the CPU cores"),
    ],
)
def test_bad_values(value, fragment):
    message = assert_one_line_error({"env,rollout": "0", "actor": value}, 4, fragment)
    assert message.startswith("cluster.component_placement.actor: ")
    assert repr(value) in message  # names the bad value


def test_component_under_two_keys():
    assert_one_line_error(
        {"env,rollout,actor": "0", "actor": "1"}, 4, "cluster.component_placement.actor: ", "'actor' is placed twice"
    )
    assert_one_line_error({"env,env": "0", "rollout,actor": "1"}, 4, "cluster.component_placement.env,env: ")


@pytest.mark.parametrize("key", ["", "env,,rollout", "actor,"])
def test_empty_component_name(key):
    assert_one_line_error({key: "0", "env,rollout,actor": "1"}, 4, f"cluster.component_placement.{key}: ", "empty")


def test_hybrid_requires_actor_rollout_env():
    assert_one_line_error({"actor,rollout": "0"}, 4, "cluster.component_placement.env: missing", "actor, rollout")
    ComponentPlacement({"actor,rollout": "0"}, 4)  # the generic parser has no required components


def test_unknown_component():
    placement = ComponentPlacement({"env,rollout,actor": "all"}, 2)
    with pytest.raises(PlacementError, match=r"^cluster\.component_placement\.critic: .*env, rollout, actor$"):
        placement.get_strategy("critic")
    with pytest.raises(PlacementError, match="critic"):
        placement.get_world_size("critic")


def test_empty_section():
    with pytest.raises(PlacementError, match="cluster.component_placement"):
        ComponentPlacement({}, 2)


def test_no_torch_import():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, stages.placement; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
