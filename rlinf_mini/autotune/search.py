"""The autotune's search: the layouts RLinf's cut search builds, each checked by the rules, ranked by prediction.

RLinf's `toolkits/auto_placement` cuts the embodied workflow env -> env_rollout -> actor in two, places both halves
on all devices (collocated: they take turns) or side by side on a split of the devices (pipelined), and recurses
into each half. With its rule that the embodied actor runs on all devices, the cut {env, rollout} | {actor} can only
be collocated, which leaves: env, rollout and actor on all devices (collocated), or env on devices 0..d-1 and
rollout on d..D-1 with the actor over all of them (hybrid, for every split d). The disaggregated layouts (the actor
on devices of its own) are listed refused by that rule. Each layout is tried with 1..max_stages pipeline stages.

The rules, each refusal named in the table: RLinf's actor-on-all-devices rule; every check a training run makes
before it starts (`explain.check_plan`: the placement, env ranks divisible by rollout ranks, sub-envs divisible by
env ranks x stages for train and eval, the batch arithmetic), with the key it names; and memory: no device's
predicted peak over `memory_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_mini.autotune.model import Costs, Layout, Prediction, Workload, predict
from rlinf_mini.autotune.profile import layout_config
from rlinf_mini.config import ConfigError, TrainConfig
from stages.placement import PlacementError

ACTOR_RULE = "refused: the embodied actor runs on all devices (RLinf's rule, toolkits/auto_placement/placement.py)"


@dataclass
class Row:
    layout: Layout  # or the reasoning half's ReasoningLayout
    prediction: Prediction | None = None
    refusal: str = ""  # empty: a candidate


def candidate_layouts(num_devices: int, max_stages: int) -> list[Layout]:
    """Collocated, every hybrid split, every disaggregated split (refused later), each with 1..max_stages stages."""
    D = num_devices
    every = tuple(range(D))
    out = []
    for stages in range(1, max_stages + 1):
        out.append(Layout(every, every, every, stages, "collocated"))
        for d in range(1, D):
            out.append(Layout(tuple(range(d)), tuple(range(d, D)), every, stages, "hybrid"))
        for de in range(1, D - 1):
            for dr in range(1, D - de):
                out.append(Layout(tuple(range(de)), tuple(range(de, de + dr)), tuple(range(de + dr, D)), stages,
                                  "disaggregated"))
    return out


def rule_refusal(cfg: TrainConfig, layout: Layout, num_devices: int, source: str) -> str:
    """Why `layout` cannot run (before any cost): RLinf's actor rule, or the first check a run would fail."""
    from rlinf_mini.explain import check_plan

    if sorted(layout.actor) != list(range(num_devices)):
        return ACTOR_RULE
    try:
        check_plan(layout_config(cfg, layout), source)
    except (ConfigError, PlacementError) as e:
        return "refused: " + str(e).splitlines()[0].removeprefix(f"{source}: ")
    return ""


def needed_sizes(rows: list[Row], work: Workload) -> tuple[set[int], dict[int, int]]:
    """The batches the valid rows call: sub-envs per env call, and {samples per actor rank: actor ranks}."""
    env_sizes, actor_sizes = set(), {}
    for row in rows:
        if not row.refusal:
            lay = row.layout
            env_sizes.add(work.num_envs // (len(lay.env) * lay.stages))
            actor_sizes[work.samples // len(lay.actor)] = len(lay.actor)
    return env_sizes, actor_sizes


def screen(cfg: TrainConfig, num_devices: int, max_stages: int, source: str) -> list[Row]:
    """Every candidate layout with its rule refusal (empty where it may run)."""
    return [Row(lay, refusal=rule_refusal(cfg, lay, num_devices, source))
            for lay in candidate_layouts(num_devices, max_stages)]


def rank(rows: list[Row], costs: Costs, work: Workload, memory_bytes: int, predictor=predict) -> list[Row]:
    """Predict every row that passed the rules (`predictor`: model.predict, or the reasoning half's), refuse those
    over the memory limit; candidates first, by predicted step time (ties: fewer stages, then the search's order),
    then the refused rows."""
    for row in rows:
        if row.refusal:
            continue
        row.prediction = predictor(row.layout, costs, work)
        over = {d: b for d, b in row.prediction.memory_bytes.items() if b > memory_bytes}
        if over:
            d, b = max(over.items(), key=lambda item: item[1])
            row.refusal = (f"refused: memory: device {d} needs {b / 2**30:.2f} GiB > {memory_bytes / 2**30:.2f} GiB "
                           "(--memory-gb)")
    order = {id(r): i for i, r in enumerate(rows)}
    ok = sorted((r for r in rows if not r.refusal),
                key=lambda r: (r.prediction.step_s, r.layout.stages, order[id(r)]))
    return ok + [r for r in rows if r.refusal]
