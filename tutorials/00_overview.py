# %% [markdown]
# # 00 — Overview: one RL step on one page
#
# Run it: `python tutorials/00_overview.py` (15–30 s on a 2-core CPU, most of it starting worker processes), or
# open it as a notebook (`jupytext --to notebook tutorials/00_overview.py`, or open the .py file in Jupyter with
# jupytext installed).
# Every sentence below that states a fact is checked by an `assert` in the cell after it.
#
# ## What this stage does, and why RLinf has it
#
# RLinf trains a policy with reinforcement learning by splitting the work into **components** — the *env*
# (simulators), the *rollout* (the policy doing inference) and the *actor* (the policy being trained) — each a
# **worker group** of processes placed on devices. The same program runs collocated (all on the same GPUs, taking
# turns), disaggregated (each on its own GPUs, overlapping) or hybrid. One training step is four calls made by a
# runner that carries no data itself:
#
# | phase (RLinf's timer name) | what happens | stage file | tutorial |
# |---|---|---|---|
# | (once, at start) | `component_placement` → devices of every rank | `stages/placement.py` | 01 |
# | `sync_weights` | actor rank 0 → every rollout rank, versioned | `stages/sync.py` | 02 |
# | `generate_rollouts` | env ∥ rollout over two queues, pipelined; trajectories → actor | `stages/rollout.py` | 03 |
# | `cal_adv_and_returns` | GAE / GRPO / Reinforce++ on the actor | `stages/advantages.py` | 04 |
# | `actor_training` | PPO update: global batch → micro-batches → optimizer step | `stages/train.py` | 05 |
#
# The tutorials, in the order of one step: **00** overview (this one), **01** placement, **02** weight sync,
# **03** the rollout pipeline, **04** advantages, **05** training, **06** the full run (config → cluster → groups →
# runner, checkpoint, resume, eval, metrics). Each imports the code it explains; none copies it.

# %%
from workbench import OUT, ROOT, check_exercise, matches

STAGE_FILES = ["placement", "sync", "rollout", "advantages", "train"]
TUTORIALS = ["00_overview", "01_placement", "02_weight_sync", "03_rollout_pipeline", "04_advantages",
             "05_training", "06_full_run"]
print("\n".join(f"tutorials/{name}.py" for name in TUTORIALS))

# %% [markdown]
# ## The code to read
#
# - `rlinf_mini/train.py`: `main` → `RunPlan` (placement and batch checks, before any process starts) → `launch`
#   (three `create_group(cfg).launch(cluster, placement_strategy=...)` calls) → `build_and_run`.
# - `rlinf_mini/runner.py`: `EmbodiedRunner.run` — the four phases above, with RLinf's timer names.
# - The five stage files, each with a docstring that says what it does, its shapes, its RLinf counterpart and
#   (all but the last) which stage comes next. Each stays short enough to read in one sitting (under 350 lines):

# %%
import importlib
import pathlib

for name in STAGE_FILES:
    module = importlib.import_module(f"stages.{name}")
    n_lines = len(pathlib.Path(module.__file__).read_text().splitlines())
    print(f"stages/{name}.py: {n_lines} lines")
    assert n_lines < 350, name
    assert "RLinf counterpart" in module.__doc__, name
    assert name == "train" or "Next stage" in module.__doc__, name

# %% [markdown]
# The code stands on three floors, and each imports only from the floors below it:
#
# 1. `rlinf_mini/scheduler/` — the runtime (RLinf: `rlinf/scheduler/`): `Cluster`, `Worker` / `WorkerGroup`,
#    `Channel`, the placement data types, shared memory, the message codec, faults, the tracer, and one module per
#    backend (`local`, `inline`, `ray`). It knows nothing about RL: it imports only itself and `config.py`.
#    Beside it, `config.py`, `utils/` (seeding, tensor trees, metric logger, learning curve), `envs/` and `models/`
#    import no stage and no runner either.
# 2. `stages/` — the five stages; they use the scheduler, envs and models, never a runner or the entry.
# 3. the composition modules — `train.py`, `runner.py`, `explain.py` — put the two together.
#
# This is what keeps a stage readable on its own, and the runtime replaceable under it.

# %%
import ast


def imports_of(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return found | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("rlinf_mini", "stages")}


COMPOSITION = ("rlinf_mini.train", "rlinf_mini.runner", "rlinf_mini.explain")
for path in sorted((ROOT / "rlinf_mini" / "scheduler").rglob("*.py")):
    bad = {m for m in ours(imports_of(path)) if not m.startswith("rlinf_mini.scheduler") and m != "rlinf_mini.config"}
    assert not bad, (path, bad)
for path in sorted((ROOT / "rlinf_mini").rglob("*.py")):
    if path.stem in ("train", "runner", "explain") and path.parent.name == "rlinf_mini":
        continue
    bad = {m for m in ours(imports_of(path)) if m.startswith("stages") or m.startswith(COMPOSITION)}
    assert not bad, (path, bad)
for path in sorted((ROOT / "stages").glob("*.py")):
    bad = {m for m in ours(imports_of(path)) if m.startswith(COMPOSITION)}
    assert not bad, (path, bad)
print("scheduler <- stages <- runner/entry: no module imports upward")

# %% [markdown]
# ## Run it
#
# Two training steps of the MLP run, shrunk to 16 envs × 8 steps, with command-line overrides on top of the YAML
# (the same flags work on `python -m rlinf_mini.train`). `RunPlan` checks everything before a process starts;
# `build_and_run` starts the worker processes, trains, and stops them all.

# %%
from rlinf_mini.config import load_config
from rlinf_mini.train import RunPlan, build_and_run

argv = ["--config", str(ROOT / "configs/embodied_mlp.yaml"),
        "--runner.max-epochs", "2", "--runner.val-check-interval", "-1", "--runner.save-interval", "-1",
        "--runner.no-progress-bar", "--runner.logger.logger-backends",  # (nothing after it: no TensorBoard)
        "--runner.logger.log-path", str(OUT / "runs"), "--runner.logger.experiment-name", "00_overview",
        "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch", "8",
        "--actor.global-batch-size", "64", "--actor.micro-batch-size", "32"]
cfg = load_config(argv)
plan = RunPlan(cfg, "00_overview")
history = build_and_run(cfg, plan)
for h in history:
    print({k: round(v, 4) for k, v in h.items() if k.startswith("time/") or k in ("step", "env/steps")})

# %% [markdown]
# ## What you should see
#
# One line per step. Each step logged the four phases under RLinf's timer names, and they account for the step's
# time (on a 2-core CPU a step of this size takes about 0.1–0.3 s, most of it in `generate_rollouts`; starting
# the worker processes takes longer than the two steps). `env/steps` counts
# total_num_envs × max_steps_per_rollout_epoch × rollout_epoch = 16 × 8 × 1 = 128 env steps per training step.

# %%
PHASES = ["sync_weights", "generate_rollouts", "cal_adv_and_returns", "actor_training"]
assert [h["step"] for h in history] == [1, 2]
for h in history:
    assert all(f"time/{p}" in h for p in PHASES)
    assert sum(h[f"time/{p}"] for p in PHASES) <= h["time/step"] + 1e-6
assert [h["env/steps"] for h in history] == [128.0, 256.0]

# %% [markdown]
# ## The RLinf counterpart
#
# rlinf_mini → RLinf (`github.com/RLinf/RLinf`, v0.4):
#
# - `rlinf_mini/train.py` → `examples/embodiment/train_embodied_agent.py`
# - `rlinf_mini/runner.py::EmbodiedRunner` → `rlinf/runners/embodied_runner.py::EmbodiedRunner`
# - `stages/placement.py` → `rlinf/scheduler/placement/placement.py::ComponentPlacement`,
#   `rlinf/utils/placement.py::HybridComponentPlacement`
# - `stages/sync.py` → `EmbodiedRunner.update_rollout_weights`, `rlinf/hybrid_engines/weight_syncer/`
# - `stages/rollout.py` → `rlinf/workers/env/env_worker.py::EnvWorker`,
#   `rlinf/workers/rollout/hf/huggingface_worker.py::MultiStepRolloutWorker`
# - `stages/advantages.py` → `rlinf/algorithms/advantages.py`, `rlinf/algorithms/registry.py::calculate_adv_and_returns`
# - `stages/train.py` → `rlinf/workers/actor/embodied_fsdp_actor_worker.py::EmbodiedFSDPActor`,
#   `rlinf/algorithms/losses.py`
# - `rlinf_mini/scheduler/cluster.py`, `worker.py`, `channel.py` → `rlinf/scheduler/cluster/cluster.py::Cluster`,
#   `rlinf/scheduler/worker/worker.py::Worker`, `worker_group.py::WorkerGroup`,
#   `rlinf/scheduler/channel/channel.py::Channel`
#
# Each stage file names its counterpart in its own docstring; the table and the docstrings agree:

# %%
COUNTERPART = {"placement": "ComponentPlacement", "sync": "update_rollout_weights", "rollout": "EnvWorker",
               "advantages": "rlinf/algorithms/advantages.py", "train": "EmbodiedFSDPActor"}
for name, symbol in COUNTERPART.items():
    assert symbol in importlib.import_module(f"stages.{name}").__doc__, name

# %% [markdown]
# ## Exercise
#
# How many env steps does one training step take? Write it from the config in `env_steps_per_training_step`
# below (look at `cfg.env.train`), replacing the body. As shipped the body calls the reference answer, the number
# the run above measured, so this cell passes; with your own body it tells you whether you got it right.

# %%
def measured_env_steps(cfg) -> int:
    """The reference: what the run above logged per training step (its cfg is the only one it can answer)."""
    assert cfg is plan.cfg
    return int(history[1]["env/steps"] - history[0]["env/steps"])


def env_steps_per_training_step(cfg) -> int:
    # EXERCISE: replace the line below with a formula in cfg.env.train's fields.
    return measured_env_steps(cfg)


check_exercise(env_steps_per_training_step, measured_env_steps, [(cfg,)])
assert not matches(lambda c: c.env.train.total_num_envs, measured_env_steps, [(cfg,)])  # a wrong answer fails
