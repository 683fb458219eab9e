"""Shared fixtures. The session check at the bottom fails the run if any test leaks a worker process or a
shared-memory segment."""

from __future__ import annotations

import os

# The default suite is the CPU suite, on a GPU box too: GPUs are hidden before torch is imported, so every placement
# means virtual CPU devices. RLINF_MINI_TEST_GPU=1 keeps them, for the tests marked `gpu` (tests/test_gpu.py).
if os.environ.get("RLINF_MINI_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import json  # noqa: E402
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
    # a shipped config's relative model folder and data files (results/tiny_vla, results/data/...) are where the
    # user's own runs keep theirs: a test's go under tmp_path
    # (a test's deliberately broken section is left as it is)
    for section in ("actor", "rollout"):
        model = data.get(section, {}).get("model") if isinstance(data.get(section), dict) else None
        if isinstance(model, dict) and isinstance(model.get("model_path"), str) and model["model_path"] \
                and not Path(model["model_path"]).is_absolute():
            model["model_path"] = str(tmp_path / model["model_path"])
    paths = data.get("data") if isinstance(data.get("data"), dict) else {}
    for key in ("train_data_paths", "val_data_paths"):
        if isinstance(paths.get(key), list):
            paths[key] = [p if not isinstance(p, str) or Path(p).is_absolute() else str(tmp_path / p)
                          for p in paths[key]]
    # no timeline unless a test asks for one (runner={"trace": True}): its PNG costs ~0.6 s of CPU per run, and
    # tests/test_tracer.py checks the tracer in training runs
    data["runner"].setdefault("trace", False)
    path = tmp_path / f"cfg_{len(list(tmp_path.glob('cfg_*.yaml')))}.yaml"
    path.write_text(yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    return path


PLANTED = "planted by tests/conftest.py (plant_users_runs): a user's earlier run; no test may read or change it\n"


def plant_users_runs(root: Path) -> None:
    """What a user's runs of every shipped config and of the dataclass defaults leave in their checkout `root` (where
    the configs' relative paths land): each run folder holds a run (config, metrics, a checkpoint, TensorBoard
    events), so that a run started there is refused; each model folder and data file is garbage, so that a test that
    used one instead of its own fails. (A model folder's config.json parses: loading a config reads it, as it reads
    the user's real one.)"""
    from rlinf_mini.config import TrainConfig, load_config

    cfgs = [TrainConfig()] + [load_config(["--config", str(p)]) for p in sorted((ROOT / "configs").glob("*.yaml"))]
    for cfg in cfgs:
        run = root / cfg.runner.logger.log_path / cfg.runner.logger.experiment_name
        (run / "checkpoints" / "global_step_1").mkdir(parents=True, exist_ok=True)
        (run / "checkpoints" / "global_step_1" / "runner.json").write_text('{"global_step": 1}\n')
        (run / "tensorboard").mkdir(exist_ok=True)
        (run / "tensorboard" / "events.out.tfevents.0.planted").write_text(PLANTED)
        (run / "metrics.jsonl").write_text('{"step": 1, "planted": 1.0}\n')
        (run / "config.yaml").write_text(f"# {PLANTED}")
        for folder in (cfg.actor.model.model_path, cfg.rollout.model.model_path):
            if folder and not Path(folder).is_absolute():
                (root / folder).mkdir(parents=True, exist_ok=True)
                (root / folder / "config.json").write_text(json.dumps({"planted": PLANTED}))
        for file in [*cfg.data.train_data_paths, *cfg.data.val_data_paths]:
            if not Path(file).is_absolute():
                (root / file).parent.mkdir(parents=True, exist_ok=True)
                (root / file).write_text(PLANTED)


@pytest.fixture(scope="module")
def cluster_backend() -> str:
    """The backend of a module's `cluster`; a module overrides this fixture to change it (tests/test_backends.py
    runs its tests on each backend)."""
    return "local"


@pytest.fixture(scope="module")
def cluster_timeout_s() -> float:
    """The timeout of a module's `cluster` (cluster.timeout_s); a module overrides this fixture to change it."""
    return 20.0


@pytest.fixture(scope="module")
def cluster(cluster_backend, cluster_timeout_s):
    """One Cluster of 2 virtual devices for a whole test module, shut down after its last test."""
    from rlinf_mini.config import ClusterConfig
    from rlinf_mini.scheduler.cluster import Cluster

    c = Cluster(ClusterConfig(num_devices=2, timeout_s=cluster_timeout_s, backend=cluster_backend))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def echo(cluster):
    """The module's EchoWorker group "Echo" (tests/toy_workers.py), tag "hello", one rank on each device."""
    from toy_workers import EchoWorker

    from stages.placement import ComponentPlacement

    placement = ComponentPlacement({"echo": "0-1"}, cluster.num_devices)
    return EchoWorker.create_group(None, "hello").launch(cluster, placement.get_strategy("echo"), name="Echo")


def tree_snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None: a folder): equal snapshots, nothing written there."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="session")
def users_checkout(tmp_path_factory) -> Path:
    """A stand-in for the user's checkout after they ran every shipped config: run its tests or tutorials there
    (cwd), and a path that escaped its temporary folder meets the user's runs (plant_users_runs)."""
    root = tmp_path_factory.mktemp("users_checkout")
    plant_users_runs(root)
    return root


@pytest.fixture
def in_users_checkout(users_checkout, monkeypatch) -> Path:
    """The test runs in the user's checkout (cwd) and must leave the user's runs as they were."""
    before = tree_snapshot(users_checkout)
    monkeypatch.chdir(users_checkout)
    yield users_checkout
    after = tree_snapshot(users_checkout)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, 0) != after.get(k, 0))
    assert not changed, f"the test wrote into the user's checkout: {changed[:10]}"


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
                 "test_async_ppo.py",  # ~60 s: 12 short runs, 4 subprocess runs
                 "test_bad_input.py",  # ~20 s
                 "test_docs.py",  # ~32 s: every troubleshooting message made to happen, two short runs
                 "test_ray_outside.py",  # ~55 s: a `ray start --head` cluster outside the run, joined twice
                 # ~110 s, most of it Ray's processes starting: after the fault runs have (both start many
                 # processes at once: side by side, the bitwise Ray test took 70-86 s instead of ~40)
                 "test_ray.py"]


# The unit tier, `pytest -m unit`: every stage's oracle tests (placement, sync, the rollout pipeline on the inline
# backend, advantages, the losses and the update) and the config, models and envs; no worker processes beyond the
# pipeline's inline runs, no tutorials, no fault runs, no Ray. docs/testing.md lists the tiers.
UNIT_FILES = {"test_advantages.py", "test_losses.py", "test_placement.py", "test_pipeline.py", "test_models.py",
              "test_config.py", "test_config_load.py", "test_envs.py", "test_vla.py", "test_reasoning.py",
              "test_reasoning_data.py", "test_reasoning_generation.py", "test_reasoning_verifier.py",
              "test_port_config.py", "test_tracer.py", "test_channel.py", "test_grpo_options.py",
              "test_decoupled_loss.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        if item.path.name in UNIT_FILES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.unit)
        if item.path.name != "test_tutorials.py":
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    items.sort(key=lambda item: rank.get(f"{item.path.name}::{item.name}", rank.get(item.path.name, len(rank))))
