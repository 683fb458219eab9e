"""A run joins a Ray cluster started outside it, the way Ray users run it: `ray start --head` here (its own temp
folder and port), then `python -m rlinf_mini.train` with RAY_ADDRESS alone (what `ray job submit` and KubeRay set), or
with nothing but the address file that `ray start` leaves in Ray's temp folder; the run's ranks run in that cluster
and none is left alive; the cluster is stopped by its own process group, never by `ray stop` (which would stop every
Ray on the machine). Which address `cluster.ray_address: ''` picks, a dead cluster's file included: no Ray needed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

from conftest import ROOT, marked_processes, write_config  # noqa: E402
from test_pipeline import SMALL  # noqa: E402

from rlinf_mini.scheduler.ray_backend import ray_address  # noqa: E402

MARK = "RLINF_MINI_TEST_RAY_RUN"
# Ray 2.60's `ray start` turns on token authentication, which a plain ray.init(address=...) then fails against
# unless RAY_AUTH_MODE=token names the token: out of this test's subject, so its cluster and drivers go without
NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_an_empty_ray_address_follows_ray_init_and_passes_over_a_dead_clusters_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # Ray's temp folder: tmp_path/ray
    assert ray_address("10.0.0.7:6379", {"RAY_ADDRESS": "10.0.0.8:6379"}) == ("10.0.0.7:6379", None)  # as given
    assert ray_address("", {"RAY_ADDRESS": "10.0.0.8:6379"}) == ("10.0.0.8:6379", None)
    assert ray_address("", {}) == ("local", None)  # nothing names a cluster: a private instance
    (tmp_path / "ray").mkdir()
    with socket.socket() as listening:  # a cluster that answers at the address the file names
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        named = f"127.0.0.1:{listening.getsockname()[1]}"
        (tmp_path / "ray" / "ray_current_cluster").write_text(named)
        assert ray_address("", {}) == (named, None)
    address, note = ray_address("", {})  # the same file once nothing listens (a killed `ray start`)
    assert address == "local" and note == (f"note: {tmp_path}/ray/ray_current_cluster names {named}, where no Ray "
                                           f"cluster answers: a private Ray instance")


def test_an_address_where_no_cluster_answers_is_one_line(tmp_path):
    """(ray.init would retry it for minutes.)"""
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{_free_port()}", "RAY_TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "rlinf_mini.train", "--config", str(write_config(
        tmp_path, **SMALL)), "--cluster.backend", "ray"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: RAY_ADDRESS: no Ray cluster answers at {env['RAY_ADDRESS']}"), done.stderr


# the `ray` command of the Python running the tests (a venv used without activating it has it beside python)
RAY_CLI = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray") or "ray"


@pytest.fixture(scope="module")
def outside_cluster():
    """`ray start --head --block` in a process group of its own, with its own temp folder (Ray's temp folder of the
    runs below: RAY_TMPDIR=<root>, folder <root>/ray) and port; yields (address, root)."""
    root = tempfile.mkdtemp(prefix="rlray", dir="/tmp")  # short: Ray's socket paths live under it
    marker = uuid.uuid4().hex
    port = _free_port()
    env = {**os.environ, MARK: marker, "RAY_TMPDIR": root, **NO_TOKEN}
    head = subprocess.Popen([RAY_CLI, "start", "--head", "--block", "--port", str(port),
                             "--num-cpus", "2", "--temp-dir", f"{root}/ray", "--include-dashboard", "false",
                             "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        address_file = Path(root, "ray", "ray_current_cluster")
        deadline = time.monotonic() + 60
        while not address_file.exists():
            assert head.poll() is None, head.stderr.read()
            assert time.monotonic() < deadline, "ray start wrote no address within 60 s"
            time.sleep(0.2)
        yield address_file.read_text().strip(), root
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # ray start and what it started (GCS, raylet, their workers)
        deadline = time.monotonic() + 5  # (a `ray start --block` was seen to outlive a SIGTERM for minutes)
        while marked_processes(MARK, marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in marked_processes(MARK, marker):  # what ignored SIGTERM: ours by the marker, no other Ray's
            os.kill(pid, signal.SIGKILL)
        head.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _actors(address: str) -> dict[str, list[str]]:
    """The cluster's rank actors by state, read by a driver of its own (this process may hold another session)."""
    code = (f"import json, ray; from ray._private.state import state; ray.init(address={address!r}, "
            "logging_level='ERROR'); t = state.actor_table(None).values(); out = {}\n"
            "for a in t:\n    out.setdefault(a['State'], []).append(a['ActorClassName'])\n"
            "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **NO_TOKEN})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("named_by", ["RAY_ADDRESS", "ray start's address file"])
def test_a_run_joins_the_cluster_that_ray_address_or_ray_start_names(outside_cluster, tmp_path, named_by):
    address, root = outside_cluster
    before = _actors(address).get("DEAD", []).count("RankActor")
    sections = {**SMALL, "runner": {**SMALL["runner"], "max_epochs": 1},
                "cluster": {"backend": "ray", "num_devices": 2, "component_placement": {"env,rollout": "0",
                                                                                         "actor": "1"}}}
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **NO_TOKEN}
    if named_by == "RAY_ADDRESS":
        env |= {"RAY_ADDRESS": address, "RAY_TMPDIR": str(tmp_path)}  # an empty temp folder: the variable alone
    else:
        env |= {"RAY_TMPDIR": root}  # the folder holding ray start's ray/ray_current_cluster
    marker = uuid.uuid4().hex
    done = subprocess.run([sys.executable, "-m", "rlinf_mini.train", "--config", str(write_config(tmp_path,
                          **sections))], cwd=ROOT, env={**env, MARK: marker}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert marked_processes(MARK, marker) == {}  # the run left no process behind
    actors = _actors(address)
    assert actors.get("DEAD", []).count("RankActor") - before == 3  # env + rollout, actor: ranks of this cluster
    assert "RankActor" not in actors.get("ALIVE", []) and "_ChannelActor" not in actors.get("ALIVE", [])
