"""`python -m rlinf_mini.autotune --config X`: profile, search, print the ranked table, write the winner as an overlay.

    python -m rlinf_mini.autotune --config configs/embodied_mlp.yaml                 # ~1 minute on 2 cores
    python -m rlinf_mini.autotune --config configs/metaworld_reach.yaml --out best.yaml
    python -m rlinf_mini.train --config configs/metaworld_reach.yaml --config best.yaml   # train with the pick
    python -m rlinf_mini.autotune --config configs/math.yaml      # reasoning: rollout -> reward -> actor

Options: --out FILE (the overlay; default <log_path>/autotune/<config>.yaml), --max-stages K (pipeline stages tried:
1..K, default 4; reasoning: the chunk counts up to K that divide data.rollout_batch_size), --memory-gb G (per
device; default the GPU's memory, or RAM / num_devices), --reps R (measured calls per cost). The rest of the
command line is the train command's (--config, key=value, --section.key value). A config with `profile_data`
(RLinf's keys: env/rollout profile data and actor_cost; reasoning: rollout_cost, actor_cost, inference_cost) is
not profiled.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlinf_mini.autotune.model import Costs, Layout, Workload, layout_of, predict
from rlinf_mini.autotune.search import Row, needed_sizes, rank, screen
from rlinf_mini.config import ConfigError, TrainConfig, config_source, load_config
from stages.placement import PlacementError


@dataclass
class Result:
    rows: list[Row]  # candidates by predicted step time, then the refused
    costs: Costs
    work: Workload
    current: Row  # the config's own layout, predicted (refusal if it cannot run)
    profiled: bool  # False: the config's profile_data was used

    @property
    def best(self) -> Row:
        return self.rows[0]


def workload(cfg: TrainConfig) -> Workload:
    train = cfg.env.train
    return Workload(train.total_num_envs, train.max_steps_per_rollout_epoch // cfg.actor.model.num_action_chunks,
                    train.rollout_epoch, cfg.env.eval.total_num_envs)


def default_memory_bytes(num_devices: int) -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // num_devices  # the devices share the RAM


def autotune(cfg: TrainConfig, source: str, max_stages: int = 4, memory_bytes: int | None = None, reps: int = 16,
             progress: bool = True) -> Result:
    """Screen the layouts by the rules, take the costs (profile_data, or profiled and calibrated here), rank."""
    from tqdm import tqdm

    from rlinf_mini.autotune.profile import calibrate, given_costs, profile
    from rlinf_mini.explain import check_plan, num_devices

    if cfg.runner.task_type == "reasoning":
        return autotune_reasoning(cfg, source, max_stages, memory_bytes, reps, progress)
    check_plan(cfg, source)  # the config itself must be one a run accepts (its placement is compared below)
    D, work = num_devices(cfg), workload(cfg)
    memory_bytes = memory_bytes or default_memory_bytes(D)
    rows = screen(cfg, D, max_stages, source)
    if not any(not r.refusal for r in rows):
        raise ConfigError(f"{source}: cluster.num_devices: no layout of {D} device(s) passes the checks; the first "
                          f"refusal: {rows[0].refusal}")
    costs = given_costs(cfg, work, D, source)
    profiled = costs is None
    if profiled:
        env_sizes, actor_sizes = needed_sizes(rows, work)
        with tqdm(total=len(env_sizes) + len(actor_sizes) + 1, desc="autotune: profiling", file=sys.stderr,
                  disable=not progress, leave=False) as bar:
            costs = profile(cfg, env_sizes, actor_sizes, reps, bar)
            valid = [r.layout for r in rows if not r.refusal]
            # the two layouts whose predictions lean most and least on hop_s: the best-conditioned pair to solve
            slope = {lay: _hop_slope(lay, costs, work) for lay in valid}
            pair = [min(valid, key=slope.get), max(valid, key=slope.get)]
            bar.set_description("autotune: calibrating on the runner")
            costs = calibrate(cfg, costs, work, pair if pair[0] != pair[1] else pair[:1], source)
            bar.update(1)
    ranked = rank(rows, costs, work, memory_bytes)
    mine = layout_of(cfg.cluster.component_placement, D, cfg.rollout.pipeline_stage_num)
    current = next((r for r in ranked if (r.layout.env, r.layout.rollout, r.layout.actor, r.layout.stages)
                    == (mine.env, mine.rollout, mine.actor, mine.stages)), None)
    if current is None:  # a layout outside the search (several ranks per device, a process over two devices)
        current = Row(mine, predict(mine, costs, work))
    return Result(ranked, costs, work, current, profiled)


def autotune_reasoning(cfg: TrainConfig, source: str, max_stages: int, memory_bytes: int | None, reps: int,
                       progress: bool) -> Result:
    """The reasoning half (autotune/reasoning.py): the same steps on rollout -> reward -> actor; `stages` is the
    number of chunks a step's prompts are cut into (max_stages: the most tried)."""
    from tqdm import tqdm

    from rlinf_mini.autotune import reasoning as r
    from rlinf_mini.explain import num_devices

    r.check_reasoning_plan(cfg, source)
    D, work = num_devices(cfg), r.workload(cfg)
    memory_bytes = memory_bytes or default_memory_bytes(D)
    rows = r.screen(cfg, D, max_stages, source)
    valid = [row.layout for row in rows if not row.refusal]
    if not valid:
        raise ConfigError(f"{source}: cluster.num_devices: no layout of {D} device(s) passes the checks; the first "
                          f"refusal: {rows[0].refusal}")
    costs = r.given_costs(cfg, D, source)
    profiled = costs is None
    if profiled:
        chunk_sizes, actor_sizes = r.needed_sizes(valid, work)
        with tqdm(total=len(chunk_sizes) + len(actor_sizes) + 1, desc="autotune: profiling", file=sys.stderr,
                  disable=not progress, leave=False) as bar:
            costs = r.profile(cfg, source, chunk_sizes, actor_sizes, reps, bar)
            slope = {lay: _hop_slope(lay, costs, work, r.predict_reasoning) for lay in valid}
            # the layouts leaning least and most on hop, and the one the uncalibrated costs favour (it is measured
            # before it can win on a hop of 0)
            favoured = min(valid, key=lambda lay: r.predict_reasoning(lay, costs, work).step_s)
            chosen = list(dict.fromkeys([min(valid, key=slope.get), max(valid, key=slope.get), favoured]))
            bar.set_description("autotune: calibrating on the runner")
            costs = r.calibrate(cfg, costs, work, chosen, source, reps=3)
            bar.update(1)
    ranked = rank(rows, costs, work, memory_bytes, predictor=r.predict_reasoning)
    mine = r.layout_of(cfg, D)
    current = next((row for row in ranked if row.layout.key() == mine.key()), None)
    if current is None:  # a layout outside the search (several ranks per device, a chunk count past max_stages)
        current = Row(mine, r.predict_reasoning(mine, costs, work))
    return Result(ranked, costs, work, current, profiled)


def _hop_slope(layout: Layout, costs: Costs, work: Workload, predictor=predict) -> float:
    import dataclasses

    return (predictor(layout, dataclasses.replace(costs, hop_s=1e-3), work).step_s
            - predictor(layout, dataclasses.replace(costs, hop_s=0.0), work).step_s)


# --------------------------------------------------------------------------------------------------------------------
# What it prints and writes


def _fit_text(name: str, fit, unit: str) -> str:
    a, b = fit.coefficients
    at = ", ".join(f"{n}: {s * 1e3:.3g}" for n, s in fit.points)
    return f"  {name} = {a * 1e3:.3g} ms + {b * 1e3:.3g} ms x {unit}   (measured ms at {at})"


def _cost_lines(result: Result) -> list[str]:
    from rlinf_mini.autotune.reasoning import ReasoningCosts

    c, w = result.costs, result.work
    if isinstance(c, ReasoningCosts):
        return [_fit_text("G(b), one chunk's generation", c.generate, "responses"),
                _fit_text("R(b), one chunk's reward", c.reward, "responses"),
                _fit_text("A(m), one step's actor work", c.actor, "responses per rank"),
                f"  hop {c.hop_s * 1e3:.3g} ms per message, sync {c.sync_s * 1e3:.3g} ms per rollout rank, fixed "
                f"{c.fixed_s * 1e3:.3g} ms per step",
                f"workload: {w.prompts} prompts x {w.group} responses; stages = chunks a step (rollout -> reward "
                "pipelined chunk by chunk; the actor starts when its chunks are scored)"]
    return [_fit_text("E(n), one chunk step", c.env, "sub-envs"), _fit_text("P(n), one inference", c.policy, "batch"),
            _fit_text("A(m), one step's update", c.actor, "samples per rank"),
            f"  hop {c.hop_s * 1e3:.3g} ms per message, fixed {c.fixed_s * 1e3:.3g} ms per step",
            f"workload: {w.num_envs} sub-envs x {w.chunk_steps} chunk steps x {w.rollout_epochs} rollout epoch(s)"]


def table(result: Result) -> str:
    lines = [f"costs ({'profiled on this machine' if result.profiled else 'from profile_data'}):",
             *_cost_lines(result), ""]
    head = f"{'#':>2}  {'placement':44} {'stages':>6} {'step s':>8} {'rollout s':>9} {'update s':>8} {'bubble':>6}  " \
           f"peak MiB per device"
    lines += [head, "-" * len(head)]
    for i, row in enumerate(result.rows):
        mark = "  <- your config" if row is result.current else ""
        if row.refusal:
            lines.append(f"{'-':>2}  {row.layout.describe():44} {row.layout.stages:>6}  {row.refusal}{mark}")
            continue
        p = row.prediction
        mem = " ".join(f"{b / 2**20:.0f}" for _, b in sorted(p.memory_bytes.items())) \
            if any(p.memory_bytes.values()) else "n/a (not in profile_data)"
        lines.append(f"{i + 1:>2}  {row.layout.describe():44} {row.layout.stages:>6} {p.step_s:>8.4f} "
                     f"{p.generate_s:>9.4f} {p.train_s:>8.4f} {p.bubble:>6.0%}  {mem}{mark}")
    return "\n".join(lines)


def _depth(layout) -> tuple[str, str, int]:
    """(section, key, value) of the layout's depth: the embodied pipeline's stages, or the reasoning chunk size."""
    if hasattr(layout, "prompts_per_chunk"):
        return "algorithm", "rollout_batch_size_per_gpu", layout.prompts_per_chunk
    return "rollout", "pipeline_stage_num", layout.stages


def overlay(layout: Layout) -> dict:
    """The YAML overlay for `layout`: the whole placement (it replaces the config's) and the pipeline depth."""
    section, key, value = _depth(layout)
    return {"cluster": {"component_placement": layout.placement()}, section: {key: value}}


def overrides(layout: Layout) -> list[str]:
    """The same as key=value arguments (quoted keys: a ',' in a flow mapping's key would split it)."""
    flow = ", ".join(f'"{k}": {v}' for k, v in layout.placement().items())
    section, key, value = _depth(layout)
    return [f"cluster.component_placement={{{flow}}}", f"{section}.{key}={value}"]


def write_overlay(layout: Layout, path: Path, header: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {header}\n" + yaml.safe_dump(overlay(layout), sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m rlinf_mini.autotune", description=__doc__.splitlines()[0],
                                     add_help=False)
    parser.add_argument("--out", default=None)
    parser.add_argument("--max-stages", type=int, default=4)
    parser.add_argument("--memory-gb", type=float, default=None)
    parser.add_argument("--reps", type=int, default=16)
    parser.add_argument("--no-progress-bar", action="store_true")
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    args, rest = parser.parse_known_args(argv)
    for flag, value in (("--max-stages", args.max_stages), ("--reps", args.reps)):
        if value < 1:
            print(f"error: command line: {flag}: must be >= 1, got {value}", file=sys.stderr)
            return 2
    source = config_source(rest)
    try:
        cfg = load_config(rest)
        result = autotune(cfg, source, args.max_stages, int(args.memory_gb * 2**30) if args.memory_gb else None,
                          args.reps, progress=not args.no_progress_bar)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PlacementError as e:
        print(f"error: {source}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(table(result))
    best = result.best
    out = Path(args.out) if args.out else (Path(cfg.runner.logger.log_path) / "autotune"
                                           / f"{Path(source.split(' + ')[0]).stem}.yaml")
    write_overlay(best.layout, out, f"python -m rlinf_mini.autotune for {source}: predicted step "
                                    f"{best.prediction.step_s:.4f} s, bubble {best.prediction.bubble:.0%}")
    print(f"\npick: {best.layout.describe()}, {best.layout.stages} stage(s): predicted {best.prediction.step_s:.4f} s "
          f"per step" + ("" if result.current.refusal or result.current.prediction is None else
                         f" (your config: {result.current.prediction.step_s:.4f} s)"))
    print(f"wrote {out}; train with it:\n  python -m rlinf_mini.train --config {source.split(' + ')[0]} --config {out}")
    print("or with key=value's:\n  " + " ".join(f"'{o}'" for o in overrides(best.layout)))
    return 0


if __name__ == "__main__":  # the guard matters: the calibration's workers are spawned processes
    sys.exit(main())
