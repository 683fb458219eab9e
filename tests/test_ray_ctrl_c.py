"""Ctrl-C of a run on Ray leaves no actor and no Ray process that the run started. A file of its own: the run starts
its own Ray instance (not test_ray.py's shared cluster), so it needs no session of this process and can run on
another xdist worker than test_ray.py (~25 s of the suite's longest file)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

from conftest import ROOT, marked_processes, write_config  # noqa: E402
from test_pipeline import SMALL  # noqa: E402


def _marked(marker: str) -> list[str]:
    """The command lines of the processes the run started (each inherits the marker), cut to 80 characters."""
    procs = marked_processes("RLINF_MINI_TEST_RAY_RUN", marker).values()
    return [cmd.replace(b"\0", b" ").decode()[:80] for cmd in procs]


def test_ctrl_c_leaves_no_actor_and_no_ray_process(tmp_path):
    """A run on its own Ray instance (cluster.ray_address ''), stopped by Ctrl-C (SIGINT to its process group, as a
    terminal sends it) once it trains: every process it started (Ray's included) is gone."""
    sections = {**SMALL, "runner": {**SMALL["runner"], "max_epochs": 1000, "save_interval": -1},
                "cluster": {"backend": "ray", "num_devices": 2, "component_placement": {"env,rollout": "0",
                                                                                         "actor": "1"}}}
    path = write_config(tmp_path, **sections)
    marker = uuid.uuid4().hex
    # an empty Ray temp folder: no address file there names a cluster (test_ray.py's, say) for the run to join
    ray_tmp = tempfile.mkdtemp(prefix="rlray", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RLINF_MINI_TEST_RAY_RUN": marker, "CUDA_VISIBLE_DEVICES": "", "RAY_TMPDIR": ray_tmp}
    proc = subprocess.Popen([sys.executable, "-m", "rlinf_mini.train", "--config", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        metrics = next(iter(tmp_path.glob("results/*/metrics.jsonl")), None)
        deadline = time.monotonic() + 120
        while (metrics is None or "\"step\": 1" not in metrics.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, "the run did not train a step within 120 s"
            time.sleep(0.5)
            metrics = next(iter(tmp_path.glob("results/*/metrics.jsonl")), None)
        assert proc.poll() is None, proc.stderr.read()
        assert any("ray::RankActor" in p or "raylet" in p for p in _marked(marker))  # the check can fail
        os.killpg(proc.pid, signal.SIGINT)
        stderr = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 130, stderr
    deadline = time.monotonic() + 10
    while _marked(marker) and time.monotonic() < deadline:  # Ray's agents exit a moment after their raylet
        time.sleep(0.2)
    assert _marked(marker) == [], "processes outlived the run"
