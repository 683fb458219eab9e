"""The config's checks, before any worker starts: each section's values (embodied and reasoning) and the batch
arithmetic over the ranks, each failure one line naming the key (a ConfigError)."""

import importlib.util
import json
import math
from pathlib import Path

from rlinf_mini.config.schema import PRECISIONS, ConfigError, TrainConfig
from rlinf_mini.config.schema_embodied import EnvSplitConfig
from rlinf_mini.config.schema_reasoning import REWARD_FUNC_NAMES


def check_lr_schedule(cfg: TrainConfig, source: str) -> None:
    """actor.optim's schedule keys (both halves)."""
    o = cfg.actor.optim

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: actor.optim.{key}: {msg}")

    if o.lr_scheduler not in ("constant", "cosine"):
        fail("lr_scheduler", f"must be 'constant' or 'cosine', got {o.lr_scheduler!r}")
    if o.lr_scheduler == "cosine" and o.total_training_steps <= 0:
        fail("total_training_steps", f"'cosine' decays over it: must be positive, got {o.total_training_steps} "
                                     "(RLinf's examples: ${runner.max_epochs})")
    if o.lr_warmup_steps < -1:
        fail("lr_warmup_steps", f"must be >= 0 (or -1: lr_warmup_steps_ratio decides), got {o.lr_warmup_steps}")
    if not 0 <= o.lr_warmup_steps_ratio < 1:
        fail("lr_warmup_steps_ratio", f"must be in [0, 1), got {o.lr_warmup_steps_ratio}")
    if o.min_lr < 0:
        fail("min_lr", f"must be >= 0, got {o.min_lr}")
    if o.min_lr_rate is not None and not 0 <= o.min_lr_rate <= 1:
        fail("min_lr_rate", f"must be in [0, 1] (a share of lr), got {o.min_lr_rate}")


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
        "cluster.threads_per_device": cfg.cluster.threads_per_device,
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
    if cfg.actor.train_latency_s < 0:
        fail("actor.train_latency_s", f"must be >= 0, got {cfg.actor.train_latency_s}")
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
    check_lr_schedule(cfg, source)
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
    if cfg.algorithm.normalize_returns:
        fail("algorithm.normalize_returns", "RLinf reads this key nowhere and never whitens returns (its actor "
                                            "does not pass it); set it false")
    check_first_episode_mask(cfg, source)
    if cfg.algorithm.loss_type in ("actor_critic", "decoupled_actor_critic") and not cfg.actor.model.add_value_head:
        fail("algorithm.loss_type", f"{cfg.algorithm.loss_type!r} needs actor.model.add_value_head: true")
    check_async_ppo(cfg, source)
    if cfg.actor.model.normalize_obs and cfg.actor.model.model_type != "mlp_policy":
        fail("actor.model.normalize_obs", f"normalises state vectors: model_type 'mlp_policy' only, got "
                                          f"{cfg.actor.model.model_type!r}")
    if cfg.env.eval.normalize_reward:
        fail("env.eval.normalize_reward", "rewards are normalised for training only (env.train.normalize_reward); "
                                          "eval returns stay raw")
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


def check_first_episode_mask(cfg: TrainConfig, source: str) -> None:
    """Embodied runs whose loss mask RLinf 0.3.0 would not build: it masks the steps after each env's first done only
    when env.train.auto_reset and ignore_terminations are both off (rlinf/workers/actor/fsdp_actor_worker.py:1169).
    Without that mask its GRPO fails (rlinf/algorithms/advantages.py:119, zeros_like(None)), and its GAE trains the
    steps after an episode that ignore_terminations ended by truncation; both are refused here, by key."""
    train = cfg.env.train
    if cfg.runner.task_type != "embodied":
        return
    if cfg.algorithm.adv_type == "grpo":
        for key in ("auto_reset", "ignore_terminations"):
            if getattr(train, key):
                raise ConfigError(f"{source}: env.train.{key}: GRPO scores each env's first episode against its "
                                  f"group's and RLinf masks the later steps only with auto_reset and "
                                  f"ignore_terminations off; set it false")
    elif train.ignore_terminations and not train.auto_reset and \
            train.max_steps_per_rollout_epoch > train.max_episode_steps:
        raise ConfigError(f"{source}: env.train.max_steps_per_rollout_epoch: {train.max_steps_per_rollout_epoch} > "
                          f"max_episode_steps={train.max_episode_steps} with ignore_terminations and no auto_reset: "
                          f"RLinf trains the steps after the episode (no loss mask); make them equal or auto_reset")


def check_async_ppo(cfg: TrainConfig, source: str) -> None:
    """The asynchronous PPO keys (RLinf's async_ppo_embodied_runner; docs/async_ppo.md): their ranges, and what
    the async runner needs when loss_type is decoupled_actor_critic."""
    algo = cfg.algorithm

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    if algo.staleness_threshold is not None and algo.staleness_threshold < 0:
        fail("algorithm.staleness_threshold", f"must be >= 0 (weight versions; null: no bound), got "
                                              f"{algo.staleness_threshold}")
    if algo.behave_weight_threshold is not None and algo.behave_weight_threshold < 1:
        fail("algorithm.behave_weight_threshold", f"must be >= 1 (an on-policy sample's weight is 1; null: no "
                                                  f"masking), got {algo.behave_weight_threshold}")
    if algo.rollout_store_size_per_rank < 1:
        fail("algorithm.rollout_store_size_per_rank", f"must be positive, got {algo.rollout_store_size_per_rank}")
    if not 0 <= algo.on_policy_min_ratio <= 1:
        fail("algorithm.on_policy_min_ratio", f"must be in [0, 1] (a share of samples), got {algo.on_policy_min_ratio}")
    if algo.loss_type != "decoupled_actor_critic":
        return
    # what the async runner (runners/embodied_async.py) needs
    if cfg.runner.task_type != "embodied":
        fail("algorithm.loss_type", "'decoupled_actor_critic' (async PPO) is the embodied half's; the reasoning "
                                    "runner trains 'actor'")
    if algo.staleness_threshold is None:
        fail("algorithm.staleness_threshold", "async PPO (loss_type decoupled_actor_critic) needs a bound: 0 (the "
                                              "synchronous schedule), 1 or 2 as RLinf's examples")
    if algo.on_policy_min_ratio > 0:
        fail("algorithm.on_policy_min_ratio", f"{algo.on_policy_min_ratio}: the async runner trains every batch in "
                                              f"order and cannot wait for fresher ones; only 0 is supported")
    if cfg.runner.weight_sync_interval != 1:
        fail("runner.weight_sync_interval", f"{cfg.runner.weight_sync_interval}: async PPO publishes the weights "
                                            f"after every update (its versions count updates); set 1")


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
    check_lr_schedule(cfg, source)
    if cfg.cluster.threads_per_device < 1:
        fail("cluster.threads_per_device", f"must be >= 1, got {cfg.cluster.threads_per_device}")
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
    if algo.len_reward_penalty < 0:
        fail("algorithm.len_reward_penalty", f"must be >= 0 (0: no length penalty), got {algo.len_reward_penalty}")
    if algo.safe_length < 0:
        fail("algorithm.safe_length", f"must be >= 0, got {algo.safe_length}")
    if algo.max_length <= algo.safe_length:
        fail("algorithm.max_length", f"must exceed algorithm.safe_length={algo.safe_length} (the penalty ramps "
                                     f"between them), got {algo.max_length}")
    if algo.max_resample < 0:
        fail("algorithm.max_resample", f"must be >= 0 (0: no dynamic sampling), got {algo.max_resample}")
    if cfg.runner.val_pass_k < 0:
        fail("runner.val_pass_k", f"must be >= 0 (0: no pass@k), got {cfg.runner.val_pass_k}")
    n_samples = cfg.runner.val_num_samples
    if cfg.runner.val_pass_k > 0 and n_samples != -1 and n_samples < cfg.runner.val_pass_k:
        fail("runner.val_num_samples", f"pass@k needs n >= k=runner.val_pass_k={cfg.runner.val_pass_k} samples per "
                                       f"prompt (-1: n = k), got {n_samples}")
    r = cfg.reward
    if not r.reward_funcs:
        fail("reward.reward_funcs", "is empty; name at least one (e.g. [accuracy])")
    for i, name in enumerate(r.reward_funcs):
        if name not in REWARD_FUNC_NAMES:
            fail(f"reward.reward_funcs[{i}]", f"unknown {name!r} (known: {', '.join(REWARD_FUNC_NAMES)})")
    if r.reward_weights and len(r.reward_weights) != len(r.reward_funcs):
        fail("reward.reward_weights", f"{len(r.reward_weights)} weights for {len(r.reward_funcs)} reward_funcs "
                                      f"{r.reward_funcs} (empty: all 1)")
    if r.verifier not in ("rule", "math_verify"):
        fail("reward.verifier", f"must be 'rule' or 'math_verify', got {r.verifier!r}")
    if r.verifier == "math_verify" and importlib.util.find_spec("math_verify") is None:
        fail("reward.verifier", "'math_verify' needs HF's math-verify: pip install -e \".[math]\"")
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
