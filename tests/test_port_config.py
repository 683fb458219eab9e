"""Reading RLinf's YAML as RLinf does, and porting it: Hydra `defaults:` lists relative to the file, `${a.b}` and
`${..b}` interpolations, `key=value` overrides, every unknown key in one line, and `python -m rlinf_mini.port_config`
writing a YAML that trains. The RLinf-shaped files below are written here, modelled on RLinf 0.3.0's
`examples/embodiment/config/maniskill_ppo_mlp.yaml` (a defaults list into env/, model/, training_backend/ folders).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from rlinf_mini.config import ConfigError, load_config, read_yaml_tree
from rlinf_mini.port_config import Port, key_table, main
from rlinf_mini.train import RunPlan, build_and_run

PRIMARY = """\
defaults:
  - env/sim_pick@env.train
  - env/sim_pick@env.eval
  - model/mlp_policy@actor.model
  - training_backend/fsdp@actor.fsdp_config
  - override hydra/job_logging: stdout

hydra:
  searchpath:
    - file://${oc.env:EMBODIED_PATH}/config/

cluster:
  num_nodes: 1
  component_placement:
    env,rollout,actor: 0-1

runner:
  task_type: embodied
  logger:
    log_path: LOG
    project_name: rlinf
    experiment_name: ported
    logger_backends: ["tensorboard", "wandb"]
  max_epochs: 1
  only_eval: False
  val_check_interval: 1
  save_interval: -1
  resume_dir: null
  ckpt_path: null

algorithm:
  update_epoch: 2
  normalize_advantages: True
  kl_penalty: kl
  group_size: 1
  reward_type: action_level
  adv_type: gae
  loss_type: actor_critic
  loss_agg_func: "token-mean"
  kl_beta: 0.0
  entropy_bonus: 0
  clip_ratio_high: 0.2
  clip_ratio_low: 0.2
  clip_ratio_c: null
  value_clip: 1.0
  huber_delta: 10.0
  gamma: 0.8
  gae_lambda: 0.9

env:
  group_name: "EnvGroup"
  train:
    total_num_envs: 16
    auto_reset: True
  eval:
    total_num_envs: 8
    auto_reset: True
    video_cfg:
      save_video: True
      video_base_dir: ${runner.logger.log_path}/video/eval

rollout:
  group_name: "RolloutGroup"
  backend: "huggingface"
  pipeline_stage_num: 1
  model:
    model_path: ""
    precision: ${actor.model.precision}

actor:
  group_name: "ActorGroup"
  training_backend: "fsdp"
  micro_batch_size: 64
  global_batch_size: 128
  seed: 1234
  model:
    model_type: "mlp_policy"
  optim:
    lr: 3.0e-4
    value_lr: 3.0e-4
    clip_grad: 0.5
  fsdp_config:
    mixed_precision:
      param_dtype: ${actor.model.precision}

reward:
  use_reward_model: False
"""

SIM_PICK = """\
env_type: maniskill
total_num_envs: null
auto_reset: False
ignore_terminations: False
seed: 0
group_size: 1
use_fixed_reset_state_ids: False
max_steps_per_rollout_epoch: 8
max_episode_steps: 8
video_cfg:
  save_video: False
  video_base_dir: ${runner.logger.log_path}/video/train
init_params:
  id: "PickCube-v1"
  obs_mode: "state"
  sim_config:
    sim_freq: 100
  max_episode_steps: ${..max_episode_steps}
"""

MLP_POLICY = """\
model_type: "mlp_policy"
model_path: ""
policy_setup: "panda-qpos"
obs_dim: 42
action_dim: 8
num_action_chunks: 1
hidden_dim: 32
precision: "32"
add_value_head: True
is_lora: False
"""


def write_rlinf_tree(tmp_path: Path, primary: str = PRIMARY) -> Path:
    root = tmp_path / "config"
    for rel, text in {"main.yaml": primary.replace("LOG", str(tmp_path / "results")), "env/sim_pick.yaml": SIM_PICK,
                      "model/mlp_policy.yaml": MLP_POLICY,
                      "training_backend/fsdp.yaml": "strategy: fsdp\nmixed_precision:\n  param_dtype: null\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "main.yaml"


# --------------------------------------------------------------------------------------------------------------------
# Reading: defaults lists, interpolation, overrides


def test_defaults_list_is_read_relative_to_the_file_and_placed_at_its_package(tmp_path):
    tree = read_yaml_tree(write_rlinf_tree(tmp_path))
    assert tree["env"]["train"]["env_type"] == "maniskill"  # from env/sim_pick.yaml, placed at env.train
    assert tree["env"]["train"]["total_num_envs"] == 16  # the primary file's own keys win (Hydra: _self_ last)
    assert tree["env"]["eval"]["auto_reset"] is True and tree["env"]["train"]["max_steps_per_rollout_epoch"] == 8
    assert tree["actor"]["model"]["obs_dim"] == 42 and tree["actor"]["fsdp_config"]["strategy"] == "fsdp"
    assert "defaults" not in tree


def test_self_first_lets_the_defaults_win(tmp_path):
    primary = PRIMARY.replace("defaults:\n", "defaults:\n  - _self_\n")
    tree = read_yaml_tree(write_rlinf_tree(tmp_path, primary))
    assert tree["env"]["train"]["total_num_envs"] is None  # env/sim_pick.yaml's null, merged after the file's 16


def test_interpolations_absolute_relative_embedded_and_typed(tmp_path):
    tree = read_yaml_tree(write_rlinf_tree(tmp_path))
    log = str(tmp_path / "results")
    assert tree["env"]["eval"]["video_cfg"]["video_base_dir"] == f"{log}/video/eval"  # inside text: text
    assert tree["env"]["train"]["init_params"]["max_episode_steps"] == 8  # ${..max_episode_steps}: keeps the int
    assert tree["rollout"]["model"]["precision"] == "32"  # ${actor.model.precision}, from model/mlp_policy.yaml
    assert tree["hydra"]["searchpath"] == ["file://${oc.env:EMBODIED_PATH}/config/"]  # a resolver stays as written


def test_interpolation_to_a_missing_key_names_both(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("runner:\n  logger:\n    experiment_name: ${runner.nope}\n")
    message = r"runner\.logger\.experiment_name: \$\{runner\.nope\} points to runner\.nope"
    with pytest.raises(ConfigError, match=message):
        read_yaml_tree(file)


def test_interpolation_falls_back_to_the_dataclass_defaults(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("runner:\n  logger:\n    experiment_name: run_${actor.seed}\n")
    assert load_config(["--config", str(file)]).runner.logger.experiment_name == "run_1234"


def test_key_value_overrides_sit_between_the_file_and_dashed_flags(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("actor:\n  seed: 1\nrunner:\n  logger:\n    experiment_name: s${actor.seed}\n")
    cfg = load_config(["--config", str(file), "actor.seed=7", "algorithm.clip_ratio_c=null",
                       "env.train.init_params.id=FakeReach-v0", "--actor.seed", "9"])
    assert cfg.actor.seed == 9  # --key value wins over key=value
    assert cfg.runner.logger.experiment_name == "s7"  # the interpolation sees the override, as in Hydra
    assert cfg.algorithm.clip_ratio_c is None
    assert load_config(["actor.optim.value-lr=0.5"]).actor.optim.value_lr == 0.5  # no file; dashes read as _


def test_every_unknown_key_of_a_file_in_one_line_with_right_or_absent_hints(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text(textwrap.dedent("""\
        algorithm:
          update_epochs: 2
          kl_penalty: kl
        rollout:
          sampling_params:
            temperature_train: 1.0
            temperature_eval: 0.6
        actor:
          fsdp_config: {strategy: fsdp}
        """))
    with pytest.raises(ConfigError) as err:
        load_config(["--config", str(file)])
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{file}: 4 unknown keys: ")
    assert "algorithm.update_epochs (did you mean 'algorithm.update_epoch'?)" in line
    for key in ("algorithm.kl_penalty", "rollout.sampling_params.temperature_eval", "actor.fsdp_config"):
        assert f"{key}," in line or f"{key};" in line  # named, with no hint: none would be right
    assert "temperature_train'?" not in line and "port_config" in line


@pytest.mark.parametrize("placement", ["all", "ALL", "All"])
def test_all_is_read_in_any_case(tmp_path, placement):
    file = tmp_path / "c.yaml"
    file.write_text(f"cluster:\n  component_placement:\n    env,rollout,actor: {placement}\n")
    assert load_config(["--config", str(file)]).cluster.component_placement == {"env,rollout,actor": "all"}


def test_gymnasium_constructor_arguments_in_init_params_reach_the_env(tmp_path):
    from rlinf_mini.envs.gym_adapter import _make_one

    file = tmp_path / "c.yaml"
    file.write_text("env:\n  train:\n    env_type: gymnasium\n    init_params: {id: Pendulum-v1, g: 3.5}\n"
                    "  eval:\n    env_type: gymnasium\n    init_params: {id: Pendulum-v1, g: 3.5}\n")
    cfg = load_config(["--config", str(file)])
    assert cfg.env.train.init_params.make_kwargs == {"g": 3.5}
    assert _make_one(cfg.env.train, "env.train").unwrapped.g == 3.5
    file.write_text("env:\n  train:\n    init_params: {id: FakeReach-v0, g: 3.5}\n")  # the fake env takes none
    with pytest.raises(ConfigError, match=r"env\.train\.init_params\.g: unknown key"):
        load_config(["--config", str(file)])


# --------------------------------------------------------------------------------------------------------------------
# Porting


def test_port_reports_every_key_once_and_replaces_the_missing_simulator(tmp_path):
    port = Port(write_rlinf_tree(tmp_path))
    carried = {p for p, _ in port.carried}
    replaced = {p for p, *_ in port.replaced}
    ignored = {p for p, _ in port.ignored}
    assert not (carried & ignored) and not (carried & replaced - {"cluster.num_devices"})
    assert {"algorithm.update_epoch", "algorithm.huber_delta", "algorithm.gamma", "actor.optim.lr"} <= carried
    assert {"env.train.env_type", "env.train.init_params.id", "actor.model.obs_dim", "runner.logger.logger_backends",
            "env.eval.auto_reset", "env.eval.video_cfg.save_video", "cluster.num_devices"} <= replaced
    assert {"hydra.searchpath", "actor.fsdp_config.strategy", "algorithm.kl_penalty", "runner.logger.project_name",
            "runner.only_eval", "rollout.backend", "reward.use_reward_model"} <= ignored  # reasoning-only here
    assert "env.train.init_params.sim_config.sim_freq" in ignored and port.dropped == []
    cfg = port.config()
    assert cfg.env.train.env_type == "fake" and cfg.env.train.init_params.id == "FakeReach-v0"
    assert cfg.algorithm.update_epoch == 2 and cfg.algorithm.clip_ratio_c is None and cfg.cluster.num_devices == 2


def test_port_command_writes_a_yaml_that_trains(tmp_path, capsys):
    out = tmp_path / "ported.yaml"
    assert main([str(write_rlinf_tree(tmp_path)), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    for section in ("carried over", "replaced:", "ignored on purpose:", "no counterpart"):
        assert section in report
    assert "'maniskill' -> 'fake'" in report and f"wrote {out}" in report
    assert yaml.safe_load(out.read_text())["algorithm"]["huber_delta"] == 10.0
    cfg = load_config(["--config", str(out), "runner.max_epochs=1"])
    history = build_and_run(cfg, RunPlan(cfg, str(out)))
    assert [h["step"] for h in history if "train/actor/policy_loss" in h] == [1]


def test_port_refuses_an_algorithm_rlinf_mini_does_not_have(tmp_path, capsys):
    primary = PRIMARY.replace("adv_type: gae", "adv_type: embodied_sac")
    assert main([str(write_rlinf_tree(tmp_path, primary)), "--no-write"]) == 2
    assert "algorithm.adv_type 'embodied_sac'" in capsys.readouterr().err


def test_port_of_an_async_ppo_config_keeps_the_async_runner_and_bounds_it(tmp_path):
    """RLinf's maniskill_async_ppo_mlp.yaml sets loss_type decoupled_actor_critic and no staleness_threshold (null):
    the port keeps the loss (the async runner) and sets the bound to 1, saying why; the result passes every check."""
    port = Port(write_rlinf_tree(tmp_path, PRIMARY.replace("loss_type: actor_critic",
                                                           "loss_type: decoupled_actor_critic")))
    replaced = {p: (old, new) for p, old, new, _ in port.replaced}
    assert replaced["algorithm.staleness_threshold"] == (None, 1)
    cfg = port.config()
    assert cfg.algorithm.loss_type == "decoupled_actor_critic" and cfg.algorithm.staleness_threshold == 1


def test_key_table_lists_each_key_with_a_verdict(tmp_path):
    table = key_table(write_rlinf_tree(tmp_path).parent)
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert "| `algorithm.huber_delta` | 1 | carried" in table
    assert "| `env.*.env_type` | 1 | carried when rlinf_mini has it; else replaced" in table
    assert "| `hydra.searchpath` | 1 | ignored: Hydra" in table
    assert all(ln.count("|") == 4 for ln in rows) and len(rows) > 40


# --------------------------------------------------------------------------------------------------------------------
# RLinf's MetaWorld config: modelled on examples/embodiment/config/metaworld_50_ppo_openpi.yaml and its
# env/metaworld_50.yaml (pi0 on MetaWorld's 50 tasks, camera frames, chunks of 5 actions)

MW_PRIMARY = """\
defaults:
  - env/metaworld_50@env.train
  - env/metaworld_50@env.eval
  - model/pi0@actor.model
  - override hydra/job_logging: stdout

cluster:
  num_nodes: 1
  component_placement:
    actor,env,rollout: all

runner:
  task_type: embodied
  logger:
    log_path: LOG
    experiment_name: "metaworld_50_ppo_openpi"
    logger_backends: ["tensorboard"]
  max_epochs: 1000
  val_check_interval: -1
  save_interval: 50

algorithm:
  normalize_advantages: True
  reward_type: chunk_level
  update_epoch: 4
  adv_type: gae
  loss_type: actor_critic
  clip_ratio_c: 3.0
  value_clip: 0.2
  huber_delta: 10.0
  gamma: 0.99
  gae_lambda: 0.95

env:
  group_name: "EnvGroup"
  train:
    rollout_epoch: 8
    total_num_envs: 64
  eval:
    total_num_envs: 500
    auto_reset: True
    ignore_terminations: True
    use_fixed_reset_state_ids: True

rollout:
  group_name: "RolloutGroup"
  pipeline_stage_num: 1
  model:
    model_path: "/path/to/model/RLinf-Pi0-MetaWorld-SFT"
    precision: ${actor.model.precision}

actor:
  group_name: "ActorGroup"
  micro_batch_size: 128
  global_batch_size: 2048
  seed: 42
  model:
    model_path: "/path/to/model/RLinf-Pi0-MetaWorld-SFT"
    num_action_chunks: 5
    action_dim: 4
    add_value_head: True
  optim:
    lr: 1.0e-5
    value_lr: 1.0e-4
"""

METAWORLD_50 = """\
env_type: metaworld
task_suite_name: metaworld_50
auto_reset: False
ignore_terminations: False
max_steps_per_rollout_epoch: 100
max_episode_steps: 100
use_rel_reward: True
reward_coef: 1.0
seed: 0
group_size: 1
use_fixed_reset_state_ids: False
video_cfg:
  save_video: False
init_params:
  camera_heights: 480
  camera_widths: 480
"""

PI0 = """\
model_type: "openpi"
model_path: ""
precision: null
num_action_chunks: 5
action_dim: 4
add_value_head: True
openpi:
  config_name: "pi0_metaworld"
"""


def test_port_of_rlinfs_metaworld_config_keeps_the_simulator_and_trains_the_tiny_vla(tmp_path, capsys):
    pytest.importorskip("metaworld", reason="metaworld not installed (pip install -e '.[metaworld]')")
    root = tmp_path / "config"
    for rel, text in {"main.yaml": MW_PRIMARY.replace("LOG", str(tmp_path / "results")),
                      "env/metaworld_50.yaml": METAWORLD_50, "model/pi0.yaml": PI0}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    out = tmp_path / "ported.yaml"
    assert main([str(root / "main.yaml"), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    model_lines = [ln for ln in report.splitlines() if "'openpi' -> 'tiny_vla'" in ln]
    assert len(model_lines) == 1 and "stands in" in model_lines[0]  # the model's replacement, said in one line
    assert "-> 'fake'" not in report  # MetaWorld is installed: the simulator is kept
    cfg = load_config(["--config", str(out)])
    for split in (cfg.env.train, cfg.env.eval):
        assert split.env_type == "metaworld" and split.task_suite_name == "metaworld_50"
        assert split.init_params.obs_mode == "rgb" and split.init_params.camera_heights == 40
    assert not cfg.env.eval.auto_reset and cfg.actor.model.num_action_chunks == 5
    # 2 training steps, shrunk by key=value only: 2 sub-envs x 10 env steps (2 chunks of 5) per epoch
    small = ["runner.max_epochs=2", "env.train.total_num_envs=2", "env.train.rollout_epoch=1",
             "env.train.max_steps_per_rollout_epoch=10", "env.eval.total_num_envs=2",
             "env.eval.max_steps_per_rollout_epoch=10", "actor.global_batch_size=4", "actor.micro_batch_size=2"]
    cfg = load_config(["--config", str(out), *small])
    history = build_and_run(cfg, RunPlan(cfg, str(out)))
    assert [h["step"] for h in history if "train/actor/policy_loss" in h] == [1, 2]
