"""Checkpoints: written atomically, and resuming continues the run exactly (CPU: bitwise)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import process_name, write_config

from rlinf_mini.config import load_config
from rlinf_mini.runners.base import find_latest_checkpoint
from rlinf_mini.scheduler import local
from rlinf_mini.train import RunPlan, build_and_run
from rlinf_mini.utils.metric_logger import read_metrics

RUN = dict(
    cluster={"num_devices": 2, "component_placement": {"env": "0", "rollout": "1", "actor": "0"}},
    runner={"val_check_interval": -1, "save_interval": 2, "progress_bar": False, "logger": {"logger_backends": []}},
    env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8},
         "eval": {"total_num_envs": 8, "max_steps_per_rollout_epoch": 8}},
    actor={"global_batch_size": 64, "micro_batch_size": 32},
)


def train(tmp_path, log_dir, steps: int, resume: str | None = None):
    path = write_config(tmp_path, **RUN)
    argv = ["--config", str(path), "--runner.max-epochs", str(steps), "--runner.logger.log-path", str(log_dir)]
    if resume:
        argv += ["--runner.resume-dir", resume]
    cfg = load_config(argv)
    plan = RunPlan(cfg, str(path))
    build_and_run(cfg, plan)
    return plan.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """4 steps straight, and 2 steps + resume + 2 steps; the tests below read their folders."""
    tmp_path = tmp_path_factory.mktemp("runs")
    straight = train(tmp_path, tmp_path / "straight", steps=4)
    split = train(tmp_path, tmp_path / "split", steps=2)
    first_half = find_latest_checkpoint(split)
    train(tmp_path, tmp_path / "split", steps=4, resume="auto")
    return straight, split, first_half


def test_resume_continues_bitwise(runs):
    straight, split, first_half = runs
    assert first_half.name == "global_step_2"

    a = torch.load(straight / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)
    b = torch.load(split / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        for k in pa:
            assert torch.equal(torch.as_tensor(pa[k]), torch.as_tensor(pb[k])), k

    def logged(run_dir):  # timings differ between runs; everything else must not
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "sync/"))}
                for m in read_metrics(run_dir / "metrics.jsonl")]

    assert [m["step"] for m in logged(split)] == [1, 2, 3, 4]
    assert logged(straight) == logged(split)


def test_a_second_run_into_the_same_folder_is_refused_unless_it_resumes(runs, capsys):
    straight = runs[0]
    from rlinf_mini.train import main

    argv = ["--config", str(straight / "config.yaml")]  # the first run's own config: same folder
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "runner.logger.experiment_name" in err and "runner.resume_dir=auto" in err
    cfg = load_config([*argv, "runner.resume_dir=auto"])
    assert RunPlan(cfg, "resume").run_dir == straight  # asked to resume: accepted


def test_metrics_of_a_run_resumed_into_a_new_folder_start_at_the_checkpoint(tmp_path):
    """resume_dir may name another run's checkpoint: the new folder has no metrics.jsonl to continue."""
    from rlinf_mini.config import LoggerConfig
    from rlinf_mini.utils.metric_logger import MetricLogger

    logger = MetricLogger(LoggerConfig(logger_backends=[]), tmp_path, resume_step=5)
    logger.log({"train/loss": 1.0}, step=6)
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 6, "train/loss": 1.0}]
    logger = MetricLogger(LoggerConfig(logger_backends=[]), tmp_path, resume_step=5)  # resumed again from step 5
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_checkpoint_folder_is_complete_or_absent(runs):
    run_dir = runs[0]
    ckpt = find_latest_checkpoint(run_dir)
    assert sorted(p.name for p in ckpt.iterdir()) == ["actor", "env.pt", "rng.pt", "runner.json"]
    assert (ckpt / "actor" / "model" / "config.json").is_file()  # an HF-style folder actor.model.model_path can use
    for name in ("env.pt", "rng.pt", "actor/actor.pt"):  # no pickled code: a checkpoint from elsewhere runs none
        torch.load(ckpt / name, weights_only=True)
    rng = torch.load(ckpt / "rng.pt", weights_only=True)  # every rank of every group: python, numpy, torch
    assert {g: len(v) for g, v in rng.items()} == {"ActorGroup": 1, "RolloutGroup": 1, "EnvGroup": 1}
    assert all({"python", "numpy", "torch"} <= set(s) for v in rng.values() for s in v)
    assert not list((run_dir / "checkpoints").glob(".*tmp"))
    assert ckpt.name == "global_step_4" and (run_dir / "checkpoints" / "global_step_2").is_dir()
    (run_dir / "checkpoints" / ".global_step_9.tmp").mkdir()  # an interrupted write is never picked up
    assert find_latest_checkpoint(run_dir) == ckpt


def _children_of(pid: int) -> list[tuple[int, bytes]]:
    """Live children of `pid`: (pid, cmdline)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append((int(stat.parent.name), cmdline))
    return out


def _workers_of(driver: int) -> list[int]:
    """The run's rank processes: the children of its fork server (scheduler/local.py), and the server itself."""
    servers = [p for p, cmd in _children_of(driver) if process_name(p) == local.SERVER_NAME]
    return servers + [p for server in servers for p, _ in _children_of(server)]


def test_ctrl_c_stops_every_worker_and_keeps_the_last_checkpoint(tmp_path):
    path = write_config(tmp_path, **RUN)
    cmd = [sys.executable, "-m", "rlinf_mini.train", "--config", str(path), "--runner.max-epochs", "1000",
           "--runner.logger.log-path", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    run_dir = tmp_path / "run" / "embodied"
    deadline = time.monotonic() + 180  # a hang guard, not a speed check
    while find_latest_checkpoint(run_dir) is None if (run_dir / "checkpoints").is_dir() else True:
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not reach its first checkpoint"
        time.sleep(0.2)
    workers = _workers_of(proc.pid)
    # the fork server (a fork of the driver, named: local.start_fork_server_here); env, rollout, actor, by name
    assert len(workers) == 1 + 3
    assert sorted(map(process_name, workers[1:])) == ["ActorGroup:0", "EnvGroup:0", "RolloutGroup:0"]
    proc.send_signal(signal.SIGINT)
    try:  # it stops within seconds; the limit is generous, for a loaded machine
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the run had not stopped 60 s after its Ctrl-C")
    assert proc.returncode == 130 and "interrupted: all workers stopped" in err
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    ckpt = find_latest_checkpoint(run_dir)
    state = torch.load(ckpt / "actor" / "actor.pt", weights_only=True)  # complete and loadable
    assert state["model"] and json.loads((ckpt / "runner.json").read_text())["global_step"] >= 2
