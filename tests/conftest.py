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

from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `stages` and `tests.toy_workers` import from a plain checkout too
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
    path = tmp_path / f"cfg_{len(list(tmp_path.glob('cfg_*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(data))
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


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes_or_shm():
    before = set(os.listdir(SHM_DIR))
    yield
    children = multiprocessing.active_children()
    # only this process's runs: a run id starts with its driver's pid (other pytest or training runs may be going on)
    ours = f"{PREFIX}{os.getpid()}"
    segments = [n for n in os.listdir(SHM_DIR) if n.startswith(ours) and n not in before]
    assert not children, f"worker processes outlived the tests: {children}"
    assert not segments, f"shared-memory segments outlived the tests: {segments}"
