"""The config: precedence (defaults < YAML < command line), YAML round trips, `--help` covering every key, one-line
errors (exit code 2, the key named, no worker started), and the batch arithmetic with its numbers.

Most bad-input cases call `rlinf_mini.train.main([...])` in this process (it returns the exit code); a few run
`python -m rlinf_mini.train` for real, all at once, to prove the exit code and that no worker process appears.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import multiprocessing
import os
import re
import subprocess
import sys
import time
import typing
import uuid
from pathlib import Path

import gymnasium
import pytest
from conftest import ROOT, parent_pid, write_config

from rlinf_mini.config import (
    ConfigError,
    TrainConfig,
    check_batch_arithmetic,
    config_from_yaml,
    load_config,
    save_config,
    validate_config,
)
from rlinf_mini.train import RunPlan, main

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def cpu_devices(monkeypatch):
    """Use cluster.num_devices virtual devices even on a GPU machine, so the placements below mean the same there."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# --------------------------------------------------------------------------------------------------------------------
# Walking the schema


def leaf_paths(cls: type = TrainConfig, prefix: str = "") -> dict[str, type]:
    """'actor.optim.lr' -> float, for every key that holds a value (sections are walked, not listed)."""
    leaves = {}
    for name, tp in typing.get_type_hints(cls).items():
        path = f"{prefix}{name}"
        leaves |= leaf_paths(tp, f"{path}.") if dataclasses.is_dataclass(tp) else {path: tp}
    return leaves


def field_docstrings(cls: type = TrainConfig, prefix: str = "") -> dict[str, str]:
    """'actor.optim.lr' -> its docstring (the string under the field), for every field, sections included."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for stmt, nxt in zip(body[:-1], body[1:], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[f"{prefix}{stmt.target.id}"] = " ".join(nxt.value.value.split())
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            docs |= field_docstrings(tp, f"{prefix}{name}.")
    return docs


def test_every_field_has_a_docstring():
    fields = set(leaf_paths()) | {p.rpartition(".")[0] for p in leaf_paths()} - {""}
    assert fields - set(field_docstrings()) == set()


# --------------------------------------------------------------------------------------------------------------------
# Precedence: dataclass defaults < YAML < command line


def write_yaml(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


PARTIAL_YAML = """
cluster:
  component_placement: {env: 0, rollout: 1, actor: 0-1}
runner:
  logger: {logger_backends: []}
actor:
  global_batch_size: 64
  optim: {lr: 0.01, value_lr: 1e-3}
env:
  train:
    total_num_envs: 8
    init_params: {goal_radius: 0.3}
"""


def test_no_arguments_gives_the_dataclass_defaults():
    assert load_config([]) == TrainConfig()


def test_the_dataclass_defaults_alone_form_a_valid_run(tmp_path, in_users_checkout):
    cfg = load_config([])
    cfg.runner.logger.log_path = str(tmp_path / "results")  # the user's results/default holds their run
    plan = RunPlan(cfg, "defaults")  # placement, batch arithmetic, env and model checks
    assert plan.world_sizes == {"env": 2, "rollout": 2, "actor": 2}
    assert not (tmp_path / "results").exists()  # the plan creates no run folder


def test_yaml_overrides_defaults_key_by_key(tmp_path):
    cfg = load_config(["--config", write_yaml(tmp_path, PARTIAL_YAML)])
    default = TrainConfig()
    assert cfg.actor.optim.lr == 0.01 and cfg.actor.global_batch_size == 64 and cfg.env.train.total_num_envs == 8
    assert cfg.actor.optim.value_lr == 0.001  # `1e-3` without a dot is a float, as in YAML 1.2 / OmegaConf
    assert cfg.env.train.init_params.goal_radius == 0.3
    # keys the file does not name keep their defaults, at every depth
    assert cfg.actor.optim.adam_eps == default.actor.optim.adam_eps
    assert cfg.actor.micro_batch_size == default.actor.micro_batch_size
    assert cfg.env.train.init_params.id == "FakeReach-v0" and cfg.env.train.seed == 0
    assert cfg.env.eval == default.env.eval  # eval keeps its own defaults (seed 10000, fixed reset states)
    assert cfg.algorithm == default.algorithm
    assert cfg.runner.logger.logger_backends == []  # a list is replaced, not appended to
    # the placement dict is replaced as a whole (no leftover default key), and YAML ints arrive as strings
    assert cfg.cluster.component_placement == {"env": "0", "rollout": "1", "actor": "0-1"}


def test_command_line_overrides_yaml(tmp_path):
    cfg = load_config([
        "--config", write_yaml(tmp_path, PARTIAL_YAML),
        "--actor.optim.lr", "0.1",
        "--env.train.init-params.goal-radius", "0.5",
        "--actor.micro_batch_size", "32",  # underscores work as well as dashes
        "--runner.logger.logger-backends", "tensorboard",
        "--cluster.component-placement.actor", "1",
        "--runner.no-progress-bar",
        "--runner.resume-dir", "auto",
        "--algorithm.adv-type", "reinpp",
    ])
    assert cfg.actor.optim.lr == 0.1 and cfg.actor.optim.value_lr == 0.001  # CLI wins; the YAML's other key stays
    assert cfg.env.train.init_params.goal_radius == 0.5 and cfg.env.train.init_params.dim == 2
    assert cfg.actor.micro_batch_size == 32 and cfg.actor.global_batch_size == 64
    assert cfg.runner.logger.logger_backends == ["tensorboard"]
    assert cfg.cluster.component_placement == {"env": "0", "rollout": "1", "actor": "1"}
    assert cfg.runner.progress_bar is False and cfg.runner.resume_dir == "auto"
    assert cfg.algorithm.adv_type == "reinpp"


def test_config_flag_with_an_equals_sign(tmp_path):
    path = write_yaml(tmp_path, PARTIAL_YAML)
    assert load_config([f"--config={path}", "--actor.optim.lr", "0.1"]) == load_config(
        ["--config", path, "--actor.optim.lr", "0.1"])


def test_command_line_overrides_defaults_without_a_file():
    cfg = load_config(["--actor.optim.lr", "0.1", "--runner.logger.logger-backends"])
    assert cfg.actor.optim.lr == 0.1 and cfg.runner.logger.logger_backends == []
    assert cfg.actor.optim.value_lr == TrainConfig().actor.optim.value_lr


def test_yaml_values_are_converted_to_the_field_type(tmp_path):
    cfg = config_from_yaml(write_yaml(tmp_path, "actor: {optim: {lr: 1}}\nrunner: {resume_dir: null}\n"))
    assert cfg.actor.optim.lr == 1.0 and type(cfg.actor.optim.lr) is float
    assert cfg.runner.resume_dir is None
    with pytest.raises(ConfigError, match=r"actor\.optim\.lr: expected a number, got '1e-3'"):
        config_from_yaml(write_yaml(tmp_path, "actor: {optim: {lr: '1e-3'}}\n"))  # quoted: a string


def test_empty_yaml_file_gives_the_defaults(tmp_path):
    assert config_from_yaml(write_yaml(tmp_path, "")) == TrainConfig()
    assert config_from_yaml(write_yaml(tmp_path, "# only a comment\n")) == TrainConfig()


# --------------------------------------------------------------------------------------------------------------------
# Round trip, and every shipped config is valid


def test_defaults_round_trip_through_yaml(tmp_path):
    save_config(TrainConfig(), tmp_path / "out.yaml")
    assert config_from_yaml(tmp_path / "out.yaml") == TrainConfig()


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_config_round_trips_and_is_valid(tmp_path, config, in_users_checkout):
    cfg = config_from_yaml(config)
    save_config(cfg, tmp_path / "out.yaml")
    assert config_from_yaml(tmp_path / "out.yaml") == cfg
    assert load_config(["--config", str(config)]) == cfg  # tyro's pass changes nothing
    validate_config(cfg, str(config))
    module = {"maniskill": "mani_skill", "metaworld": "metaworld"}.get(cfg.env.train.env_type)
    if cfg.env.train.env_type == "gymnasium":  # an id registered from gymnasium.envs.mujoco needs the .[mujoco] extra
        if ".mujoco." in str(gymnasium.spec(cfg.env.train.init_params.id).entry_point):
            module = "mujoco"
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{config.name}: {module} is not installed")
    # the run folder and the model folder RunPlan checks: here, not in the user's checkout (cwd), whose results/
    # holds their runs of every shipped config
    cfg.runner.logger.log_path = str(tmp_path / "results")
    if cfg.actor.model.model_type == "tiny_vla":
        cfg.actor.model.model_path = str(tmp_path / "tiny_vla")
    if cfg.runner.task_type == "reasoning":  # placement and batch arithmetic (planning makes no model or data)
        from rlinf_mini.train import ReasoningRunPlan

        ReasoningRunPlan(cfg, str(config))
        return
    RunPlan(cfg, str(config))  # placement, batch arithmetic, env spec, model: everything but starting workers


def test_async_ppo_keys_have_rlinfs_defaults_and_read_rlinfs_values(tmp_path):
    """RLinf's defaults (the .get() fallbacks of its async runner, actor and rollout); its example values load and
    round-trip; validated with the synchronous loss, since the decoupled one's runner is not there yet."""
    cfg = TrainConfig()
    assert (cfg.algorithm.staleness_threshold, cfg.algorithm.behave_weight_threshold,
            cfg.algorithm.rollout_store_size_per_rank, cfg.algorithm.on_policy_min_ratio) == (None, None, 1, 0.0)
    assert (cfg.rollout.recompute_logprobs, cfg.actor.sync_weight_no_wait) == (False, False)
    file = write_yaml(tmp_path, "algorithm: {staleness_threshold: 1, behave_weight_threshold: 2, "
                                "rollout_store_size_per_rank: 2, on_policy_min_ratio: 0.1}\n"
                                "rollout: {recompute_logprobs: true}\nactor: {sync_weight_no_wait: true}\n")
    cfg = config_from_yaml(file)
    assert (cfg.algorithm.staleness_threshold, cfg.algorithm.behave_weight_threshold) == (1, 2.0)
    assert cfg.rollout.recompute_logprobs and cfg.actor.sync_weight_no_wait
    validate_config(cfg, file)
    save_config(cfg, tmp_path / "out.yaml")
    assert config_from_yaml(tmp_path / "out.yaml") == cfg
    cfg.algorithm.loss_type = "decoupled_actor_critic"
    cfg.algorithm.on_policy_min_ratio = 0.0  # the async runner trains every batch in order: only 0 runs
    validate_config(cfg, file)
    cfg.algorithm.staleness_threshold = None
    with pytest.raises(ConfigError, match="^[^\n]*algorithm.staleness_threshold: async PPO [^\n]* needs a bound"):
        validate_config(cfg, file)


def test_round_trip_keeps_command_line_overrides(tmp_path):
    cfg = load_config(["--config", str(CONFIGS[0]), "--actor.optim.lr", "0.1", "--runner.resume-dir", "auto",
                       "--runner.logger.logger-backends"])
    save_config(cfg, tmp_path / "out.yaml")
    assert config_from_yaml(tmp_path / "out.yaml") == cfg


# --------------------------------------------------------------------------------------------------------------------
# Subprocess runs: `python -m rlinf_mini.train ...` for real, all started at once


MARKER_VAR = "RLINF_MINI_TEST_CLI_RUN"  # inherited by any process a run spawns, so we can find its workers


def marked_processes(marker: str) -> dict[int, str]:
    """pid -> cmdline of every process whose environment holds MARKER_VAR=marker."""
    needle = f"{MARKER_VAR}={marker}\0".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if needle in Path(entry.path, "environ").read_bytes():
                found[int(entry.name)] = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone, or not ours to read
            continue
    return found


SUBPROCESS_CASES = {  # name -> (argv builder, a string the error must name): a bad file, a bad placement, bad sizes
    "help": (lambda tmp: ["--help"], None),
    "unknown_nested_yaml_key": (lambda tmp: ["--config", str(write_config(tmp, actor={"optim": {"lrr": 0.1}}))],
                                "actor.optim.lrr"),
    "device_out_of_range": (lambda tmp: ["--config", str(write_config(
        tmp, cluster={"component_placement": {"env": 0, "rollout": 1, "actor": "0-7"}}))],
                            "cluster.component_placement.actor"),
    "global_batch_not_divisible": (lambda tmp: ["--config", str(write_config(
        tmp, actor={"global_batch_size": 100, "micro_batch_size": 64}))], "actor.global_batch_size"),
}


@dataclasses.dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    log_path: Path
    spawned: dict[int, str]  # worker processes seen while it ran
    leftover: dict[int, str]  # any of its processes still alive after it exited


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, CliRun]:
    """Each case of SUBPROCESS_CASES run once; they run side by side (each spends ~3 s importing torch)."""
    started = {}
    for name, (make_argv, _) in SUBPROCESS_CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        marker = uuid.uuid4().hex
        env = {**os.environ, MARKER_VAR: marker, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "100"}
        argv = [sys.executable, "-m", "rlinf_mini.train", *make_argv(tmp),
                "--runner.logger.log-path", str(tmp / "results")]
        out, err = open(tmp / "stdout", "w+"), open(tmp / "stderr", "w+")  # files: --help is more than a pipe holds
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        started[name] = (proc, marker, out, err, tmp)
    spawned: dict[str, dict[int, str]] = {name: {} for name in started}
    deadline = time.monotonic() + 240  # a hang guard, not a speed check
    while any(proc.poll() is None for proc, *_ in started.values()):
        if time.monotonic() > deadline:
            for proc, *_ in started.values():
                proc.kill()
            pytest.fail("a `python -m rlinf_mini.train` run had not ended 240 s after its start")
        for name, (proc, marker, *_) in started.items():
            if proc.poll() is None:  # a worker takes seconds to start: polling every 0.1 s cannot miss it
                # every process of the run but the driver and its own children: multiprocessing's tracker and the
                # fork server, idle (a fork of the driver, made before RunPlan's checks: local.start_fork_server_here).
                # A rank is the server's child.
                spawned[name] |= {pid: cmd for pid, cmd in marked_processes(marker).items()
                                  if pid != proc.pid and parent_pid(pid) != proc.pid}
        time.sleep(0.1)
    runs = {}
    for name, (proc, marker, out, err, tmp) in started.items():
        with out, err:
            out.seek(0)
            err.seek(0)
            runs[name] = CliRun(proc.returncode, out.read(), err.read(), tmp / "results", spawned[name],
                                marked_processes(marker))
    return runs


def normalized(help_text: str) -> str:
    """The help text without its box drawing, one space between words (rich wraps lines inside the boxes)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", help_text).split())


def test_help_lists_every_key_with_its_docstring(cli_runs):
    run = cli_runs["help"]
    assert run.returncode == 0, run.stderr
    text = normalized(run.stdout)
    leaves = leaf_paths()
    for path, tp in leaves.items():
        dashed = path.replace("_", "-")
        if path.endswith("init_params.make_kwargs"):  # an empty dict by default: no flags (YAML or key=value)
            continue
        if typing.get_origin(tp) is dict and path.startswith("profile_data."):  # empty by default: one flag
            assert f"--{dashed} [STR FLOAT" in text, path
        elif typing.get_origin(tp) is dict:  # one flag per key of the dict: a group '<path> options'
            assert f"{dashed} options" in text, path
            assert f"--{dashed}.env,rollout,actor STR" in text, path  # the default's key
        else:
            assert re.search(rf"--{re.escape(dashed)}[ ,]", text), path  # a bool: '--x.y, --x.no-y'
    assert " ".join(TrainConfig.__doc__.split()[:6]) in text  # the description
    for path, doc in field_docstrings().items():
        first_words = " ".join(doc.split()[:6])
        assert first_words in text, f"{path}: docstring {first_words!r} is not in --help"
    # and nothing else: every flag in the help is a key of the schema (or its 'no-' form for a bool)
    flags = {f.rstrip(",") for f in re.findall(r"--([\w.,-]+)", text)} - {"help", "config", "explain"}
    known = {p.replace("_", "-") for p in leaves}
    for flag in flags:
        section, _, key = flag.rpartition(".")
        assert (flag in known or f"{section}.{key.removeprefix('no-')}" in known
                or section.replace("-", "_") == "cluster.component_placement"), flag


def test_help_shows_the_yaml_values_as_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(ROOT / "configs" / "embodied_mlp.yaml"), "--help"])
    assert exit_info.value.code == 0
    text = normalized(capsys.readouterr().out)
    after = text[text.index("--runner.max-epochs INT"):]
    assert after[after.index("(default:"):].startswith("(default: 40)")  # embodied_mlp.yaml's value, not 100
    assert "--cluster.component-placement.actor STR" in text  # the YAML's keys, not the default's
    assert "--cluster.component-placement.env,rollout,actor" not in text


@pytest.mark.parametrize("name", [n for n in SUBPROCESS_CASES if n != "help"])
def test_bad_input_exits_2_with_one_line_before_any_worker_starts(cli_runs, name):
    run = cli_runs[name]
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert run.stderr.endswith("\n") and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("error: ") and SUBPROCESS_CASES[name][1] in run.stderr, run.stderr
    assert not run.log_path.exists()  # no run folder
    assert run.spawned == {}, f"workers started: {run.spawned}"
    assert run.leftover == {}, f"processes outlived the run: {run.leftover}"


# --------------------------------------------------------------------------------------------------------------------
# Bad input, in this process: main() returns 2 and prints one line naming the key


PLACEMENT = {"env": 0, "rollout": 1, "actor": "0-1"}  # embodied.yaml's: env ranks 1, rollout 1, actor 2

BAD_YAML = {  # id -> (sections merged into embodied.yaml, a string the error must name); "{tmp}" is tmp_path
    "unknown_top_level_key": ({"foo": 1}, "foo: unknown key"),
    "unknown_nested_key": ({"actor": {"optim": {"lrr": 0.1}}}, "actor.optim.lrr: unknown key"),
    "unknown_key_suggests": ({"actor": {"optim": {"value_l": 0.1}}}, "did you mean 'actor.optim.value_lr'"),
    "string_for_int": ({"actor": {"global_batch_size": "abc"}}, "actor.global_batch_size: expected an integer"),
    "float_for_int": ({"runner": {"max_epochs": 2.5}}, "runner.max_epochs: expected an integer"),
    "null_for_int": ({"runner": {"max_epochs": None}}, "runner.max_epochs: expected an integer"),
    "list_for_float": ({"actor": {"optim": {"lr": [1, 2]}}}, "actor.optim.lr: expected a number"),
    "int_for_bool": ({"runner": {"progress_bar": 1}}, "runner.progress_bar: expected true or false"),
    "string_for_list": ({"runner": {"logger": {"logger_backends": "tensorboard"}}},
                        "runner.logger.logger_backends: expected a list"),
    "scalar_for_section": ({"actor": 3}, "actor: expected a mapping"),
    "empty_placement_value": ({"cluster": {"component_placement": {**PLACEMENT, "env": ""}}},
                              "cluster.component_placement.env"),
    "null_placement_value": ({"cluster": {"component_placement": {**PLACEMENT, "env": None}}},
                             "cluster.component_placement.env"),
    "empty_placement": ({"cluster": {"component_placement": {}}}, "cluster.component_placement"),
    "placement_0-": ({"cluster": {"component_placement": {**PLACEMENT, "actor": "0-"}}},
                     "cluster.component_placement.actor"),
    "placement_a": ({"cluster": {"component_placement": {**PLACEMENT, "actor": "a"}}},
                    "cluster.component_placement.actor"),
    "placement_3-1": ({"cluster": {"component_placement": {**PLACEMENT, "actor": "3-1"}}},
                      "cluster.component_placement.actor"),
    "device_out_of_range": ({"cluster": {"num_devices": 2, "component_placement": {**PLACEMENT, "actor": "0-7"}}},
                            "cluster.component_placement.actor: device 2 is out of range for num_devices=2"),
    "missing_component": ({"cluster": {"component_placement": {"env": 0, "rollout": 1}}},
                          "cluster.component_placement.actor: missing"),
    "total_num_envs_not_divisible": ({"env": {"train": {"total_num_envs": 33}}}, "env.train.total_num_envs"),
    "eval_num_envs_not_divisible": ({"env": {"eval": {"total_num_envs": 7}}}, "env.eval.total_num_envs"),
    "global_batch_not_divisible_by_micro": ({"actor": {"global_batch_size": 100, "micro_batch_size": 64}},
                                            "actor.global_batch_size"),
    "rollout_batch_not_multiple_of_global": ({"actor": {"global_batch_size": 384, "micro_batch_size": 64}},
                                             "actor.global_batch_size"),
    "negative_total_num_envs": ({"env": {"train": {"total_num_envs": -4}}}, "env.train.total_num_envs: must be"),
    "zero_update_epoch": ({"algorithm": {"update_epoch": 0}}, "algorithm.update_epoch: must be positive"),
    "steps_not_multiple_of_chunks": ({"actor": {"model": {"num_action_chunks": 3}}},
                                     "env.train.max_steps_per_rollout_epoch"),
    "model_path_without_config_json": ({"actor": {"model": {"model_path": "{tmp}"}}}, "actor.model.model_path"),
    "unknown_gymnasium_id": ({"env": {"train": {"env_type": "gymnasium", "init_params": {"id": "Foo-v0"}}}},
                             "env.train.init_params.id"),
    "zero_fake_dim": ({"env": {"eval": {"init_params": {"dim": 0}}}}, "env.eval.init_params.dim: must be positive"),
    "negative_fake_dim": ({"env": {"train": {"init_params": {"dim": -1}}, "eval": {"init_params": {"dim": -1}}}},
                          "env.train.init_params.dim: must be positive"),
    "unknown_fake_id": ({"env": {"train": {"init_params": {"id": "Bar-v0"}}}}, "env.train.init_params.id"),
    "unknown_adv_type": ({"algorithm": {"adv_type": "ppo"}}, "algorithm.adv_type"),
    "unknown_env_type": ({"env": {"eval": {"env_type": "isaac"}}}, "env.eval.env_type"),
    "gae_without_value_head": ({"actor": {"model": {"add_value_head": False}}}, "actor.model.add_value_head"),
    "resume_dir_missing": ({"runner": {"resume_dir": "{tmp}/no_such_run"}}, "runner.resume_dir"),
    "unknown_logger_backend": ({"runner": {"logger": {"logger_backends": ["wandb"]}}},
                               "runner.logger.logger_backends"),
    "group_size_mismatch": ({"algorithm": {"group_size": 2}}, "env.train.group_size"),
    "grpo_group_of_one": ({"algorithm": {"adv_type": "grpo", "loss_type": "actor"}}, "algorithm.group_size"),
    "decoupled_without_bound": ({"algorithm": {"loss_type": "decoupled_actor_critic"}},
                                "algorithm.staleness_threshold: async PPO"),
    "decoupled_on_policy_min_ratio": ({"algorithm": {"loss_type": "decoupled_actor_critic", "staleness_threshold": 1,
                                                     "on_policy_min_ratio": 0.5}}, "algorithm.on_policy_min_ratio"),
    "decoupled_weight_sync_interval": ({"algorithm": {"loss_type": "decoupled_actor_critic", "staleness_threshold": 1},
                                        "runner": {"weight_sync_interval": 2}}, "runner.weight_sync_interval"),
}


READ_ERRORS = {"unknown_top_level_key", "unknown_nested_key", "unknown_key_suggests", "string_for_int", "float_for_int",
               "null_for_int", "list_for_float", "int_for_bool", "string_for_list", "scalar_for_section",
               "null_placement_value", "unknown_adv_type", "unknown_env_type"}


def fill_tmp(value, tmp_path: Path):
    if isinstance(value, dict):
        return {k: fill_tmp(v, tmp_path) for k, v in value.items()}
    return value.replace("{tmp}", str(tmp_path)) if isinstance(value, str) else value


def assert_one_line_error(capsys, argv: list[str], must_name: str, log_path: Path) -> str:
    assert main([*argv, "--runner.logger.log-path", str(log_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("error: ") and must_name in err, err
    assert not log_path.exists() and multiprocessing.active_children() == []
    return err


def test_only_config_errors_are_one_line_other_errors_keep_their_traceback(tmp_path, capsys, monkeypatch):
    """A model folder that does not fit is a config error: one line, exit 2. A ValueError no config check raised
    (here planted in the env spec, standing for a bug) is not worded as one: main lets it through, traceback and all."""
    import rlinf_mini.envs

    path = write_config(tmp_path)
    (tmp_path / "empty").mkdir()
    assert_one_line_error(capsys, ["--config", str(path), "--actor.model.model-path", str(tmp_path / "empty")],
                          "actor.model.model_path", tmp_path / "results")

    def bug(*args, **kwargs):
        raise ValueError("a bug, not a config error")

    monkeypatch.setattr(rlinf_mini.envs, "get_env_spec", bug)
    with pytest.raises(ValueError, match="a bug, not a config error"):
        main(["--config", str(path)])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case", list(BAD_YAML))
def test_bad_yaml_is_one_line_naming_the_key(tmp_path, capsys, case):
    sections, must_name = BAD_YAML[case]
    config = write_config(tmp_path, **fill_tmp(sections, tmp_path))
    err = assert_one_line_error(capsys, ["--config", str(config)], must_name, tmp_path / "results")
    if case in READ_ERRORS:  # caught while reading the file: the file is named too
        assert str(config) in err


BAD_COMMAND_LINE = {  # id -> (arguments after --config embodied.yaml, a string the error must name)
    "bad_float": (["--actor.optim.lr", "abc"], "--actor.optim.lr"),
    "bad_int_message_not_cut": (["--actor.global-batch-size", "abc"], "--actor.global-batch-size: invalid literal "
                                                                      "for int() with base 10: 'abc'"),
    "bad_choice": (["--algorithm.adv-type", "ppo"], "--algorithm.adv-type"),
    "missing_value": (["--actor.global-batch-size"], "--actor.global-batch-size"),
    "unknown_flag": (["--actor.optim.lrr", "0.1"], "--actor.optim.lrr: unknown flag (actor.optim has no key 'lrr'; "
                                                    "did you mean --actor.optim.lr?)"),
    "unknown_flag_with_equals": (["--actor.optim.lrr=1e-3"], "did you mean --actor.optim.lr?"),
    "unknown_section_flag": (["--actr.optim.lr", "1e-3"], "no section 'actr'; did you mean --actor.optim.lr?"),
    "unknown_key_override": (["actor.optim.lrr=1e-3"], "actor.optim.lrr: unknown key (did you mean 'actor.optim.lr'?)"),
    "unknown_placement_component": (["--cluster.component-placement.critic", "0"],
                                    "--cluster.component-placement.critic"),
    "bad_placement": (["--cluster.component-placement.actor", "0-"], "cluster.component_placement.actor"),
    "negative_on_command_line": (["--env.train.total-num-envs", "-4"], "env.train.total_num_envs"),
}


@pytest.mark.parametrize("case", list(BAD_COMMAND_LINE))
def test_bad_command_line_is_one_line_naming_the_flag(tmp_path, capsys, case):
    args, must_name = BAD_COMMAND_LINE[case]
    assert_one_line_error(capsys, ["--config", str(write_config(tmp_path)), *args], must_name, tmp_path / "results")


def test_flag_errors_come_from_the_schema_not_from_tyros_console(tmp_path, capsys, monkeypatch):
    """tyro frames its errors in a box on the console; the one line comes from the schema (load.flag_error), so a
    tyro that words its errors otherwise, or prints nothing, gives the same line."""
    import tyro

    def tyro_printing_something_else(*args, **kwargs):
        print("╭─ some other framing ─╮\n│ Error: something else │\n╰──────────────────────╯")
        raise SystemExit(2)

    config = str(write_config(tmp_path))
    for args, must_name in [BAD_COMMAND_LINE[case] for case in ("bad_float", "bad_int_message_not_cut", "bad_choice",
                                                               "missing_value", "unknown_flag")]:
        assert_one_line_error(capsys, ["--config", config, *args], must_name, tmp_path / "results")
        with monkeypatch.context() as m:
            m.setattr(tyro, "cli", tyro_printing_something_else)
            with pytest.raises(ConfigError) as error:
                load_config(["--config", config, *args])
        assert must_name in str(error.value) and "something else" not in str(error.value)


BAD_FILE = {  # id -> (file text or None for no file, a string the error must name besides the file)
    "yaml_syntax_error": ("actor: {global_batch_size: 1\n", "YAML syntax error at line 2"),
    "yaml_bad_indentation": ("actor:\n  seed: 1\n micro_batch_size: 2\n", "YAML syntax error at line 3"),
    "top_level_not_a_mapping": ("- actor\n- env\n", "the top level must be a mapping"),
    "missing_file": (None, "config file not found"),
}


@pytest.mark.parametrize("case", list(BAD_FILE))
def test_bad_file_is_one_line_naming_the_file(tmp_path, capsys, case):
    text, must_name = BAD_FILE[case]
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    err = assert_one_line_error(capsys, ["--config", str(path)], must_name, tmp_path / "results")
    assert str(path) in err


def test_config_flag_without_a_file(capsys):
    assert main(["--config"]) == 2
    assert capsys.readouterr().err == "error: command line: --config needs a file\n"


# --------------------------------------------------------------------------------------------------------------------
# check_batch_arithmetic: the rule that breaks, with its numbers


def small_cfg(total_num_envs: int = 16, group_size: int = 1, stages: int = 1, rollout_epoch: int = 1,
              steps: int = 8, chunks: int = 1, global_batch: int = 64, micro_batch: int = 32) -> TrainConfig:
    cfg = TrainConfig()
    cfg.env.train.total_num_envs, cfg.env.eval.total_num_envs = total_num_envs, total_num_envs
    cfg.env.train.group_size = cfg.env.eval.group_size = cfg.algorithm.group_size = group_size
    cfg.env.train.rollout_epoch = rollout_epoch
    cfg.env.train.max_steps_per_rollout_epoch = steps
    cfg.rollout.pipeline_stage_num = stages
    cfg.actor.model.num_action_chunks = chunks
    cfg.actor.global_batch_size, cfg.actor.micro_batch_size = global_batch, micro_batch
    return cfg


@pytest.mark.parametrize(
    "cfg, env_ranks, rollout_ranks, actor_ranks",
    [
        (small_cfg(), 1, 1, 1),
        (small_cfg(), 2, 1, 2),  # 16 x 8 = 128 samples, 2 steps of 64 = 2 ranks x 32
        (small_cfg(total_num_envs=32, stages=2, group_size=4, global_batch=128, micro_batch=32), 2, 2, 2),
        (small_cfg(total_num_envs=12, steps=8, chunks=2, global_batch=48, micro_batch=16), 1, 1, 3),
        (small_cfg(total_num_envs=8, rollout_epoch=3, global_batch=64, micro_batch=64), 4, 2, 1),
    ],
)
def test_batch_arithmetic_accepts(cfg, env_ranks, rollout_ranks, actor_ranks):
    check_batch_arithmetic(cfg, env_ranks, rollout_ranks, actor_ranks, "test")


@pytest.mark.parametrize(
    "cfg, env_ranks, rollout_ranks, actor_ranks, message",
    [
        (small_cfg(total_num_envs=30, stages=2), 4, 4, 1,
         "test: env.train.total_num_envs: 30 is not divisible by env ranks x pipeline_stage_num x group_size "
         "= 4 x 2 x 1 = 8"),
        (small_cfg(total_num_envs=12, group_size=4), 2, 2, 1,
         "test: env.train.total_num_envs: 12 is not divisible by env ranks x pipeline_stage_num x group_size "
         "= 2 x 1 x 4 = 8"),
        (small_cfg(total_num_envs=24), 3, 2, 1,
         "test: cluster.component_placement: env ranks (3) must be a multiple of rollout ranks (2)"),
        (small_cfg(total_num_envs=16, global_batch=48, micro_batch=16), 1, 1, 3,
         "test: env.train.total_num_envs: each env rank's 16 trajectories cannot be split into 3 equal pieces of "
         "whole groups of 1 for 3 actor ranks"),
        (small_cfg(global_batch=100, micro_batch=64), 1, 1, 2,
         "test: actor.global_batch_size: 100 is not divisible by micro_batch_size x actor ranks = 64 x 2"),
        (small_cfg(total_num_envs=16, steps=8, global_batch=96, micro_batch=32), 1, 1, 1,
         "test: actor.global_batch_size: the rollout batch of 128 samples (total_num_envs x rollout_epoch x chunk "
         "steps) is not a multiple of global_batch_size=96"),
        (small_cfg(total_num_envs=16, rollout_epoch=2, steps=8, chunks=2, global_batch=48, micro_batch=48), 1, 1, 1,
         "test: actor.global_batch_size: the rollout batch of 128 samples"),  # 16 envs x 2 epochs x 4 chunk steps
    ],
    ids=["env_ranks_x_stages", "group_size", "env_vs_rollout_ranks", "split_over_actor_ranks", "micro_x_ranks",
         "rollout_batch", "rollout_batch_counts_chunk_steps"],
)
def test_batch_arithmetic_names_the_rule_and_its_numbers(cfg, env_ranks, rollout_ranks, actor_ranks, message):
    with pytest.raises(ConfigError) as error:
        check_batch_arithmetic(cfg, env_ranks, rollout_ranks, actor_ranks, "test")
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)


def test_batch_arithmetic_checks_the_eval_split_too():
    cfg = small_cfg()
    cfg.env.eval.total_num_envs = 6
    with pytest.raises(ConfigError, match=r"^test: env\.eval\.total_num_envs: 6 is not divisible .* = 4 x 1 x 1 = 4$"):
        check_batch_arithmetic(cfg, 4, 4, 1, "test")


def test_help_names_config_and_explain(capsys):
    with pytest.raises(SystemExit):
        load_config(["--help"])
    text = capsys.readouterr().out
    assert "--config FILE" in text and "--explain" in text
