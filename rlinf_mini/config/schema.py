"""The run's schema: one tyro dataclass per section of RLinf's YAML, in its order (cluster, runner, algorithm,
env, rollout, actor, data, reward); the env section is in schema_embodied.py, data and reward in
schema_reasoning.py."""

# (No `from __future__ import annotations` here: tyro reads these annotations at every parse with flags, and string
# annotations would be compiled again at each one; docs/performance.md has the cost.)

from dataclasses import dataclass, field
from typing import Literal

from rlinf_mini.config.schema_embodied import EnvConfig
from rlinf_mini.config.schema_reasoning import DataConfig, ReasoningSamplingParams, RewardConfig

PRECISIONS = ("32", "bf16")  # actor.model.precision, rollout.model.precision (RLinf spells them the same)


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the file and the key path."""


@dataclass
class ClusterConfig:
    num_nodes: int = 1
    """Number of machines; more than 1 needs backend 'ray' (num_devices is then the total over the nodes)."""
    num_devices: int = -1
    """rlinf_mini: the devices component_placement numbers from 0; -1 = every visible GPU (else 2 CPU shares)."""
    backend: Literal["local", "inline", "ray"] = "local"
    """rlinf_mini: 'local' (a process per rank), 'inline' (threads, for breakpoint()) or 'ray' (RLinf's)."""
    ray_address: str = ""
    """rlinf_mini, backend 'ray': '' = ray.init's own rule (RAY_ADDRESS, a local head, else private)."""
    component_placement: dict[str, str] = field(default_factory=lambda: {"env,rollout,actor": "all"})
    """Component(s) -> devices in RLinf's grammar: '0-3', '0,2', 'all', 'devices:processes'."""
    timeout_s: float = 120.0
    """rlinf_mini: the longest any blocking wait (a group call, a channel get) may take before it is an error."""
    channel_wait: Literal["spin", "block"] = "spin"
    """rlinf_mini, backend 'local': how a channel get (or a put on a full key) waits. 'spin': it retries for a moment
    before it sleeps in poll(), so a message made on another core mostly arrives without a wake-up
    (rlinf_mini/scheduler/spin_wait.py); 'block': it sleeps in poll() at once, the plain path. Same messages."""
    rank_start: Literal["forkserver", "spawn"] = "forkserver"
    """rlinf_mini, backend 'local': how a rank's process starts. 'forkserver': forked from a server that imported torch
    and the run's modules once (rlinf_mini/scheduler/forkserver.py); 'spawn': a fresh interpreter per rank that
    imports everything itself, the plain path (slower to start). Same results."""
    all_reduce: Literal["shm", "gloo"] = "shm"
    """rlinf_mini, backend 'local', CPU ranks: how the actor's ranks sum gradients. 'shm': through a shared-memory
    segment (rlinf_mini/scheduler/shm_all_reduce.py; x86-64, elsewhere gloo); 'gloo': torch.distributed's gloo over
    loopback, the plain path. With 2 ranks the same sums."""
    threads_per_device: int = 1
    """rlinf_mini: torch's threads per device a rank holds (a number, not the core count: same bits)."""


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
    """'embodied' (env + rollout + actor) or 'reasoning' (prompts + rollout + reward + actor)."""
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
    """rlinf_mini: a tqdm progress bar when stderr is a terminal (else the one-line summaries only)."""
    log_interval: int = 1
    """rlinf_mini: print a one-line summary every N steps."""
    seq_length: int = 32
    """Reasoning: prompt + response tokens at most."""
    val_pass_k: int = 0
    """Reasoning: also log eval/pass@<k> (Chen et al.'s unbiased estimator); 0 = off."""
    val_num_samples: int = -1
    """Reasoning: n, samples per held-out prompt for eval/pass@k (veRL's val_kwargs.n); -1 = val_pass_k."""
    trace: bool = True
    """rlinf_mini: record every worker's timeline (trace.json, timeline.png, time/trace/* metrics)."""

    @property
    def num_steps(self) -> int:
        return self.max_epochs if self.max_steps < 0 else min(self.max_epochs, self.max_steps)


@dataclass
class AlgorithmConfig:
    adv_type: Literal["gae", "grpo", "reinpp"] = "gae"
    """Advantages: 'gae' (critic-free without a value head), 'grpo' or 'reinpp' (Reinforce++)."""
    loss_type: Literal["actor_critic", "actor", "decoupled_actor_critic"] = "actor_critic"
    """'actor_critic' (PPO + value loss), 'actor' (policy loss only), 'decoupled_actor_critic' (async)."""
    gamma: float = 1.0
    """Discount factor of GAE (RLinf's default 1; Reinforce++ and GRPO never discount, as in RLinf)."""
    gae_lambda: float = 1.0
    """GAE lambda (RLinf's default 1)."""
    group_size: int = 1
    """GRPO / Reinforce++ group size (= env.train.group_size; RLinf falls back to 8, here 1)."""
    bootstrap_type: Literal["standard", "always"] = "standard"
    """GAE + auto_reset: add gamma * V(final obs) at truncations ('standard') or every end ('always')."""
    normalize_advantages: bool = True
    """GAE: whiten advantages (safe_normalize; statistics over all actor ranks, RLinf: per rank)."""
    normalize_returns: bool = False
    """GAE: whiten the value targets; only false is accepted (RLinf 0.3.0 never does)."""
    use_reinpp_baseline: bool = False
    """Reinforce++: subtract the group mean of the first-episode scores (RLinf 0.3.0 fails on it)."""
    kl_beta: float = 0.0
    """Weight of the KL penalty to the reference policy (the initial weights); 0 = no reference model."""
    kl_penalty_type: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "low_var_kl"
    """How the per-sample KL is estimated (RLinf's kl_penalty): kl/k1, abs, mse/k2, low_var_kl/k3."""
    reinpp_kl_beta: float = 0.0
    """Reinforce++: subtract reinpp_kl_beta * KL(rollout, reference) from every step's reward."""
    update_epoch: int = 1
    """Passes over the rollout batch per training step (RLinf's default 1)."""
    clip_ratio_low: float = 0.2
    """PPO: ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO: ratio is clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float | None = 3.0
    """Dual clip (> 1) of negative advantages; null = none (RLinf's embodied actor: GR00T only)."""
    value_clip: float = 0.2
    """Clipped value loss: how far values may move from the rollout's (<= 0: no clip)."""
    huber_delta: float = 10.0
    """Value loss: Huber with this delta (RLinf has no default; its embodied PPO examples set 10)."""
    value_loss_coef: float = 1.0
    """rlinf_mini: weight of the value loss in the total loss (1 = RLinf's actor_loss + critic_loss)."""
    entropy_bonus: float = 0.0
    """Weight of the entropy term subtracted from the loss."""
    # --- asynchronous PPO (loss_type: decoupled_actor_critic; docs/async_ppo.md) ------------------------------------
    staleness_threshold: int | None = None
    """Async PPO: weight versions a sample may lag the actor; null (RLinf's default) = no bound."""
    behave_weight_threshold: float | None = None
    """Async PPO: samples whose pi_prox / pi_behav exceeds this leave the loss; null = none."""
    rollout_store_size_per_rank: int = 1
    """Async PPO: an actor rank trains once its store holds this many trajectories."""
    on_policy_min_ratio: float = 0.0
    """Async PPO: train only when this share of stored samples has the current version."""
    # --- reasoning (runner.task_type: reasoning) -------------------------------------------------------------------
    sampling_params: ReasoningSamplingParams = field(default_factory=ReasoningSamplingParams)
    """Reasoning: how the rollout samples responses."""
    rollout_batch_size_per_gpu: int = 4
    """Reasoning: prompts per generate call (chunks go round-robin to the rollout ranks)."""
    recompute_logprobs: bool = True
    """Reasoning: the actor recomputes the old log-probs itself (else it trusts the rollout's)."""
    loss_agg_func: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """Reasoning: token losses -> one number: over all tokens, or per response then over responses."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Reasoning (TRL's name): divide GRPO advantages by the group's std, the batch's, or 'none'."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Reasoning (TRL's name): the PPO ratio per 'token' (GRPO) or per 'sequence' (GSPO)."""
    len_reward_penalty: float = 0.0
    """Reasoning, DAPO's overlong penalty (RLinf's key): its weight past safe_length; 0 = off."""
    safe_length: int = 16384
    """Reasoning, DAPO: responses up to this many tokens get no length penalty (RLinf's dapo.rst value)."""
    max_length: int = 20480
    """Reasoning, DAPO: the length penalty is full from here on (must exceed safe_length)."""
    max_resample: int = 0
    """Reasoning, DAPO's dynamic sampling (RLinf's key): rounds of refilling all-equal groups; 0 = off."""
    mask_truncated_completions: bool = False
    """Reasoning (TRL's name): responses cut at max_new_tokens get no loss."""


@dataclass
class RolloutModelConfig:
    model_path: str = ""
    """Model folder the rollout starts from ('' = the actor's initial weights, sent by the first sync)."""
    precision: str = "32"
    """Inference precision: '32' or 'bf16' (GPU only; a CPU run keeps fp32 and says so)."""


@dataclass
class SamplingParams:
    temperature_train: float = 1.0
    """tiny_vla: sampling temperature of training rollouts (evaluation takes the argmax)."""


@dataclass
class RolloutConfig:
    group_name: str = "RolloutGroup"
    """Worker group name."""
    pipeline_stage_num: int = 1
    """Split each env rank's envs into this many stages: the env steps stage k while the rollout infers stage k+1."""
    policy_latency_s: float = 0.0
    """rlinf_mini: sleep this long per inference call, to emulate a GPU policy or a server."""
    fast_generation: bool = True
    """rlinf_mini, reasoning: decode with rlinf_mini/models/fast_generation.py (one prefill per distinct prompt, the
    KV cache in place, finished rows leave the batch, SmolLM2's lean forward); false: the plain loop of
    stages/reasoning_rollout.py over HF's forward. The same tokens and log-probs (oracle-tested)."""
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    """The rollout's copy of the policy."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """How the rollout samples action tokens (tiny_vla)."""
    recompute_logprobs: bool = False
    """Async PPO: the actor recomputes the proximal log-probs and values (false, RLinf's: interpolated)."""


@dataclass
class ModelConfig:
    model_type: Literal["mlp_policy", "tiny_vla", "tiny_lm", "smollm2"] = "mlp_policy"
    """'mlp_policy' (state vectors), 'tiny_vla' (images + instruction); reasoning: 'tiny_lm', 'smollm2'."""
    model_path: str = ""
    """A saved model folder (config.json + model.safetensors) to start from; '' = a fresh model."""
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
    normalize_obs: bool = False
    """rlinf_mini, mlp_policy: normalise inputs by their running mean and variance."""
    obs_norm_min_std: float = 0.0
    """rlinf_mini, mlp_policy with normalize_obs: divide by max(std, this); 0 = no floor (SB3's)."""
    init_logstd: float = -0.5
    """mlp_policy, Box actions: the Gaussian head's initial log std (RLinf's -0.5; SB3's and CleanRL's 0)."""
    precision: str = "32"
    """Parameter precision: '32' or 'bf16' (GPU autocast, fp32 master weights; CPU keeps fp32)."""


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
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    """RLinf's: 'constant' after the warmup, or 'cosine' from lr to min_lr over total_training_steps."""
    lr_warmup_steps: int = -1
    """Optimizer steps of linear warmup from 0; -1: lr_warmup_steps_ratio x total_training_steps (RLinf's)."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup as a share of total_training_steps when lr_warmup_steps is -1."""
    total_training_steps: int = 0
    """Optimizer steps the cosine spans (> 0 for 'cosine')."""
    min_lr: float = 0.0
    """The cosine's floor for lr (ignored when min_lr_rate is set); value_lr's floor is scaled alike."""
    min_lr_rate: float | None = None
    """The cosine's floor as a share of lr (None: min_lr decides)."""
    num_cycles: float = 0.5
    """Cosine cycles over the decay (0.5: one half-wave, lr to the floor at the end)."""


@dataclass
class ActorConfig:
    group_name: str = "ActorGroup"
    """Worker group name."""
    global_batch_size: int = 256
    """Samples (chunk steps) per optimizer step, summed over actor ranks."""
    micro_batch_size: int = 128
    """Samples per forward/backward on one rank; gradients accumulate up to global_batch_size."""
    seed: int = 1234
    """Seed of the model's initialization and the minibatch shuffle."""
    skip_nonfinite: bool = False
    """rlinf_mini: on a NaN/inf loss or gradient, skip that optimizer step (and log it) instead of stopping the run."""
    sync_weight_no_wait: bool = False
    """Async PPO: queue the next batches without waiting for the weight sync."""
    train_latency_s: float = 0.0
    """rlinf_mini: sleep this long in every update, to emulate a GPU update."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""


@dataclass
class ProfileDataConfig:
    """RLinf's `profile_data`: measured costs that `python -m rlinf_mini.autotune` uses instead of profiling (given
    the env's, the rollout's and the actor's, it measures nothing). Training ignores this section."""

    env_profile_data: dict[str, float] = field(default_factory=dict)
    """Sub-envs per env rank -> seconds of one chunk step of them (RLinf's key; RLinf's unit is a rollout epoch)."""
    rollout_profile_data: dict[str, float] = field(default_factory=dict)
    """Batch (sub-envs per call) -> seconds of one inference (RLinf's key); reasoning: responses per chunk."""
    actor_cost: float = 0.0
    """RLinf's: seconds of the actor's update of one step's batch, actor on all devices; 0 = not given."""
    actor_profile_data: dict[str, float] = field(default_factory=dict)
    """rlinf_mini: samples (reasoning: responses) per actor rank -> seconds of one update; wins over actor_cost."""
    hop_s: float = -1.0
    """rlinf_mini: seconds one channel message adds to a chunk step; -1 = calibrate with a short run."""
    fixed_s: float = -1.0
    """rlinf_mini: seconds a step spends outside rollout and update (sync, advantages, dispatch); -1 as hop_s."""
    rollout_cost: float = 0.0
    """RLinf's reasoning key: seconds of a step's generation with the rollout on all devices; 0 = not given. The
    reasoning autotune reads it as one chunk's cost x chunks / devices (autotune/reasoning.py)."""
    inference_cost: float = 0.0
    """RLinf's reasoning key: seconds of a step's log-prob recompute on all devices; the actor does the recompute
    here, so the reasoning autotune adds it to actor_cost."""


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
    profile_data: ProfileDataConfig = field(default_factory=ProfileDataConfig)
    """Measured costs for `python -m rlinf_mini.autotune` (RLinf's section); training ignores it."""
