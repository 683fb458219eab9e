"""A generated corpus of malformed configs and command lines (hundreds, built by walking the schema), run through
`rlinf_mini.train.main` in this process. Every case must give exit code 2, exactly one line on stderr that names the
key (or the file), nothing on stdout, and no worker process: starting a Cluster fails the test.

tests/test_config.py holds the hand-written cases (and the subprocess proof); this file adds breadth.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import types
import typing
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from test_config import leaf_paths

from rlinf_mini.config import TrainConfig
from rlinf_mini.train import main

BASE = yaml.safe_load((ROOT / "configs" / "embodied_mlp.yaml").read_text())
LEAVES = leaf_paths()  # 'actor.optim.lr' -> float


@dataclasses.dataclass
class Bad:
    name: str
    argv: list[str]  # after --config FILE; "{tmp}" is replaced by a scratch folder
    must_name: str  # the key path (or file) the message must contain
    yaml_text: str | None = None  # the config file's text; None: BASE with `sections` merged in
    sections: dict | None = None


def _nested(path: str, value) -> dict:
    out: dict = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _merge(into: dict, new: dict) -> dict:
    into = json.loads(json.dumps(into))
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict) and k != "component_placement":
            into[k] = _merge(into[k], v)
        else:
            into[k] = v
    return into


def _wrong_values(tp) -> list:
    """YAML values of the wrong type for a field annotated `tp`."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return ["no_such_choice", 3]
    if origin in (typing.Union, types.UnionType):  # X | None: what is wrong for X (None is right)
        return _wrong_values(next(a for a in typing.get_args(tp) if a is not type(None)))
    if origin is list:
        return ["tensorboard", {"a": 1}]
    if origin is dict:
        return ["0-1", [0, 1]] if typing.get_args(tp)[1] is str else [[0, 1], "0-1"]
    return {int: ["abc", 1.5, [1]], float: ["abc", [0.1], True], bool: ["yes", 1], str: [5, [1]]}[tp]


def corpus() -> list[Bad]:
    cases: list[Bad] = []
    # 1. unknown keys: a misspelling of every key and every section
    sections = {p.rpartition(".")[0] for p in LEAVES} - {""}
    for path in sorted(LEAVES) + sorted(sections):
        head, _, last = path.rpartition(".")
        wrong = f"{head}.{last}x" if head else f"{last}x"
        cases.append(Bad(f"unknown:{wrong}", [], wrong, sections=_nested(wrong, 1)))
    # 2. wrong types, in the file and on the command line
    for path, tp in sorted(LEAVES.items()):
        for i, value in enumerate(_wrong_values(tp)[:2 if tp is int else 1]):
            cases.append(Bad(f"type:{path}:{i}", [], path, sections=_nested(path, value)))
        if tp in (int, float):
            flag = "--" + path.replace("_", "-")
            cases.append(Bad(f"cli_type:{path}", [flag, "not_a_number"], flag))
        if tp is bool:
            flag = "--" + path.replace("_", "-")
            cases.append(Bad(f"cli_bool:{path}", [flag, "maybe"], "maybe"))  # a bool flag takes no value
    # 3. negative and zero sizes
    sizes = ["cluster.num_devices", "cluster.timeout_s", "runner.max_epochs", "runner.weight_sync_interval",
             "runner.log_interval", "algorithm.update_epoch", "rollout.pipeline_stage_num", "actor.global_batch_size",
             "actor.micro_batch_size", "actor.model.hidden_dim", "actor.model.num_action_chunks", "actor.optim.lr",
             "actor.optim.value_lr", "actor.optim.adam_eps", "algorithm.clip_ratio_c",
             "runner.max_steps", "runner.val_check_interval", "runner.save_interval", "actor.model.obs_dim",
             "actor.model.action_dim", "actor.optim.weight_decay", "rollout.policy_latency_s",
             "actor.train_latency_s"]
    for split in ("train", "eval"):
        sizes += [f"env.{split}.{k}" for k in ("total_num_envs", "max_steps_per_rollout_epoch", "max_episode_steps",
                                               "rollout_epoch", "step_latency_s", "group_size")]
        sizes += [f"env.{split}.init_params.{k}" for k in ("dim", "goal_radius")]
    for path in sizes:
        for value in (-7, 0) if path not in ("runner.max_steps", "runner.val_check_interval",
                                             "runner.save_interval") else (-2, -100):
            if value == 0 and path in ("actor.optim.weight_decay", "env.train.step_latency_s",
                                       "env.eval.step_latency_s", "rollout.policy_latency_s", "actor.train_latency_s",
                                       "actor.model.obs_dim",
                                       "actor.model.action_dim"):
                continue  # 0 is meaningful there
            if value == 0 and path == "runner.val_check_interval":
                continue
            cases.append(Bad(f"size:{path}={value}", [], path, sections=_nested(path, value)))
            if value != 0 and path.startswith(("actor", "runner")):  # the same check, reached from the command line
                cases.append(Bad(f"cli_size:{path}={value}", ["--" + path.replace("_", "-"), str(value)], path))
    for path, value in [("algorithm.gamma", 1.5), ("algorithm.gae_lambda", 2.0), ("actor.optim.adam_beta1", 1.0),
                        ("actor.optim.adam_beta2", -0.1), ("algorithm.clip_ratio_low", 1.5),
                        ("actor.optim.lr_warmup_steps", -2), ("actor.optim.lr_warmup_steps_ratio", 1.0),
                        ("actor.optim.min_lr", -1e-4), ("actor.optim.min_lr_rate", 1.5),
                        ("algorithm.staleness_threshold", -1), ("algorithm.behave_weight_threshold", 0.5),
                        ("algorithm.rollout_store_size_per_rank", 0), ("algorithm.on_policy_min_ratio", 1.5),
                        ("algorithm.on_policy_min_ratio", -0.1)]:
        cases.append(Bad(f"range:{path}={value}", [], path, sections=_nested(path, value)))
    cases.append(Bad("cosine_without_total", [], "actor.optim.total_training_steps",  # it decays over nothing
                     sections={"actor": {"optim": {"lr_scheduler": "cosine"}}}))
    # 4. placement strings and devices
    for i, bad in enumerate(["0-", "-1", "a", "3-1", ",", "0-1-2", "0:", ":0", "0-1:", "1.5", "0 1", "all-1",
                             "0:0-", "0-1:a", "0x1", "", "0-1:3-1", "#"]):
        placement = {"env": 0, "rollout": 1, "actor": bad}
        cases.append(Bad(f"placement:{i}", [], "cluster.component_placement.actor",
                         sections={"cluster": {"component_placement": placement}}))
    for i, dev in enumerate(["2", "0-2", "5", "100", "1,7", "0-99:0-1"]):
        placement = {"env": 0, "rollout": 1, "actor": dev}
        cases.append(Bad(f"device:{i}", [], "cluster.component_placement.actor",
                         sections={"cluster": {"component_placement": placement}}))
    for i, placement in enumerate([{"env": 0, "rollout": 1}, {"env": 0, "actor": 1}, {"rollout": 0, "actor": 1},
                                   {"env": 0, "rollout": 1, "actor": 0, "critic": 1},
                                   {"env,rollout,actor,reward": "all"}, {"env,env,rollout,actor": "all"}]):
        cases.append(Bad(f"components:{i}", [], "cluster.component_placement",
                         sections={"cluster": {"component_placement": placement}}))
    # 5. batch arithmetic that cannot work
    for i, (sections, key) in enumerate([
        ({"env": {"train": {"total_num_envs": 31}}}, "env.train.total_num_envs"),
        ({"env": {"eval": {"total_num_envs": 63}}}, "env.eval.total_num_envs"),
        ({"rollout": {"pipeline_stage_num": 3}}, "env.train.total_num_envs"),
        ({"actor": {"global_batch_size": 96, "micro_batch_size": 48}}, "actor.global_batch_size"),
        ({"actor": {"global_batch_size": 256, "micro_batch_size": 96}}, "actor.global_batch_size"),
        ({"actor": {"global_batch_size": 2048, "micro_batch_size": 128}}, "actor.global_batch_size"),
        ({"actor": {"model": {"num_action_chunks": 5}}}, "env.train.max_steps_per_rollout_epoch"),
        ({"env": {"train": {"max_steps_per_rollout_epoch": 30}}}, "actor.global_batch_size"),
        ({"algorithm": {"group_size": 3}, "env": {"train": {"group_size": 3}}}, "env.train.total_num_envs"),
        ({"cluster": {"component_placement": {"env": "0-1", "rollout": "0-1:0-2", "actor": "0-1"}}},
         "cluster.component_placement"),
    ]):
        cases.append(Bad(f"batch:{i}", [], key, sections=sections))
    # 6. envs and models
    for i, (split, params) in enumerate([("train", {"env_type": "fake", "init_params": {"id": "FakeReach-v9"}}),
                                         ("eval", {"env_type": "fake", "init_params": {"id": "CartPole-v1"}}),
                                         ("train", {"env_type": "gymnasium", "init_params": {"id": "NoSuchEnv-v0"}}),
                                         ("eval", {"env_type": "gymnasium", "init_params": {"id": "no_module:X-v0"}}),
                                         ("train", {"env_type": "gymnasium", "init_params": {"id": ""}}),
                                         ("train", {"env_type": "mujoco"})]):
        cases.append(Bad(f"env:{i}", [], f"env.{split}", sections={"env": {split: params}}))
    for key in ("actor.model.model_path", "rollout.model.model_path"):
        for i, path in enumerate(["{tmp}/missing", "{tmp}/empty", "{tmp}/bad_json", "{tmp}/wrong_dims",
                                  "{tmp}/file.txt"]):
            cases.append(Bad(f"model:{key}:{i}", [], key, sections=_nested(key, path)))
    cases.append(Bad("resume:missing", [], "runner.resume_dir", sections=_nested("runner.resume_dir", "{tmp}/none")))
    cases.append(Bad("resume:not_a_checkpoint", [], "runner.resume_dir",
                     sections=_nested("runner.resume_dir", "{tmp}/empty")))
    # 7. files: YAML syntax, not a mapping, missing, unreadable
    for i, text in enumerate(["actor: {global_batch_size: 1\n", "actor:\n  seed: 1\n micro_batch_size: 2\n",
                              "actor: [1, 2\n", "- a\n- b\n", "'unclosed\n", "actor:\n\tseed: 1\n",
                              "a: b: c\n", "actor: {seed: 1}}\n", "42\n", "actor: &x\n  seed: *y\n",
                              "key: value\n  bad: indent\n", "[]\n", "actor: !!python/object:os.system {}\n"]):
        cases.append(Bad(f"yaml:{i}", [], "{file}", yaml_text=text))
    for i, argv in enumerate([["--config", "{tmp}/none.yaml"], ["--config", "{tmp}"], ["--config"],
                              ["--config", "{tmp}/empty/../none.yaml"]]):
        cases.append(Bad(f"file:{i}", argv, "config file not found" if argv == ["--config"] else "{tmp}",
                         yaml_text=""))
    # 7b. YAML 1.1 traps, refused by name with the text as written; Hydra-style overrides of unknown keys
    for i, (text, name) in enumerate([("runner:\n  max_epochs: 3\n  max_epochs: 4\n", "runner.max_epochs: duplicate"),
                                      ("runner:\n  max_epochs: 1:30\n", "runner.max_epochs: 1:30"),
                                      ("runner:\n  max_epochs: 010\n", "runner.max_epochs: 010"),
                                      ("actor:\n  seed: 1\nactor:\n  seed: 2\n", "actor: duplicate")]):
        cases.append(Bad(f"yaml_trap:{i}", [], name, yaml_text=text))
    for i, (argv, name) in enumerate([(["actor.optim.lrr=1"], "actor.optim.lrr"),
                                      (["runner.max_epochs=1:30"], "runner.max_epochs: 1:30"),
                                      (["env.train.init_params.continuous=true"], "env.train.init_params.continuous")]):
        cases.append(Bad(f"override:{i}", argv, name))
    # 8. command-line mistakes
    for i, (argv, name) in enumerate([(["--actor.optim.lrr", "1"], "--actor.optim.lrr"),
                                      (["--actor"], "--actor"), (["positional"], "positional"),
                                      (["--runner.max-epochs"], "--runner.max-epochs"),
                                      (["--algorithm.adv-type", "ppo"], "--algorithm.adv-type"),
                                      (["--env.train.env-type", "isaac"], "--env.train.env-type"),
                                      (["--cluster.component-placement.critic", "0"],
                                       "--cluster.component-placement.critic"),
                                      (["--runner.logger.logger-backends", "wandb"], "runner.logger.logger_backends"),
                                      (["--runner.resume-dir", "{tmp}/nowhere"], "runner.resume_dir")]):
        cases.append(Bad(f"cli:{i}", argv, name))
    # 9. names the runtime relies on
    for i, (sections, key) in enumerate([
        ({"actor": {"group_name": "EnvGroup"}}, "actor.group_name"),
        ({"rollout": {"group_name": ""}}, "rollout.group_name"),
        ({"runner": {"logger": {"experiment_name": ""}}}, "runner.logger.experiment_name"),
        ({"runner": {"logger": {"experiment_name": "a/../../b"}}}, "runner.logger.experiment_name"),
        ({"actor": {"model": {"precision": "bf16"}}}, "actor.model.precision"),
        ({"rollout": {"model": {"precision": "fp8"}}}, "rollout.model.precision"),
        ({"cluster": {"num_nodes": 2}}, "cluster.num_nodes"),
        ({"actor": {"model": {"obs_dim": 5}}}, "actor.model.obs_dim"),
    ]):
        cases.append(Bad(f"names:{i}", [], key, sections=sections))
    return cases


CORPUS = corpus()


def _scratch(tmp: Path) -> None:
    """The folders the corpus points at: empty, malformed config.json, a model of the wrong size, a plain file."""
    from rlinf_mini.models import MLPPolicy

    (tmp / "empty").mkdir()
    (tmp / "bad_json").mkdir()
    (tmp / "bad_json" / "config.json").write_text("{not json")
    MLPPolicy(obs_dim=3, action_dim=1, discrete=False, num_action_chunks=1, hidden_dim=8,
              add_value_head=True).save_pretrained(str(tmp / "wrong_dims"))
    (tmp / "file.txt").write_text("x")


def _fill(value, tmp: Path):
    if isinstance(value, dict):
        return {k: _fill(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, tmp) for v in value]
    return value.replace("{tmp}", str(tmp)) if isinstance(value, str) else value


def test_corpus_of_malformed_input_each_gives_one_clear_line_and_starts_nothing(tmp_path, capsys, monkeypatch,
                                                                              in_users_checkout):
    import torch

    from rlinf_mini.scheduler import cluster as cluster_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    started = []

    def no_cluster(self, *args, **kwargs):
        started.append(1)
        raise AssertionError("a Cluster was started for bad input")

    monkeypatch.setattr(cluster_module.Cluster, "__init__", no_cluster)
    _scratch(tmp_path)
    assert len(CORPUS) >= 200, len(CORPUS)
    failures = []
    for i, case in enumerate(CORPUS):
        file = tmp_path / f"c{i}.yaml"
        log_path = tmp_path / f"results{i}"
        own_config = case.argv[:1] == ["--config"]  # the case names its file: the one written here goes unread
        # where a run would write: in the case's YAML where it is written here (so that only a case's own `--` flags
        # cost a tyro parse, ~30 ms each), else as a flag; a case's own log_path stays
        log_flag = ["--runner.logger.log-path", str(log_path)]
        text = case.yaml_text
        if text is None:
            sections = _fill(case.sections or {}, tmp_path)
            logger = sections.get("runner", {}).get("logger", {}) if isinstance(sections.get("runner", {}), dict) \
                else None
            if not own_config and isinstance(logger, dict) and "log_path" not in logger:
                sections, log_flag = _merge({"runner": {"logger": {"log_path": str(log_path)}}}, sections), []
            dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: ~7x faster
            text = yaml.dump(_merge(BASE, sections), Dumper=dumper)
        file.write_text(text)
        argv = _fill(case.argv, tmp_path) if own_config else ["--config", str(file), *_fill(case.argv, tmp_path)]
        try:
            code = main([*argv, *log_flag])
        except BaseException as e:  # noqa: BLE001 (a crash is a finding, recorded with the case)
            code = f"raised {type(e).__name__}: {str(e)[:200]}"
        out, err = capsys.readouterr()
        must = _fill(case.must_name, tmp_path).replace("{file}", str(file))
        alt = must.replace("_", "-")
        ok = (code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
              and (must in err or alt in err) and not log_path.exists())
        if not ok:
            failures.append(f"{case.name}: code={code} must name {must!r}; stderr={err.strip()[:300]!r}")
    print(f"\nbad-input corpus: {len(CORPUS)} tried, {len(CORPUS) - len(failures)} clear one-line errors, "
          f"{len(started)} clusters started, {len(multiprocessing.active_children())} processes")
    assert not failures, f"{len(failures)} of {len(CORPUS)} cases:\n" + "\n".join(failures)
    assert not started and multiprocessing.active_children() == []


def test_corpus_covers_every_key():
    named = {c.must_name.lstrip("-").replace("-", "_") for c in CORPUS}
    assert set(LEAVES) - named == set()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(TrainConfig)])
def test_every_section_has_unknown_key_cases(field):
    assert any(c.name.startswith(f"unknown:{field}") for c in CORPUS)
