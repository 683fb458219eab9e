"""`--explain`: the plan of a run — placement, env split, batches — computed and printed without starting a process.

    python -m rlinf_mini.train --config configs/embodied_mlp.yaml --explain
    python -m rlinf_mini.train --config configs/embodied_mlp.yaml --actor.micro-batch-size 96 --explain   # broken

Prints, in the order of one RL step: the placement map (device -> components and ranks), which env ranks each
rollout rank serves, the envs of every env rank and pipeline stage, the rollout batch, the trajectories each actor
rank receives, and the global / micro batch with its gradient-accumulation steps. The checks are the real ones that
a training run makes before it starts (`validate_config`, `HybridComponentPlacement`, `check_batch_arithmetic`).
Where one fails, the plan is printed as far as it goes, then the number that breaks it and two command-line
settings near it that pass every check; the exit code is 2, as for a training run with that config. It does not
build the env or the model (a bad env id or model folder is still reported when training starts).

Layering: a composition-level module, like `train.py` and `runners/`: it imports `stages/` (placement, and the
rollout's split helpers, so that the numbers printed are the ones the workers use). Nothing in the runtime imports it.

RLinf has no such command; its batch rules live in `rlinf/config.py::validate_embodied_cfg`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator

from rlinf_mini.config import (
    ConfigError,
    TrainConfig,
    check_batch_arithmetic,
    check_precision,
    config_source,
    load_config,
    validate_config,
)
from rlinf_mini.scheduler import devices
from stages.placement import HybridComponentPlacement, PlacementError, actor_pieces, env_ranks_of_rollout

COMPONENTS = ("env", "rollout", "actor")

# For the key that a failed check names: the integer keys a suggestion may change, tried in this order.
KNOBS = {
    "env.train.total_num_envs": ["env.train.total_num_envs", "rollout.pipeline_stage_num"],
    "env.eval.total_num_envs": ["env.eval.total_num_envs", "rollout.pipeline_stage_num"],
    "actor.global_batch_size": ["actor.global_batch_size", "actor.micro_batch_size", "env.train.total_num_envs"],
    "env.train.max_steps_per_rollout_epoch": ["env.train.max_steps_per_rollout_epoch",
                                              "actor.model.num_action_chunks"],
    "env.eval.max_steps_per_rollout_epoch": ["env.eval.max_steps_per_rollout_epoch", "actor.model.num_action_chunks"],
}


# --------------------------------------------------------------------------------------------------------------------
# The checks a training run makes before it starts


def check_plan(cfg: TrainConfig, source: str) -> HybridComponentPlacement:
    """Every check `python -m rlinf_mini.train` makes on the numbers before starting a process (not the env and
    model builds). Raises ConfigError or PlacementError; returns the placement."""
    validate_config(cfg, source)
    placement = HybridComponentPlacement(cfg.cluster.component_placement, num_devices(cfg))
    sizes = [placement.get_world_size(c) for c in COMPONENTS]
    check_batch_arithmetic(cfg, *sizes, source)
    return placement


def breaking_key(error: Exception, source: str) -> str:
    """The key path a check's one-line message starts with ('<source>: <key>: ...', or '<key>: ...')."""
    text = str(error).removeprefix(f"{source}: ")
    return text.split(": ", 1)[0].split(" ", 1)[0]


def get_value(cfg: TrainConfig, key: str):
    obj = cfg
    parts = key.split(".")
    if parts[:2] == ["cluster", "component_placement"] and len(parts) > 2:
        return cfg.cluster.component_placement.get(".".join(parts[2:]))
    for part in parts:
        obj = getattr(obj, part)
    return obj


def with_value(cfg, key: str, value):
    """A copy of cfg with one key changed ('cluster.component_placement.rollout' changes one placement string);
    the sections on the key's path are copied (dataclasses.replace), the rest is shared."""
    head, _, rest = key.partition(".")
    if head == "component_placement" and rest:
        return dataclasses.replace(cfg, component_placement={**cfg.component_placement, rest: value})
    return dataclasses.replace(cfg, **{head: with_value(getattr(cfg, head), rest, value) if rest else value})


def flag(key: str, value) -> str:
    """The command-line override that sets `key` (tyro spells '_' as '-')."""
    if key.startswith("cluster.component_placement."):
        return f"--cluster.component-placement.{key.split('.', 2)[2]} {value}"
    return f"--{key.replace('_', '-')} {value}"


# --------------------------------------------------------------------------------------------------------------------
# Nearby settings that pass


Setting = tuple[tuple[str, object], ...]  # ((key, value), ...): one or two changes


def first_error(cfg: TrainConfig, source: str) -> Exception | None:
    try:
        check_plan(cfg, source)
    except (ConfigError, PlacementError) as e:
        return e
    return None


def _int_candidates(current: int) -> Iterator[int]:
    """current-1, current+1, current-2, current+2, ... over [1, 4 * current + 64]."""
    for d in range(1, 4 * current + 65):
        for v in (current - d, current + d):
            if 1 <= v <= 4 * current + 64:
                yield v


def _placement_candidates(current: str, num_devices: int) -> Iterator[str]:
    """Contiguous device ranges ('0', '0-1', '1-2', ...), fewest devices first."""
    for n in range(1, num_devices + 1):
        for start in range(num_devices - n + 1):
            value = str(start) if n == 1 else f"{start}-{start + n - 1}"
            if value != current:
                yield value


def _has_key(cfg: TrainConfig, key: str) -> bool:
    try:
        get_value(cfg, key)
    except AttributeError:
        return False
    return True


def _knobs(key: str, cfg: TrainConfig) -> list[str]:
    if key in KNOBS:
        return KNOBS[key]
    if key == "cluster.component_placement" or key.startswith("cluster.component_placement."):
        # vary the placement of a key holding the rollout, then one holding the env (the env/rollout rank rule)
        keys = [k for k in cfg.cluster.component_placement if "rollout" in k.split(",")]
        keys += [k for k in cfg.cluster.component_placement if "env" in k.split(",") and k not in keys]
        named = key.removeprefix("cluster.component_placement.")
        if named in cfg.cluster.component_placement and named not in keys:
            keys.insert(0, named)
        return [f"cluster.component_placement.{k}" for k in keys]
    leaf = get_value(cfg, key) if _has_key(cfg, key) else None
    return [key] if isinstance(leaf, int) and not isinstance(leaf, bool) else []


def _moves(cfg: TrainConfig, key: str, source: str, per_side: int = 1, skip: str = ""
           ) -> Iterator[tuple[str, object, Exception | None]]:
    """(knob, value, the new first error) for changes that fix the check naming `key` without breaking one that
    names the knob itself: for each knob, the `per_side` nearest such values below and above the current one."""
    for knob in _knobs(key, cfg):
        if knob == skip:
            continue
        current = get_value(cfg, knob)
        if isinstance(current, str):  # a placement string
            values = _placement_candidates(current, num_devices(cfg))
        elif isinstance(current, int):
            values = _int_candidates(current)
        else:
            continue
        below = above = 0  # moves yielded on each side of the current value (placements count as "above")
        for value in values:
            is_below = not isinstance(current, str) and value < current
            if (below if is_below else above) >= (per_side if not isinstance(current, str) else 2 * per_side):
                continue
            error = first_error(with_value(cfg, knob, value), source)
            if error is None or breaking_key(error, source) not in (key, knob):  # this check passes now
                yield knob, value, error
                below, above = (below + 1, above) if is_below else (below, above + 1)
            if below + above == 2 * per_side:
                break


def suggest(cfg: TrainConfig, key: str, source: str, count: int = 2) -> list[Setting]:
    """Up to `count` settings near cfg that pass `check_plan`: one change that fixes the check naming `key`, or that
    change plus one that fixes the next check it reveals."""
    found: list[Setting] = []
    for per_side in (1, 2):  # the nearest value on each side first; a second one only if still short
        for knob, value, error in _moves(cfg, key, source, per_side):
            setting: Setting | None = ((knob, value),) if error is None else None
            if error is not None:
                changed = with_value(cfg, knob, value)
                for knob2, value2, error2 in _moves(changed, breaking_key(error, source), source, skip=knob):
                    if error2 is None:
                        setting = ((knob, value), (knob2, value2))
                        break
            if setting is not None and setting not in found:
                found.append(setting)
            if len(found) == count:
                return found
    return found


# --------------------------------------------------------------------------------------------------------------------
# The plan, as far as the numbers go


def _div(a: int, b: int, what: str) -> tuple[str, int | None]:
    """'a / b = q', or the same marked as broken; returns (text, q or None)."""
    if b > 0 and a % b == 0:
        return f"{a} / {b} = {a // b} {what}", a // b
    q = f"{a / b:.2f}" if b > 0 else "undefined"
    return f"{a} / {b} = {q} {what}  <-- does not divide", None


def _ranges(ids: list[int]) -> str:
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])


def gpu_count() -> int:
    """The GPUs the driver sees (CUDA_VISIBLE_DEVICES honoured)."""
    import torch

    return torch.cuda.device_count()


def num_devices(cfg: TrainConfig, num_gpus: int | None = None) -> int:
    """cluster.num_devices as a run uses it (-1: every visible GPU, 2 CPU shares without one)."""
    return devices.resolve_num_devices(cfg.cluster.num_devices, gpu_count() if num_gpus is None else num_gpus)


def describe(cfg: TrainConfig, placement: HybridComponentPlacement | None, num_gpus: int | None = None) -> list[str]:
    """The plan, section by section; stops where a number it needs does not exist. `num_gpus` None: this machine's."""
    # this machine: its GPUs as CUDA_VISIBLE_DEVICES names them; a faked count: GPUs '0'..'num_gpus-1'
    visible = devices.visible_gpus(os.environ, gpu_count()) if num_gpus is None else None
    num_gpus = gpu_count() if num_gpus is None else num_gpus
    lines = [f"1 placement (cluster.num_devices = {num_devices(cfg, num_gpus)})"]
    if placement is None:
        return lines + ["  (cannot place the components: see the error below)"]
    lines += ["  " + line for line in placement.describe().splitlines()]
    plan = devices.device_plan({c: placement.get_strategy(c) for c in COMPONENTS}, num_devices(cfg, num_gpus),
                               num_gpus, visible, num_nodes=cfg.cluster.num_nodes,
                               threads_per_device=cfg.cluster.threads_per_device)
    lines += ["  " + line for line in plan.describe()]
    ws = {c: placement.get_world_size(c) for c in COMPONENTS}
    lines.append(f"  world sizes: env {ws['env']}, rollout {ws['rollout']}, actor {ws['actor']}")
    if ws["env"] % ws["rollout"] == 0:
        for r in range(ws["rollout"]):
            served = env_ranks_of_rollout(r, ws["env"], ws["rollout"])
            lines.append(f"  rollout rank {r} serves env rank(s) {_ranges(served)}")
    else:
        lines.append(f"  env ranks {ws['env']} / rollout ranks {ws['rollout']}: does not divide  <-- broken")

    lines.append(f"2 weight sync: actor rank 0 -> {ws['rollout']} rollout rank(s), every "
                 f"{cfg.runner.weight_sync_interval} step(s)")

    stages, train, chunks = cfg.rollout.pipeline_stage_num, cfg.env.train, cfg.actor.model.num_action_chunks
    lines.append(f"3 rollout: {ws['env']} env rank(s) x {stages} pipeline stage(s)")
    for split in ("train", "eval"):
        e = getattr(cfg.env, split)
        text, n = _div(e.total_num_envs, ws["env"] * stages, "sub-envs per stage")
        lines.append(f"  {split}: total_num_envs / (env ranks x stages) = {text}")
        if n is not None and e.group_size > 1:
            g_text, _ = _div(n, e.group_size, "groups per stage")
            lines.append(f"    GRPO groups: {g_text}")
        if n is not None and split == "train":
            for rank in range(min(ws["env"], 4)):
                parts = [f"stage {k}: envs {_ranges(list(range((rank * stages + k) * n, (rank * stages + k + 1) * n)))}"
                         for k in range(stages)]
                lines.append(f"    env rank {rank}: {n * stages} envs; " + ", ".join(parts))
            if ws["env"] > 4:
                lines.append(f"    ... (env ranks 4-{ws['env'] - 1} alike)")
    t_text, T = _div(train.max_steps_per_rollout_epoch, chunks, "chunk steps")
    lines.append(f"  chunk steps per rollout epoch: max_steps_per_rollout_epoch / num_action_chunks = {t_text}")
    if T is None:
        return lines
    samples = train.total_num_envs * train.rollout_epoch * T
    lines.append(f"  rollout batch: total_num_envs x rollout_epoch x T = {train.total_num_envs} x {train.rollout_epoch}"
                 f" x {T} = {samples} samples (+1 value-only inference per env and epoch for the bootstrap)")

    trajectories = train.total_num_envs * train.rollout_epoch
    lines.append(f"4 advantages: adv_type {cfg.algorithm.adv_type} on [T, B] = [{T}, {trajectories}]")

    W = ws["actor"]
    lines.append(f"5 training: {W} actor rank(s)")
    lines.append(f"  trajectories to the actor per step: total_num_envs x rollout_epoch = {trajectories}, "
                 f"each {T} chunk steps (values: {T + 1})")
    per_env, per_actor = actor_pieces(ws["env"], W)
    traj_text, per_rank = _div(trajectories, W, "trajectories per actor rank")
    lines.append(f"  {traj_text}; each env rank cuts its batch into {per_env} piece(s), each actor rank takes "
                 f"{per_actor}")
    if per_rank is not None:
        lines.append(f"  per actor rank: {per_rank} x {T} = {per_rank * T} samples")
    gbs, mbs = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
    rank_text, per_rank_batch = _div(gbs, W, "samples per rank per optimizer step")
    lines.append(f"  global batch {gbs} over {W} actor rank(s): {rank_text}")
    if per_rank_batch is not None:
        acc_text, _ = _div(per_rank_batch, mbs, "gradient-accumulation steps")
        lines.append(f"  micro batch {mbs}: {acc_text}")
    steps_text, steps = _div(samples, gbs, "optimizer steps per update epoch")
    lines.append(f"  rollout batch / global batch = {steps_text}")
    if steps is not None:
        lines.append(f"  x update_epoch {cfg.algorithm.update_epoch} = {steps * cfg.algorithm.update_epoch} "
                     f"optimizer steps per training step")
    return lines + schedule(cfg)


def schedule(cfg: TrainConfig) -> list[str]:
    """Who waits for whom in a step: the synchronous runner, or async PPO's (runners/embodied_async.py)."""
    algo = cfg.algorithm
    if algo.loss_type != "decoupled_actor_critic":
        return ["6 schedule: synchronous (runners/embodied.py): the rollout waits for the new weights, the actor for "
                "the whole rollout batch, env and rollout for the actor's update"]
    s = algo.staleness_threshold
    anchor = "recomputed by an actor forward" if cfg.rollout.recompute_logprobs else "interpolated from versions"
    return [f"6 schedule: asynchronous PPO (runners/embodied_async.py), staleness_threshold {s}",
            f"  batch i starts once i <= actor version + {s}: up to {s + 1} batch(es) in flight; a checkpoint "
            f"step is a barrier (no batch crosses it)",
            f"  the rollout waits for weights of version >= i - {s}, then copies the newest published; env and "
            f"rollout do not wait for the actor's update" + (" (staleness 0: they do, as synchronous)" if not s
                                                             else ""),
            "  the actor waits for batch i's trajectories; actor rank 0 publishes version i + 1 after the update"
            + (" without the driver waiting (actor.sync_weight_no_wait)" if cfg.actor.sync_weight_no_wait else ""),
            f"  proximal policy: {anchor}; store: the {algo.rollout_store_size_per_rank} freshest batch(es) per "
            f"actor rank"]


def explain_reasoning(cfg: TrainConfig, source: str, num_gpus: int | None = None) -> tuple[str, str | None]:
    """The reasoning plan (runner.task_type: reasoning): placement of rollout, reward and actor, and the batch
    arithmetic of one step (nothing is made: no data, no model folder)."""
    from rlinf_mini.config import check_reasoning_batch_arithmetic
    from stages.placement import ReasoningComponentPlacement

    lines = [f"plan for {source} (computed only: no process started)"]
    try:
        validate_config(cfg, source)
        placement = ReasoningComponentPlacement(cfg.cluster.component_placement, num_devices(cfg, num_gpus))
        sizes = {c: placement.get_world_size(c) for c in ("rollout", "reward", "actor")}
        lines += ["placement:", *("  " + ln for ln in placement.describe().splitlines())]
        lines.append("world sizes: " + ", ".join(f"{c} {n}" for c, n in sizes.items()))
        check_reasoning_batch_arithmetic(cfg, sizes["rollout"], sizes["reward"], sizes["actor"], source)
        check_precision(cfg, gpu_count() if num_gpus is None else num_gpus, source)
    except (ConfigError, PlacementError) as e:
        message = str(e).splitlines()[0]
        lines.append(f"breaks: {message.removeprefix(source + ': ')}")
        return "\n".join(lines), message
    prompts, group = cfg.data.rollout_batch_size, cfg.algorithm.group_size
    responses = prompts * group
    lines += [f"rollout batch: data.rollout_batch_size x algorithm.group_size = {prompts} x {group} = {responses} "
              f"responses, in chunks of {cfg.algorithm.rollout_batch_size_per_gpu} prompts",
              f"{responses} / global_batch_size {cfg.actor.global_batch_size} = "
              f"{responses // cfg.actor.global_batch_size} optimizer steps per update epoch", "all checks pass"]
    return "\n".join(lines + autotune_note(cfg, source)), None


def autotune_note(cfg: TrainConfig, source: str) -> list[str]:
    """With profile_data in the config: whether its placement and depth (embodied: pipeline stages; reasoning: the
    chunk size) are the autotune's pick (the search on those costs; nothing is profiled here). Without: nothing."""
    from rlinf_mini.autotune.__main__ import autotune

    pd = cfg.profile_data
    given = (pd.rollout_cost > 0 or pd.rollout_profile_data) if cfg.runner.task_type == "reasoning" else \
        (pd.env_profile_data or pd.rollout_profile_data)
    if not given:
        return []
    try:
        result = autotune(cfg, source, progress=False)
    except ConfigError as e:
        return [f"autotune: cannot rank with this profile_data: {str(e).removeprefix(source + ': ')}"]
    best, mine = result.best, result.current
    if mine is best:
        return [f"autotune (profile_data): this placement and depth are its pick, predicted "
                f"{best.prediction.step_s:.4f} s per step"]
    ours = f"{mine.prediction.step_s:.4f} s" if mine.prediction is not None else mine.refusal
    return [f"autotune (profile_data): not its pick; the pick is {best.layout.describe()}, {best.layout.stages} "
            f"stage(s), predicted {best.prediction.step_s:.4f} s per step against this config's {ours} "
            f"(python -m rlinf_mini.autotune writes it as an overlay)"]


def explain(cfg: TrainConfig, source: str, num_gpus: int | None = None) -> tuple[str, str | None]:
    """The plan as text, and the first failing check's one-line message (None when every check passes).
    `num_gpus` fakes the GPU count (tests); None: this machine's."""
    if cfg.runner.task_type == "reasoning":
        return explain_reasoning(cfg, source, num_gpus)
    error: Exception | None = None
    placement = None
    try:
        validate_config(cfg, source)
    except ConfigError as e:
        error = e
    try:
        placement = HybridComponentPlacement(cfg.cluster.component_placement, num_devices(cfg, num_gpus))
    except PlacementError as e:
        error = error or e
    if error is None:
        try:
            check_plan(cfg, source)
            check_precision(cfg, gpu_count() if num_gpus is None else num_gpus, source)
        except (ConfigError, PlacementError) as e:
            error = e
    lines = [f"plan for {source} (computed only: no process started)"]
    lines += describe(cfg, placement, num_gpus)
    if error is None:
        lines.append("all checks pass")
        lines += autotune_note(cfg, source)
        return "\n".join(lines), None
    key = breaking_key(error, source)
    message = str(error).splitlines()[0]
    if isinstance(error, PlacementError):  # as train.main words it
        message = f"{source}: {message}"
    value = get_value(cfg, key) if _has_key(cfg, key) else None
    lines.append(f"breaks: {key}" + (f" = {value}" if value is not None and not isinstance(value, dict) else ""))
    lines.append(f"  {message.removeprefix(source + ': ')}")
    found = suggest(cfg, key, source)
    if found:
        lines.append(f"{len(found)} setting(s) near it that pass every check:")
        lines += ["  " + " ".join(flag(k, v) for k, v in setting) for setting in found]
    else:
        lines.append("no change of one or two nearby batch or placement numbers fixes it")
    return "\n".join(lines), message


def main(argv: list[str]) -> int:
    """`--explain` with the rest of the command line: print the plan; exit 0, or 2 where a check fails."""
    try:
        cfg = load_config(argv, validate=False)  # YAML and command-line errors still stop here
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = config_source(argv)
    text, error = explain(cfg, source)
    print(text)
    if error is None:
        return 0
    print(f"error: {error}", file=sys.stderr)
    return 2

