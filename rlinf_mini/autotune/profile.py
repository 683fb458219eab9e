"""The autotune's measurements: short real runs of the env, the policy and the update in this process, then a short
real run of the runner to calibrate what the channels add; or RLinf's `profile_data`, which skips all of it.

    costs = profile(cfg, env_sizes={32, 16, 8}, actor_sizes={512}, progress=bar)   # E(n), P(n), A(m)
    costs = calibrate(cfg, costs, work, [layout_a, layout_b], progress=bar)        # hop_s, fixed_s

Every measurement calls the code a worker runs: `make_env(...).chunk_step` (stages/rollout.py's EnvWorker),
`predict_action_batch` after `prepare_inputs` (RolloutWorker), `update_policy` (stages/train.py's ActorWorker), with
the torch threads of one rank (cluster.threads_per_device). The latency knobs are waits: E includes the env's
(it sleeps in chunk_step); P adds rollout.policy_latency_s, which the rollout worker sleeps after inferring.
E is measured at the smallest and the largest batch, then at the others while building them fits ENV_BUILD_BUDGET_S
(a MetaWorld sub-env takes ~0.5 s to build); P at every batch, on the rows of the largest env built.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import torch

from rlinf_mini.autotune.model import Affine, Costs, Layout, Workload, predict
from rlinf_mini.config import ConfigError, ProfileDataConfig, TrainConfig

ENV_BUILD_BUDGET_S = 20.0  # past two sizes, an env size is measured only if building it fits in this


def _rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _median_time(fn, reps: int) -> float:
    fn()  # the first call: lazy init, first-touch page faults
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile(cfg: TrainConfig, env_sizes: set[int], actor_sizes: dict[int, int], reps: int = 16,
            progress=None) -> Costs:
    """E(n) for every n in env_sizes, P(n) for the same batches, A(m) for each {samples per rank m: actor ranks}."""
    from rlinf_mini.envs import get_env_spec, make_env
    from rlinf_mini.models import build_policy
    from rlinf_mini.utils.tensor_tree import tree_map
    from stages.train import update_policy

    torch.set_num_threads(cfg.cluster.threads_per_device)  # what one rank on one device gets
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = get_env_spec(cfg.env.train)
    chunks = cfg.actor.model.num_action_chunks
    process_bytes = 0 if device == "cuda" else _rss_bytes()  # a rank at rest: torch imported, little else
    policy = build_policy(cfg.actor.model, spec.obs_dim, spec.action_dim, spec.discrete, spec.image_shape,
                          cfg.rollout.sampling_params.temperature_train).to(device).eval()
    env_s, policy_s, subenv_bytes, last = {}, {}, 0, None
    built_s = 0.0  # seconds spent building envs: MetaWorld takes ~0.5 s a sub-env (more on a busy machine)
    with torch.no_grad():
        for n in build_order(env_sizes):
            if len(env_s) >= 2 and built_s / sum(env_s) * n > ENV_BUILD_BUDGET_S - built_s:
                if progress is not None:  # two sizes fit the line; the rest would take too long to build
                    progress.update(1)
                continue
            t = time.perf_counter()
            before = _rss_bytes()
            env = make_env(cfg.env.train, torch.arange(n), chunks)
            obs = env.reset()
            built_s += time.perf_counter() - t
            subenv_bytes = max(subenv_bytes, (_rss_bytes() - before) // n)
            out = _infer(policy, obs, n, cfg.actor.seed, device)
            actions = out["actions"].float().cpu()
            env_s[n] = _median_time(lambda env=env, actions=actions: env.chunk_step(actions), reps)
            if last is None or n > last[2]:  # the largest env's rows: what the policy and the actor are fed
                last = (obs, out, n)
            env.close()
            if progress is not None:
                progress.update(1)
        rows, out, n_rows = last
        for n in sorted(env_sizes):  # P at every batch the layouts call, on rows of the largest env built
            idx = torch.arange(n) % n_rows
            batch = tree_map(lambda t, idx=idx: t[idx] if isinstance(t, torch.Tensor) else t, rows)
            policy_s[n] = _median_time(lambda b=batch, n=n: _infer(policy, b, n, cfg.actor.seed, device), reps) \
                + cfg.rollout.policy_latency_s  # the rollout worker's sleep after inferring
    last = (out.get("forward_inputs", rows), out)
    actor_s = {}
    obs, out = last
    weight_bytes = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
    for m, world_size in sorted(actor_sizes.items()):
        idx = torch.arange(m) % out["logprobs"].shape[0]  # m samples [m, ...] from the n measured rows
        flat = {"obs": tree_map(lambda t, idx=idx: t[idx].to(device), obs), "actions": out["actions"][idx],
                "old_logprobs": out["logprobs"][idx].float(), "old_values": out["values"][idx].float(),
                "advantages": torch.randn(m, device=device), "returns": torch.randn(m, device=device),
                "loss_mask": torch.ones(m, device=device)}
        optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.actor.optim.lr)  # the actor's optimizer kind
        policy.train()
        actor_s[m] = _median_time(lambda flat=flat, opt=optimizer, w=world_size:
                                  update_policy(policy, opt, flat, cfg, world_size=w), max(2, reps // 8))
        if progress is not None:
            progress.update(1)
    sample_bytes = sum(t[:1].numel() * t.element_size() for t in _leaves(flat))
    return Costs(Affine.of(env_s), Affine.of(policy_s), Affine.of(actor_s),
                 env_wait_s=cfg.env.train.step_latency_s * chunks, policy_wait_s=cfg.rollout.policy_latency_s,
                 process_bytes=process_bytes, weight_bytes=weight_bytes, sample_bytes=sample_bytes,
                 subenv_bytes=subenv_bytes)


def _infer(policy, obs, n: int, seed: int, device: str) -> dict:
    """One inference as the rollout worker makes it: prepare_inputs, the counter-based noise, predict_action_batch."""
    from rlinf_mini.utils.seeding import counter_uniform

    noise = counter_uniform(seed, torch.arange(n), 0, policy.noise_width).to(device)
    return policy.predict_action_batch(policy.prepare_inputs(obs), noise, mode="train")


def build_order(sizes: set[int]) -> list[int]:
    """Smallest, largest, then the rest ascending: the first two span the line E(n) is fit to."""
    ordered = sorted(sizes)
    return ordered[:1] + ordered[1:][::-1][:1] + ordered[1:-1]


def _leaves(tree) -> list[torch.Tensor]:
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    return [tree] if isinstance(tree, torch.Tensor) else []


# --------------------------------------------------------------------------------------------------------------------
# RLinf's profile_data


def all_or_none(given: dict[str, dict], source: str, hint: str) -> bool:
    """True when every cost in `given` is there, False when none is; one line naming the first missing otherwise."""
    missing = [k for k, v in given.items() if not v]
    if missing and len(missing) < len(given):
        raise ConfigError(f"{source}: profile_data.{missing[0]}: missing; {hint}")
    return not missing


def _points(data: dict[str, float], key: str, source: str) -> dict[int, float]:
    """{"8": 0.01} -> {8: 0.01}; a key that is not a positive int or a cost that is not a number >= 0 is one line."""
    out = {}
    for k, v in data.items():
        if not str(k).isdigit() or int(k) < 1:
            raise ConfigError(f"{source}: profile_data.{key}.{k}: expected a positive integer batch size")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{source}: profile_data.{key}.{k}: expected seconds >= 0, got {v!r}")
        out[int(k)] = float(v)
    return out


def given_costs(cfg: TrainConfig, work: Workload, num_devices: int, source: str) -> Costs | None:
    """The Costs from cfg.profile_data when it gives the env's, the rollout's and the actor's; None when it gives
    none; a ConfigError naming the missing key when it gives some. RLinf's actor_cost (the actor on all devices)
    becomes one point of A: samples per rank N T / num_devices."""
    pd: ProfileDataConfig = cfg.profile_data
    env = _points(pd.env_profile_data, "env_profile_data", source)
    policy = _points(pd.rollout_profile_data, "rollout_profile_data", source)
    actor = _points(pd.actor_profile_data, "actor_profile_data", source)
    if not actor and pd.actor_cost > 0:
        actor = {work.samples // num_devices: pd.actor_cost}
    given = {"env_profile_data": env, "rollout_profile_data": policy, "actor_profile_data (or actor_cost)": actor}
    if not all_or_none(given, source, "give the env's, the rollout's and the actor's costs, or none of them to "
                       "profile all three"):
        return None
    return Costs(Affine.of(env), Affine.of(policy), Affine.of(actor),
                 env_wait_s=cfg.env.train.step_latency_s * cfg.actor.model.num_action_chunks,
                 policy_wait_s=cfg.rollout.policy_latency_s, hop_s=max(pd.hop_s, 0.0), fixed_s=max(pd.fixed_s, 0.0))


# --------------------------------------------------------------------------------------------------------------------
# Calibration: what the channels and the step's other phases add, from the real runner


def layout_config(cfg: TrainConfig, layout: Layout) -> TrainConfig:
    """cfg with `layout`'s placement and pipeline depth: what the overlay written for it gives."""
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, component_placement=layout.placement()),
                               rollout=dataclasses.replace(cfg.rollout, pipeline_stage_num=layout.stages))


def quiet_config(cfg: TrainConfig, log_path: str, tag: str) -> TrainConfig:
    """cfg for a timed run beside others in one cluster: its own group names and run folder, no eval (and the
    fewest eval envs), checkpoint, trace, progress bar or logger files but metrics.jsonl."""
    from rlinf_mini.explain import num_devices
    from stages.placement import HybridComponentPlacement

    runner = dataclasses.replace(cfg.runner, progress_bar=False, trace=False, log_interval=1000, val_check_interval=-1,
                                 save_interval=-1, logger=dataclasses.replace(cfg.runner.logger, log_path=log_path,
                                                                              experiment_name=tag, logger_backends=[]))
    cfg = dataclasses.replace(cfg, runner=runner, rollout=dataclasses.replace(cfg.rollout, group_name=f"Rollout{tag}"),
                              actor=dataclasses.replace(cfg.actor, group_name=f"Actor{tag}"))
    if cfg.runner.task_type == "reasoning":
        return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, group_name=f"Reward{tag}"))
    # the eval envs are built but never stepped here: one per env rank and stage (MetaWorld's 52 take a minute)
    env_ranks = HybridComponentPlacement(cfg.cluster.component_placement, num_devices(cfg)).get_world_size("env")
    eval_envs = env_ranks * cfg.rollout.pipeline_stage_num * cfg.env.eval.group_size
    env = dataclasses.replace(cfg.env, group_name=f"Env{tag}",
                              eval=dataclasses.replace(cfg.env.eval, total_num_envs=eval_envs))
    return dataclasses.replace(cfg, env=env)


def measure_steps(cfgs: dict[str, TrainConfig], reps: int, source: str, rounds: bool = False) -> dict:
    """Each config's median of every time/ metric (the runner's timers: time/step, time/generate_rollouts, ...) over
    `reps` training steps after one warm-up step (with `rounds`: the list of each round's instead); every config's
    runner in one cluster, the configs in turn within a round (a busy machine slows each alike). No eval, no
    checkpoint. Embodied or reasoning configs, not both."""
    from rlinf_mini.scheduler.cluster import Cluster
    from rlinf_mini.train import ReasoningRunPlan, RunPlan, launch, launch_reasoning

    times: dict[str, list[dict[str, float]]] = {tag: [] for tag in cfgs}
    with tempfile.TemporaryDirectory(prefix="autotune_") as log_path:
        quiet = {tag: quiet_config(cfg, log_path, tag) for tag, cfg in cfgs.items()}
        reasoning = next(iter(quiet.values())).runner.task_type == "reasoning"
        plans = {tag: (ReasoningRunPlan if reasoning else RunPlan)(c, source) for tag, c in quiet.items()}
        first = next(iter(plans.values()))
        cluster = Cluster(next(iter(quiet.values())).cluster, preload=first.preload)
        try:
            runners = {}
            for tag, c in quiet.items():
                plans[tag].run_dir.mkdir(parents=True)  # what build_and_run makes before a run: metrics.jsonl
                runners[tag] = (launch_reasoning if reasoning else launch)(c, plans[tag], cluster)
            for runner in runners.values():
                runner.init_workers()
            for rnd in range(reps + 1):
                for tag, runner in runners.items():
                    runner.max_steps = runner.global_step + 1
                    last = runner.run()[-1]
                    if rnd > 0:
                        times[tag].append({k: v for k, v in last.items() if k.startswith("time/")})
        finally:
            cluster.shutdown()
    if rounds:
        return times
    return {tag: {k: statistics.median(t[k] for t in v) for k in v[0]} for tag, v in times.items()}


def calibrate(cfg: TrainConfig, costs: Costs, work: Workload, layouts: list[Layout], source: str,
              reps: int = 2) -> Costs:
    """hop_s, fixed_s and the update's cost from real steps of `layouts` (two that lean on hop_s unequally): the
    rollout phase measured minus predicted with hop 0 is hop x (the prediction's slope in hop), solved by least
    squares through 0 on relative errors; the runner's own `time/actor_training` replaces A at its batch (the real
    update, gradient all-reduce included, at the real placement); the rest of the step is fixed (sync, advantages,
    dispatch). Negative values are clamped to 0."""
    base = dataclasses.replace(costs, hop_s=0.0, fixed_s=0.0)
    measured = measure_steps({f"cal{i}": layout_config(cfg, lay) for i, lay in enumerate(layouts)}, reps, source)
    delta = 1e-3
    residual, slope, actor = [], [], dict(costs.actor.points)
    for i, lay in enumerate(layouts):
        p0, p1 = predict(lay, base, work), predict(lay, dataclasses.replace(base, hop_s=delta), work)
        m = measured[f"cal{i}"]
        residual.append(m["time/generate_rollouts"] - p0.generate_s)
        slope.append((p1.generate_s - p0.generate_s) / delta)
        actor[work.samples // len(lay.actor)] = m["time/actor_training"]
    # least squares on relative errors: each layout's rollout phase counts alike, whatever its length
    w = [1 / m["time/generate_rollouts"] ** 2 for m in measured.values()]
    hop = sum(wi * r * s for wi, r, s in zip(w, residual, slope, strict=True)) / sum(
        wi * s * s for wi, s in zip(w, slope, strict=True))
    fixed = statistics.mean(m["time/step"] - m["time/generate_rollouts"] - m["time/actor_training"]
                            for m in measured.values())
    return dataclasses.replace(costs, actor=Affine.of(actor), hop_s=max(hop, 0.0), fixed_s=max(fixed, 0.0))
