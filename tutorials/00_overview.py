# %% [markdown]
# # 00 — Overview: one RL step on one page
#
# Run it: `python tutorials/00_overview.py` (about 8 s on a 2-core CPU: README's tutorial table, which the tests
# check), or open it as a notebook (`jupytext --to notebook tutorials/00_overview.py`, or open the .py file in
# Jupyter with jupytext installed). Every sentence below that states a fact is checked by an `assert` in the cell
# after it. The words these tutorials use (env step, chunk step, rollout_epoch, staleness, ...) are defined one line
# each in [the glossary](glossary.md).

# %% [markdown]
# ## One step as pseudocode
#
# The step this tutorial and the next five take apart, as pseudocode: one block per phase of
# `EmbodiedRunner.train_step`, in the names the code uses (`||`: the calls run at the same time). README's
# "One step as pseudocode" holds the same box, and `tests/test_docs.py` checks every name in it against the code.
#
# ```text
# EmbodiedRunner.run(): for global_step in range(runner.max_epochs): train_step()    # rlinf_mini/runners/embodied.py
#
# 1 sync_weights         update_rollout_weights()              (stage 2; every runner.weight_sync_interval steps)
#     actor.sync_model_to_rollout(weight_handles, version) || rollout.sync_model_from_actor(version)
#     # actor rank 0 writes its weights into each rollout rank's shared buffer, stamped version = global_step
#
# 2 generate_rollouts    generate_rollouts()                                                               (stage 3)
#     env.interact(...) || rollout.generate(...) || actor.recv_rollout_trajectories(actor_channel)
#     # env.train.total_num_envs envs in rollout.pipeline_stage_num stages; for each of the
#     # env.train.max_steps_per_rollout_epoch / C chunk steps (C = actor.model.num_action_chunks), stage by stage:
#     #   rollout: policy.predict_action_batch(obs, noise) -> actions [B, C, A], logprobs, values, version
#     #   env:     sub_envs.chunk_step(actions) -> next obs, rewards [B, C], dones      (while the rollout infers k+1)
#     # then trajectories [T, B, ...] -> the actor, over its channel
#
# 3 cal_adv_and_returns  actor.compute_advantages_and_returns()                                            (stage 4)
#     calculate_adv_and_returns(): compute_gae_advantages_and_returns(rewards, values, dones)
#         # GAE with algorithm.gamma and algorithm.gae_lambda: advantages [T, B], returns [T, B]
#     advantages = safe_normalize(advantages)   # if algorithm.normalize_advantages; statistics over all actor ranks
#
# 4 actor_training       actor.run_training()                                                              (stage 5)
#     update_policy(): for each of algorithm.update_epoch epochs, for each actor.global_batch_size batch:
#         for each actor.micro_batch_size micro-batch, compute_micro_batch_loss():
#             logprobs, entropy, values = policy.default_forward(obs, actions)
#             loss = compute_ppo_actor_loss(logprobs, old_logprobs, advantages, ...)  # algorithm.clip_ratio_low/high
#                    - algorithm.entropy_bonus * entropy
#                    + algorithm.value_loss_coef * compute_ppo_critic_loss(values, old_values, returns, ...)
#             backward, accumulated over the micro-batches
#         all-reduce the gradients over the actor ranks, clip to actor.optim.clip_grad, one step of actor.optim.lr
#
# then every runner.val_check_interval steps evaluate(), every runner.save_interval steps save_checkpoint()
# ```

# %% [markdown]
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
# runner, checkpoint, resume, eval, metrics), **07** the same step for a reasoning LLM (GRPO with a verifier's
# reward), **08** bringing your own environment (the env contract, MetaWorld as the example), and **09**
# asynchronous PPO (env and rollout run ahead of the actor, within a staleness bound). Each imports the
# code it explains; none copies it.

# %%
from workbench import OUT, ROOT

STAGE_FILES = ["placement", "sync", "rollout", "advantages", "train"]
TUTORIALS = ["00_overview", "01_placement", "02_weight_sync", "03_rollout_pipeline", "04_advantages",
             "05_training", "06_full_run", "07_reasoning", "08_your_own_env", "09_async_ppo"]
print("\n".join(f"tutorials/{name}.py" for name in TUTORIALS))
assert sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]_*.py")) == TUTORIALS

# %% [markdown]
# ## The code to read
#
# - `rlinf_mini/train.py`: `main` → `RunPlan` (placement and batch checks, before any process starts) → `launch`
#   (three `create_group(cfg).launch(cluster, placement_strategy=...)` calls) → `build_and_run`.
# - `rlinf_mini/runners/embodied.py`: `EmbodiedRunner.train_step` — the four phases above, with RLinf's timer names;
#   `rlinf_mini/runners/base.py`: `run`, the step loop both halves share (eval cadence, checkpoints, metrics, trace).
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

import inspect

from rlinf_mini.runners.embodied import EmbodiedRunner
from rlinf_mini.train import launch

assert inspect.getsource(launch).count("create_group(cfg).launch(") == 3
assert all(f'self.timer("{p}")' in inspect.getsource(EmbodiedRunner.train_step)
           for p in ["sync_weights", "generate_rollouts", "cal_adv_and_returns", "actor_training"])

# %% [markdown]
# The code stands on three floors, and each imports only from the floors below it:
#
# 1. `rlinf_mini/scheduler/` — the runtime (RLinf: `rlinf/scheduler/`): `Cluster`, `Worker` / `WorkerGroup`,
#    `Channel`, the placement data types, shared memory, the message codec, faults, the tracer, and one module per
#    backend (`local`, `inline`, `ray`). It knows nothing about RL: it imports only itself and `config/`.
#    Beside it, `config/` (which imports only itself), `utils/` (seeding, tensor trees, metric logger, learning
#    curve), `envs/` and `models/` import no stage and no runner either.
# 2. `stages/` — the five stages; they use the scheduler, envs and models, never a runner or the entry.
# 3. the composition modules — `train.py`, `runners/`, `explain.py`, `autotune/` — put the two together.
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


COMPOSITION = ("rlinf_mini.train", "rlinf_mini.runners", "rlinf_mini.explain", "rlinf_mini.autotune")
for path in sorted((ROOT / "rlinf_mini" / "scheduler").rglob("*.py")):
    bad = {m for m in ours(imports_of(path)) if not m.startswith(("rlinf_mini.scheduler", "rlinf_mini.config"))}
    assert not bad, (path, bad)
for path in sorted((ROOT / "rlinf_mini" / "config").glob("*.py")):  # the schema, the loader, the checks
    bad = {m for m in ours(imports_of(path)) if not m.startswith("rlinf_mini.config")}
    assert not bad, (path, bad)
for path in sorted((ROOT / "rlinf_mini").rglob("*.py")):
    if path.parent.name in ("runners", "autotune") or (path.stem in ("train", "explain")
                                                       and path.parent.name == "rlinf_mini"):
        continue
    bad = {m for m in ours(imports_of(path)) if m.startswith("stages") or m.startswith(COMPOSITION)}
    assert not bad, (path, bad)
for path in sorted((ROOT / "stages").glob("*.py")):
    bad = {m for m in ours(imports_of(path)) if m.startswith(COMPOSITION)}
    assert not bad, (path, bad)
print("scheduler <- stages <- runner/entry: no module imports upward")

# Inside the stages floor, no cycle and no reach into a sibling's private names: a piece two stages share lives in
# the module of its role (the weight buffer's layout in `stages/weight_buffer.py`, the env -> actor split in
# `stages/placement.py`, the update loop in `stages/actor_core.py`), and every import sits at the top of its file.
stage_imports = {f"stages.{p.stem}": ours(imports_of(p)) for p in sorted((ROOT / "stages").glob("*.py"))}


def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
    return any(m == goal or (m not in seen and reaches(m, goal, seen | {m})) for m in stage_imports.get(start, ()))


assert not [m for m in stage_imports if reaches(m, m)], "a cycle among the stage modules"
for path in sorted((ROOT / "stages").glob("*.py")):
    tree = ast.parse(path.read_text())
    private = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
               and n.module.startswith("stages") for a in n.names if a.name.startswith("_")]
    assert not private, (path.name, private)
    nested = [n.module for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)
              if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("stages")]
    assert not nested, (path.name, "a function-local import of a stage (a cycle dodged)", nested)
print("stages: no cycle, no private name of a sibling, no function-local stage import")

# %% [markdown]
# ## Run it
#
# Three training steps of the MLP run (`runner.max_epochs` is RLinf's name for the number of training steps), shrunk
# to 16 envs × 8 env steps, with command-line overrides on top of the YAML (the same flags work on
# `python -m rlinf_mini.train`). `RunPlan` checks everything before a process starts; `build_and_run` starts the
# worker processes, trains, and stops them all.

# %%
import shutil
import time

from rlinf_mini.config import load_config
from rlinf_mini.train import RunPlan, build_and_run

shutil.rmtree(OUT / "runs" / "00_overview", ignore_errors=True)  # a run folder holds one run: start afresh
argv = ["--config", str(ROOT / "configs/embodied_mlp.yaml"),
        "--runner.max-epochs", "3", "--runner.val-check-interval", "-1", "--runner.save-interval", "-1",
        "--runner.no-progress-bar", "--runner.logger.logger-backends",  # (nothing after it: no TensorBoard)
        "--runner.logger.log-path", str(OUT / "runs"), "--runner.logger.experiment-name", "00_overview",
        "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch", "8",
        "--actor.global-batch-size", "64", "--actor.micro-batch-size", "32"]
cfg = load_config(argv)
plan = RunPlan(cfg, "00_overview")
start = time.perf_counter()
history = build_and_run(cfg, plan)
wall = time.perf_counter() - start
PHASES = ["sync_weights", "generate_rollouts", "cal_adv_and_returns", "actor_training"]
GROUPS = ["ActorGroup", "EnvGroup", "RolloutGroup"]
for h in history:
    print({"step": h["step"], "env/steps": h["env/steps"], "time/step": round(h["time/step"], 4)}
          | {p: f"{h[f'time/{p}'] / h['time/step']:.0%}" for p in PHASES}
          | {f"busy/{g}": f"{h[f'time/trace/busy/{g}']:.0%}" for g in GROUPS})
steps_s = sum(h["time/step"] for h in history)
print(f"build_and_run took {wall:.1f} s, of which the {len(history)} steps {steps_s:.2f} s")

# %% [markdown]
# ## What you should see
#
# - One line per step, `runner.max_epochs` = 3 of them. Each step logged the four phases under RLinf's timer names,
#   and together they make up nearly all of the step's time (at least 3/4 of it; the rest is one call telling the
#   actor the step number).
# - Most of a step goes to two phases, `generate_rollouts` and `actor_training` (together more than half of every
#   step after the first, which also pays one-time costs such as the first backward pass). Which of the two is
#   longer depends on how busy the machine is: the rollout is ~40 small messages between the env, rollout and actor
#   processes, and waiting for a busy CPU to wake a process up slows it most.
# - **The actor does most of the work, not the rollout.** The tracer (`time/trace/busy/*`: the share of the step a
#   worker spent working rather than waiting) shows the actor busy for a larger share of the step than the env and
#   the rollout together: the MLP and the fake env are tiny, so 16 envs × 8 env steps are cheap, while
#   the actor makes `algorithm.update_epoch` = 4 passes over the step's 128 samples in global batches of 64: 8
#   optimizer steps on micro batches, each followed, with 2 actor ranks, by a gradient all-reduce between the two
#   processes. (With a real simulator and a VLA the rollout's work usually dominates: 03 emulates that with
#   latencies.)
# - Starting and stopping the worker processes takes most of `build_and_run`'s time: the three steps take less than
#   a fifth of it.
# - `env/steps` counts env steps: one env step is one action executed by one sub-env. It grows by the same amount
#   every training step (128 here); how that number is made from `cfg.env.train` is the exercise below.

# %%
assert [h["step"] for h in history] == [1, 2, 3] and cfg.runner.max_epochs == 3
for h in history:
    phases = sum(h[f"time/{p}"] for p in PHASES)
    assert 0.75 * h["time/step"] <= phases <= h["time/step"] + 1e-6, h
for h in history[1:]:
    assert h["time/generate_rollouts"] + h["time/actor_training"] > 0.5 * h["time/step"], h
    assert h["time/trace/busy/ActorGroup"] > h["time/trace/busy/EnvGroup"] + h["time/trace/busy/RolloutGroup"], h
assert cfg.algorithm.update_epoch == 4 and cfg.actor.global_batch_size == 64 and plan.world_sizes["actor"] == 2
assert steps_s < wall / 5
per_step = history[0]["env/steps"]
assert per_step == 128 and [h["env/steps"] for h in history] == [per_step, 2 * per_step, 3 * per_step]

# %% [markdown]
# ## The RLinf counterpart
#
# rlinf_mini → RLinf (`github.com/RLinf/RLinf`, v0.4):
#
# - `rlinf_mini/train.py` → `examples/embodiment/train_embodied_agent.py`
# - `rlinf_mini/runners/embodied.py::EmbodiedRunner` → `rlinf/runners/embodied_runner.py::EmbodiedRunner`
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
# How many env steps does one training step take? Write `my_env_steps(total_num_envs, max_steps_per_rollout_epoch,
# rollout_epoch)` below, replacing the body (the glossary says what each of the three means). As shipped the body
# calls the reference, `rlinf_mini.runners.embodied.env_steps_per_training_step`, the function that logs
# `env/steps`, so this cell passes; with your own body it tells you whether you got it right on every case, and if
# not, which case.

# %%
import dataclasses

from workbench import check_exercise, matches

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.runners.embodied import env_steps_per_training_step


def reference_env_steps(total_num_envs: int, max_steps_per_rollout_epoch: int, rollout_epoch: int) -> int:
    train = dataclasses.replace(EnvSplitConfig(), total_num_envs=total_num_envs, rollout_epoch=rollout_epoch,
                                max_steps_per_rollout_epoch=max_steps_per_rollout_epoch)
    return env_steps_per_training_step(train)


def my_env_steps(total_num_envs: int, max_steps_per_rollout_epoch: int, rollout_epoch: int) -> int:
    # EXERCISE: replace the line below with a formula in the three numbers.
    return reference_env_steps(total_num_envs, max_steps_per_rollout_epoch, rollout_epoch)


CASES = {"the run above": (16, 8, 1), "2 rollout epochs": (16, 8, 2), "the MLP config": (32, 32, 1),
         "3 rollout epochs of 4 envs": (4, 12, 3)}
check_exercise(my_env_steps, reference_env_steps, CASES)
assert "history" not in globals() or reference_env_steps(16, 8, 1) == history[0]["env/steps"]  # what the run logged
assert not matches(lambda n, steps, epochs: n * steps, reference_env_steps, CASES)  # forgets rollout_epoch: fails
