"""The user's runs are theirs: no test or tutorial reads or writes what the shipped configs' runs leave in the checkout
(results/<experiment_name>/, results/tiny_vla, results/data/...), whatever the user ran before `pytest`.

conftest.users_checkout stands in for that checkout after the user ran every shipped config (conftest.plant_users_runs);
the tests that load the shipped configs (test_config.py, test_explain.py) and every tutorial (test_tutorials.py) run
there, as their working directory, and fail if they changed it. This file shows that the stand-in bites: in it, every
shipped run is refused or stops on the user's files, one line and exit code 2 before any worker, so a test whose run
folder or model folder escaped its temporary folder fails instead of passing by luck. `.ci/run` does it for real: the
default run first, then the suite, in one clone.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
from pathlib import Path

import pytest
from conftest import PLANTED, ROOT

from rlinf_mini.config import load_config
from rlinf_mini.runners.base import holds_a_run
from rlinf_mini.train import main

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SIMULATORS = {"embodied_mujoco": "mujoco", "embodied_maniskill": "mani_skill", "metaworld_reach": "metaworld",
              "metaworld_push": "metaworld", "metaworld_mt10": "metaworld",
              "metaworld_reach_vla": "metaworld"}  # optional extras (test_simulators)


@pytest.mark.parametrize("config", [*CONFIGS, None], ids=[*(c.stem for c in CONFIGS), "defaults"])
def test_every_shipped_run_started_in_the_users_checkout_stops_on_their_files(config, in_users_checkout, capsys):
    argv = ["--config", str(config)] if config else []
    cfg = load_config(argv)
    run_dir = Path(cfg.runner.logger.log_path) / cfg.runner.logger.experiment_name
    assert holds_a_run(run_dir)  # what the refusal looks for
    for folder in filter(None, (cfg.actor.model.model_path, cfg.rollout.model.model_path)):
        assert PLANTED.strip() in (Path(folder) / "config.json").read_text()
    for file in [*cfg.data.train_data_paths, *cfg.data.val_data_paths]:
        assert Path(file).read_text() == PLANTED
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert multiprocessing.active_children() == []  # no worker started
    module = SIMULATORS.get(config.stem if config else "")
    if module and importlib.util.find_spec(module) is None:
        return  # the missing simulator stops it first (its own one-line error)
    if cfg.runner.task_type == "embodied" and cfg.actor.model.model_path:  # the model folder is the user's (a
        assert f"{cfg.actor.model.model_path}/config.json" in err, err  # reasoning run refuses before the model)
    else:
        assert f"{run_dir} already holds a run" in err, err


def test_a_reasoning_run_is_refused_in_a_folder_holding_a_run_before_it_makes_data_or_a_model(tmp_path, capsys):
    (tmp_path / "results" / "math").mkdir(parents=True)
    (tmp_path / "results" / "math" / "metrics.jsonl").write_text('{"step": 0}\n')
    argv = ["--config", str(ROOT / "configs/math.yaml"), "--runner.logger.log-path", str(tmp_path / "results"),
            "--actor.model.model-path", str(tmp_path / "model"), "--data.train-data-paths",
            str(tmp_path / "train.jsonl"), "--data.val-data-paths", str(tmp_path / "val.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'results' / 'math'} already holds a run; resume it with runner.resume_dir=auto" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no data, no model made
