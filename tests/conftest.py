"""Shared fixtures. The session check at the bottom fails the run if any test leaks a worker process or a
shared-memory segment."""

from __future__ import annotations

import os

# The default suite is the CPU suite, on a GPU box too: GPUs are hidden before torch is imported, so every placement
# means virtual CPU devices. RLINF_MINI_TEST_GPU=1 keeps them, for the tests marked `gpu` (tests/test_gpu.py).
if os.environ.get("RLINF_MINI_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import multiprocessing  # noqa: E402
import sys
from pathlib import Path

import pytest
import yaml

from rlinf_mini.scheduler import local
from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `stages` and `tests.toy_workers` import from a plain checkout too
sys.path.insert(0, str(Path(__file__).resolve().parent))

# A test process has one fork server, started by its first Cluster with that Cluster's preload; the runs that come
# later bring other models. So the server imports both model modules whatever comes first: without it, each rank of a
# VLA or LM test that follows an MLP test imports transformers itself (~4 s of CPU a rank).
local.FORKSERVER_PRELOAD += ["rlinf_mini.models.tiny_vla", "rlinf_mini.models.tiny_lm"]


def write_config(tmp_path: Path, base: str = "configs/embodied_mlp.yaml", **sections) -> Path:
    """A copy of `base` with nested overrides: write_config(p, actor={"optim": {"lr": 0.1}})."""

    def merge(into: dict, new: dict) -> None:
        for k, v in new.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict) and k != "component_placement":
                merge(into[k], v)
            else:
                into[k] = v

    data = yaml.safe_load((ROOT / base).read_text())
    merge(data, sections)
    data.setdefault("runner", {}).setdefault("logger", {})["log_path"] = str(tmp_path / "results")
    # no timeline unless a test asks for one (runner={"trace": True}): its PNG costs ~0.6 s of CPU per run, and
    # tests/test_tracer.py checks the tracer in training runs
    data["runner"].setdefault("trace", False)
    path = tmp_path / f"cfg_{len(list(tmp_path.glob('cfg_*.yaml')))}.yaml"
    path.write_text(yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    return path


def marked_processes(var: str, marker: str) -> dict[int, bytes]:
    """Live processes whose environment holds var=marker (every process a run starts inherits it): pid -> cmdline."""
    needle = f"{var}={marker}\0".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle in Path(entry.path, "environ").read_bytes():
                    state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found[int(entry.name)] = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
    return found


def process_name(pid: int) -> str:
    """A live process's name (/proc/PID/comm): local ranks are named "<group>:<rank>", the fork server
    local.SERVER_NAME (once it has run its first line); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def parent_pid(pid: int) -> int:
    """A live process's parent (0 once it is gone). A local run's ranks are children of its fork server, which is a
    child of the driver, as is multiprocessing's resource tracker."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes_or_shm():
    before = set(os.listdir(SHM_DIR))
    yield
    from rlinf_mini.scheduler import codec

    codec.close_process_resources()  # this process's pool of message segments, as its exit does (atexit)
    children = multiprocessing.active_children()
    # only this process's runs: a run id starts with its driver's pid (other pytest or training runs may be going on)
    ours = f"{PREFIX}{os.getpid()}"
    segments = [n for n in os.listdir(SHM_DIR) if n.startswith(ours) and n not in before]
    assert not children, f"worker processes outlived the tests: {children}"
    assert not segments, f"shared-memory segments outlived the tests: {segments}"


# The suite runs on pytest-xdist workers, one per core (pyproject's addopts: `-n auto --dist loadgroup
# --no-loadscope-reorder`; `-n 0` runs it in this process, e.g. under a debugger). A test file goes to one worker
# whole (its xdist group), so that its module fixtures (a group started once, the fault runs) serve all its tests; the
# tutorials, each a process of its own, go one by one. Work starts in this order, the longest first, so that the
# workers end together instead of one waiting out a long file started last (longest-processing-time first); the rest
# follows in the usual order. (Seconds measured on 2 busy cores.)
LONGEST_FIRST = ["test_faults.py",  # ~70 s: 15 training runs, 3 at a time
                 "test_tutorials.py::test_tutorial_runs_top_to_bottom[07_reasoning]",  # ~33 s
                 "test_tutorials.py::test_tutorial_runs_top_to_bottom[06_full_run]",  # ~15 s
                 "test_tutorials.py::test_tutorial_runs_top_to_bottom[03_rollout_pipeline]",  # ~20 s
                 "test_bad_input.py",  # ~20 s
                 # ~110 s, most of it Ray's processes starting: after the fault runs have (both start many
                 # processes at once: side by side, the bitwise Ray test took 70-86 s instead of ~40)
                 "test_ray.py"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        if item.path.name != "test_tutorials.py":
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    items.sort(key=lambda item: rank.get(f"{item.path.name}::{item.name}", rank.get(item.path.name, len(rank))))
