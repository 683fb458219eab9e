"""Checkpoints: written atomically, and resuming continues the run exactly (CPU: bitwise)."""

from __future__ import annotations

import torch
from conftest import write_config

from rlinf_mini.config import load_config
from rlinf_mini.metric_logger import read_metrics
from rlinf_mini.runner import find_latest_checkpoint
from rlinf_mini.train import RunPlan, build_and_run

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


def test_resume_continues_bitwise(tmp_path):
    straight = train(tmp_path, tmp_path / "straight", steps=4)
    split = train(tmp_path, tmp_path / "split", steps=2)
    assert find_latest_checkpoint(split).name == "global_step_2"
    train(tmp_path, tmp_path / "split", steps=4, resume="auto")

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


def test_checkpoint_folder_is_complete_or_absent(tmp_path):
    run_dir = train(tmp_path, tmp_path / "one", steps=2)
    ckpt = find_latest_checkpoint(run_dir)
    assert sorted(p.name for p in ckpt.iterdir()) == ["actor", "env.pt", "runner.json"]
    assert (ckpt / "actor" / "model" / "config.json").is_file()  # an HF-style folder actor.model.model_path can use
    assert not list((run_dir / "checkpoints").glob(".*tmp"))
    (run_dir / "checkpoints" / ".global_step_9.tmp").mkdir()  # an interrupted write is never picked up
    assert find_latest_checkpoint(run_dir) == ckpt
