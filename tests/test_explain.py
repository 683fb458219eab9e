"""`python -m rlinf_mini.train --config ... --explain`: the plan of every shipped config, printed without starting a
process; on broken configs the number that breaks and two settings that really pass the pre-start checks."""

from __future__ import annotations

import multiprocessing.process
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from rlinf_mini.config import ConfigError, load_config
from rlinf_mini.train import RunPlan, main

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
MLP = str(ROOT / "configs/embodied_mlp.yaml")


@pytest.fixture(autouse=True)
def no_process_may_start(monkeypatch, in_users_checkout):
    """Any process start (a worker, the cluster) fails the test; virtual CPU devices even on a GPU machine. Each test
    runs in the user's checkout after their runs of every shipped config (conftest.in_users_checkout)."""
    import torch

    import rlinf_mini.scheduler.cluster

    def refuse(*args, **kwargs):
        raise AssertionError("--explain started a process")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(rlinf_mini.scheduler.cluster.Cluster, "__init__", refuse)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def explain(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main([*argv, "--explain"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_is_explained(config, capsys):
    code, out, err = explain(["--config", str(config)], capsys)
    assert code == 0 and err == ""
    cfg = load_config(["--config", str(config)])
    for device in range(cfg.cluster.num_devices):
        assert re.search(rf"^  device {device}: ", out, re.M)
    if cfg.runner.task_type == "reasoning":
        for needle in ("world sizes: rollout", "responses, in chunks of", "optimizer steps per update epoch",
                       "all checks pass"):
            assert needle in out, needle
        return
    for needle in ("world sizes: env", "rollout rank 0 serves env rank(s)", "sub-envs per stage", "env rank 0: ",
                   "rollout batch: total_num_envs x rollout_epoch x T", "trajectories to the actor per step",
                   "gradient-accumulation steps", "optimizer steps per training step", "all checks pass"):
        assert needle in out, needle


# Hand-computed plans: (overrides, lines that must appear)
PLANS = [
    ([], ["device 0: actor[0] env[0]", "device 1: actor[1] rollout[0]", "mode: hybrid",
          "train: total_num_envs / (env ranks x stages) = 32 / 2 = 16 sub-envs per stage",
          "env rank 0: 32 envs; stage 0: envs 0-15, stage 1: envs 16-31",
          "= 32 x 1 x 32 = 1024 samples", "total_num_envs x rollout_epoch = 32, each 32 chunk steps (values: 33)",
          "32 / 2 = 16 trajectories per actor rank", "per actor rank: 16 x 32 = 512 samples",
          "256 / 2 = 128 samples per rank per optimizer step", "128 / 128 = 1 gradient-accumulation steps",
          "1024 / 256 = 4 optimizer steps per update epoch", "x update_epoch 4 = 16 optimizer steps"]),
    (["--actor.micro-batch-size", "32", "--actor.global-batch-size", "512"],
     ["512 / 2 = 256 samples per rank per optimizer step", "256 / 32 = 8 gradient-accumulation steps",
      "1024 / 512 = 2 optimizer steps per update epoch", "x update_epoch 4 = 8 optimizer steps"]),
    (["--cluster.component-placement.env", "0-1", "--cluster.component-placement.rollout", "0-1",
      "--env.train.rollout-epoch", "2", "--actor.model.num-action-chunks", "4"],
     ["device 0: actor[0] env[0] rollout[0]", "mode: collocated", "rollout rank 1 serves env rank(s) 1",
      "env rank 1: 16 envs; stage 0: envs 16-23, stage 1: envs 24-31", "32 / 4 = 8 chunk steps",
      "= 32 x 2 x 8 = 512 samples", "total_num_envs x rollout_epoch = 64, each 8 chunk steps (values: 9)",
      "each env rank cuts its batch into 1 piece(s)", "512 / 256 = 2 optimizer steps per update epoch"]),
]


@pytest.mark.parametrize("overrides, lines", PLANS, ids=["mlp", "accumulation", "collocated-epochs-chunks"])
def test_the_plan_has_the_hand_computed_numbers(overrides, lines, capsys):
    code, out, _ = explain(["--config", MLP, *overrides], capsys)
    assert code == 0
    for line in lines:
        assert line in out, line


BROKEN = [  # (overrides, base config, the key and number that break it)
    (["--actor.micro-batch-size", "96"], MLP, "actor.global_batch_size = 256"),
    (["--env.train.total-num-envs", "30"], MLP, "actor.global_batch_size = 256"),
    (["--rollout.pipeline-stage-num", "3"], MLP, "env.train.total_num_envs = 32"),
    (["--cluster.num-devices", "3", "--cluster.component-placement.env", "0-1",
      "--cluster.component-placement.rollout", "0-2"], MLP, "cluster.component_placement"),
    (["--env.train.max-steps-per-rollout-epoch", "30", "--actor.model.num-action-chunks", "4"], MLP,
     "env.train.max_steps_per_rollout_epoch = 30"),
    (["--env.train.total-num-envs", "60"], str(ROOT / "configs/embodied_grpo.yaml"), "env.train.total_num_envs = 60"),
]


@pytest.mark.parametrize("overrides, base, breaking", BROKEN,
                         ids=["micro-batch", "envs-vs-global-batch", "stages", "rollout-ranks", "chunks",
                              "grpo-groups"])
def test_a_broken_config_names_the_number_and_two_settings_that_pass(overrides, base, breaking, capsys, tmp_path):
    argv = ["--config", base, *overrides]
    code, out, err = explain(argv, capsys)
    assert code == 2
    # the same one-line error as a training run with this config
    assert main(argv) == 2
    assert capsys.readouterr().err == err and len(err.strip().splitlines()) == 1
    assert f"breaks: {breaking}\n" in out
    assert "device 0:" in out  # the plan as far as it goes
    suggestions = out.split("setting(s) near it that pass every check:\n", 1)[1].strip().splitlines()
    assert len(suggestions) == 2
    for line in suggestions:
        fixed = argv + line.split()
        cfg = load_config(fixed)  # validate_config
        cfg.runner.logger.log_path = str(tmp_path / "results")  # not the user's results/embodied, which holds a run
        RunPlan(cfg, "fixed")  # placement, batch arithmetic, env and model: what a run checks before starting
        code, out, err = explain(fixed, capsys)
        assert code == 0 and "all checks pass" in out and err == ""


def test_without_a_fix_nearby_it_says_so(capsys):
    argv = ["--config", MLP, "--cluster.num-devices", "3", "--cluster.component-placement.env", "0-2",
            "--cluster.component-placement.rollout", "0-1"]
    code, out, err = explain(argv, capsys)
    assert code == 2 and "breaks: env.train.total_num_envs = 32\n" in out
    assert "no change of one or two nearby batch or placement numbers fixes it" in out
    assert "env ranks 3 / rollout ranks 2: does not divide" in out


def test_a_placement_that_cannot_parse_prints_what_it_can(capsys):
    argv = ["--config", MLP, "--cluster.component-placement.env", "5"]
    code, out, err = explain(argv, capsys)
    assert code == 2 and "cannot place the components" in out
    assert "breaks: cluster.component_placement.env = 5" in out
    assert "cluster.component_placement.env: device 5 is out of range" in err
    assert main(argv) == 2 and capsys.readouterr().err == err  # the same line as a training run's


def test_bad_yaml_is_still_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  global_batch_sise: 3\n")
    code, out, err = explain(["--config", str(bad)], capsys)
    assert code == 2 and out == "" and "actor.global_batch_sise: unknown key" in err


def test_explain_is_not_a_config_key_and_help_still_works(capsys):
    with pytest.raises(ConfigError, match="--explain"):
        load_config(["--explain"])  # tyro does not know it: no collision with a config key
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", MLP, "--help", "--explain"])
    assert exit_info.value.code == 0 and "--actor.global-batch-size" in capsys.readouterr().out


def test_the_command_line_flag(tmp_path):
    """For real: `python -m rlinf_mini.train ... --explain` exits 0 and prints the plan; broken, exits 2."""
    runs = [subprocess.Popen([sys.executable, "-m", "rlinf_mini.train", "--config", MLP, *extra, "--explain"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for extra in ([], ["--actor.micro-batch-size", "96"])]
    (ok_out, ok_err), (bad_out, bad_err) = (r.communicate(timeout=120) for r in runs)
    assert runs[0].returncode == 0 and "all checks pass" in ok_out and ok_err == ""
    assert runs[1].returncode == 2 and "breaks: actor.global_batch_size = 256" in bad_out
    assert bad_err.startswith("error: ") and len(bad_err.strip().splitlines()) == 1


@pytest.mark.parametrize("config", ["embodied", "math"])  # a VLA folder to make; reasoning data and a model to make
def test_planning_writes_nothing_and_prepare_makes_the_files(config, tmp_path, capsys):
    """--explain and RunPlan / ReasoningRunPlan (planning) leave no file behind, where the config names a model folder
    and data files that do not exist yet; `prepare()`, the step just before workers start, makes them."""
    from conftest import tree_snapshot

    from rlinf_mini.train import ReasoningRunPlan

    argv = ["--config", str(ROOT / f"configs/{config}.yaml"), "--runner.logger.log-path", str(tmp_path / "results"),
            "--actor.model.model-path", str(tmp_path / "model")]
    if config == "math":
        argv += ["--data.train-data-paths", str(tmp_path / "data/train.jsonl"),
                 "--data.val-data-paths", str(tmp_path / "data/val.jsonl")]
    code, out, err = explain(argv, capsys)
    assert code == 0 and "all checks pass" in out
    cfg = load_config(argv)
    plan = (ReasoningRunPlan if config == "math" else RunPlan)(cfg, config)
    assert tree_snapshot(tmp_path) == {}  # nothing written: not the model, not the data, not the run folder
    plan.prepare()
    assert (tmp_path / "model" / "config.json").is_file() and not plan.run_dir.exists()
    if config == "math":
        assert (tmp_path / "data/train.jsonl").is_file() and len(plan.train_set) >= cfg.data.rollout_batch_size
