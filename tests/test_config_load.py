"""The config loader on OmegaConf: RLinf's resolvers, interpolation, `defaults:` composition and `key=value` overrides
give what Hydra gives (Hydra's compose API is the oracle where it is installed), and every OmegaConf error is one
line naming the key. The strict reading (duplicate keys, YAML 1.1 traps) is tests/test_bad_input.py's.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
from conftest import ROOT

from rlinf_mini.config import RESOLVERS, ConfigError, load_config, max_new_tokens, read_yaml_tree
from rlinf_mini.train import main

# RLinf's reasoning configs (examples/reasoning/config/math/*.yaml) write the response budget this way
RLINF_MAX_NEW_TOKENS = "max_new_tokens: ${subtract:${runner.seq_length}, ${data.max_prompt_length}}"


def _math_yaml(tmp_path: Path, line: str = RLINF_MAX_NEW_TOKENS) -> Path:
    text = (ROOT / "configs" / "math.yaml").read_text()
    assert "    max_new_tokens: -1\n" in text
    file = tmp_path / "math_rlinf.yaml"
    file.write_text(text.replace("    max_new_tokens: -1\n", f"    {line}\n")
                    .replace("log_path: results", f"log_path: {tmp_path / 'results'}"))
    return file


def test_rlinf_subtract_gives_the_response_budget(tmp_path):
    file = _math_yaml(tmp_path)
    cfg = load_config(["--config", str(file)])
    budget = cfg.runner.seq_length - cfg.data.max_prompt_length  # 12 - 8 in configs/math.yaml
    assert cfg.algorithm.sampling_params.max_new_tokens == budget == 4
    assert max_new_tokens(load_config(["--config", str(ROOT / "configs" / "math.yaml")])) == budget  # -1: the same
    # a key=value override is set before interpolations resolve (as in Hydra), so the budget follows it
    cfg = load_config(["--config", str(file), "runner.seq_length=20", "data.max_prompt_length=6"])
    assert cfg.algorithm.sampling_params.max_new_tokens == 14


def test_the_resolvers_are_rlinfs_with_its_math(tmp_path):
    assert set(RESOLVERS) == {"multiply", "int_div", "subtract", "not", "torch.dtype"}  # rlinf/utils/omega_resolver
    file = tmp_path / "c.yaml"
    file.write_text("actor:\n  micro_batch_size: 8\n  global_batch_size: ${multiply:${actor.micro_batch_size}, 4}\n"
                    "  seed: ${int_div:${actor.global_batch_size}, 3}\n"
                    "runner:\n  max_epochs: ${subtract:10, ${runner.val_check_interval}}\n"
                    "  val_before_train: ${not:${runner.progress_bar}}\n"
                    "  logger:\n    experiment_name: run_${actor.seed}\n")
    tree = read_yaml_tree(file)
    assert tree["actor"]["global_batch_size"] == 8 * 4
    assert tree["actor"]["seed"] == 32 // 3  # floor division, an int
    assert tree["runner"]["max_epochs"] == 10 - 10  # runner.val_check_interval: not in the file, the default 10
    assert tree["runner"]["val_before_train"] is False  # not(runner.progress_bar's default true)
    assert tree["runner"]["logger"]["experiment_name"] == "run_10"  # inside text: text
    assert "progress_bar" not in tree["runner"]  # the defaults resolve interpolations; they add no keys


def test_torch_dtype_resolves_and_a_key_that_reads_it_is_a_wrong_type(tmp_path):
    import torch

    file = tmp_path / "c.yaml"
    file.write_text("rollout:\n  model:\n    precision: ${torch.dtype:bfloat16}\n")
    assert read_yaml_tree(file)["rollout"]["model"]["precision"] is torch.bfloat16
    with pytest.raises(ConfigError, match=r"rollout\.model\.precision: expected a string, got torch\.bfloat16"):
        load_config(["--config", str(file)])


def test_resolvers_do_not_import_torch_until_used(tmp_path):
    import subprocess

    file = _math_yaml(tmp_path)
    code = (f"import sys; from rlinf_mini.config import load_config; load_config(['--config', {str(file)!r}]); "
            f"print('torch' in sys.modules, 'omegaconf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("value, key, says", [
    ("${runner.nope}", "runner.logger.experiment_name", "points to runner.nope"),
    ("${nosuch:1}", "runner.logger.experiment_name", "no resolver nosuch"),
    ("${subtract:abc, 1}", "runner.logger.experiment_name", "TypeError"),
    ("${oc.env:RLINF_MINI_TEST_UNSET_VARIABLE}", "runner.logger.experiment_name", "RLINF_MINI_TEST_UNSET_VARIABLE"),
    ("${runner", "runner.logger.experiment_name", "not an interpolation OmegaConf can read"),
    ("${runner.logger}", "runner.logger.experiment_name", "cycle"),
])
def test_interpolation_errors_are_one_line_naming_the_key(tmp_path, capsys, value, key, says, monkeypatch):
    monkeypatch.delenv("RLINF_MINI_TEST_UNSET_VARIABLE", raising=False)
    file = tmp_path / "c.yaml"
    file.write_text(f"runner:\n  logger:\n    log_path: {tmp_path / 'results'}\n    experiment_name: '{value}'\n")
    assert main(["--config", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {file}: {key}: "), err
    assert says in err, err
    assert not (tmp_path / "results").exists()


def test_an_override_through_a_value_and_a_defaults_clash_name_the_key(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("defaults:\n  - part\n  - _self_\nrunner:\n  logger:\n    logger_backends: {a: 1}\n")
    (tmp_path / "part.yaml").write_text("runner:\n  logger:\n    logger_backends: [tensorboard]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: runner\.logger\.logger_backends: .*merge") as err:
        read_yaml_tree(file)
    assert "\n" not in str(err.value)


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "main.yaml"


# RLinf-shaped: packages from the defaults list, relative and absolute interpolations, RLinf's resolvers, and a
# section that one default sets to a scalar and the primary file to a mapping (Hydra merges in order: the mapping)
TREE = {
    "main.yaml": "defaults:\n  - env/sim@env.train\n  - env/sim@env.eval\n  - model/mlp@actor.model\n"
                 "  - clash/a\n  - clash/b\n  - _self_\n"
                 "runner:\n  seq_length: 40\n  max_epochs: ${multiply:${actor.micro_batch_size}, 3}\n"
                 "actor:\n  micro_batch_size: 4\n  global_batch_size: ${int_div:${runner.seq_length}, 3}\n"
                 "env:\n  eval:\n    total_num_envs: 4\n"
                 "rollout:\n  model:\n    precision: ${actor.model.precision}\n"
                 "  flag: ${not:${actor.model.add_value_head}}\n"
                 "data:\n  max_prompt_length: 16\n"
                 "algorithm:\n  sampling_params:\n"
                 "    max_new_tokens: ${subtract:${runner.seq_length}, ${data.max_prompt_length}}\n"
                 "clash:\n  x: {q: 2}\n",
    "env/sim.yaml": "total_num_envs: 8\nmax_episode_steps: 10\n"
                    "init_params:\n  max_episode_steps: ${..max_episode_steps}\n"
                    "video_cfg:\n  video_base_dir: ${runner.seq_length}/video\n",
    "model/mlp.yaml": "precision: bf16\nadd_value_head: true\n",
    "clash/a.yaml": "x: {p: 1}\n",
    "clash/b.yaml": "x: 5\n",
}


@pytest.mark.parametrize("overrides", [[], ["runner.seq_length=50", "actor.micro_batch_size=2"]])
@pytest.mark.parametrize("self_first", [False, True])
def test_composition_interpolation_and_overrides_match_hydra_compose(tmp_path, overrides, self_first):
    hydra = pytest.importorskip("hydra", reason="hydra-core (the oracle) is not installed")
    from omegaconf import OmegaConf

    files = dict(TREE)
    if self_first:
        files["main.yaml"] = files["main.yaml"].replace("  - _self_\n", "").replace("defaults:\n",
                                                                                       "defaults:\n  - _self_\n")
    main_yaml = _write_tree(tmp_path / "conf", files)
    ours = read_yaml_tree(main_yaml, [(k, int(v)) for k, v in (o.split("=") for o in overrides)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Hydra's note on version_base 1.1 (RLinf's)
        with hydra.initialize_config_dir(config_dir=str(main_yaml.parent), version_base="1.1"):
            theirs = OmegaConf.to_container(hydra.compose(config_name="main", overrides=overrides), resolve=True)
    assert ours == theirs
    assert ours["algorithm"]["sampling_params"]["max_new_tokens"] == ours["runner"]["seq_length"] - 16


def test_registering_rlinfs_resolvers_warns_on_neither_omegaconf_2_3_nor_2_4():
    # OmegaConf 2.4 deprecates register_new_resolver (a UserWarning in every run's console); 2.3 has only that name
    from rlinf_mini.config import yaml_tree

    yaml_tree._omegaconf.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        omegaconf = yaml_tree._omegaconf()
        assert omegaconf.create({"n": "${multiply:3,4}"}).n == 12
