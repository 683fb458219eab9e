# %% [markdown]
# # 08 — Bring your own environment: the env contract, with MetaWorld as the worked example
#
# Run it: `python tutorials/08_your_own_env.py` (envs built in this process, no workers; its time on 2 cores is in
# README's tutorial table, which the tests check). With the `metaworld` extra (`pip install -e ".[metaworld]"`) the
# worked example is MetaWorld's reach-v3; without it the same cells run on the fake reach env, and the MetaWorld-only
# cells say so. Every stated fact is an `assert` in the cell after it. Words in doubt: the [glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# The env worker (stage 3, `stages/rollout.py::EnvWorker`) never calls a simulator itself: it steps a **vector env**,
# one object for a block of B sub-envs, through five calls. Anything that meets them trains with the same PPO, GRPO,
# pipeline, weight sync and checkpoints, whatever it simulates. RLinf has the same seam: `rlinf/envs/__init__.py::
# get_env_cls` picks a wrapper per `env_type` (ManiSkill, LIBERO, MetaWorld, ...), and each wrapper turns its
# simulator into `chunk_step`s. The contract (`rlinf_mini/envs/__init__.py`):
#
# - `reset() -> obs`: a new episode in every sub-env; obs [B, obs_dim] (or a dict with `images`, `task_descriptions`).
# - `chunk_step(actions [B, C, A]) -> obs, rewards [B, C], terminations [B, C], truncations [B, C], episode_stats`:
#   C actions executed open loop (an **action chunk**: one policy call, C env steps).
# - inside a chunk, once a sub-env's episode ended, its later rewards and dones read 0 / False (they belong to no
#   episode the trajectory records); with `auto_reset` the sub-env restarts at once and the returned obs is the new
#   episode's.
# - `final_obs`: the observation an auto-reset episode ended on, for the value that bootstraps a truncation.
# - `get_state()` / `set_state()` (resume) and `close()`.
#
# ## The code to read
#
# - `rlinf_mini/envs/__init__.py`: the contract and `make_env` (one branch per `env_type`).
# - `rlinf_mini/envs/base.py`: `EnvSpec`, `TorchChunkEnv` (the chunk rules, written once for tensor envs) and
#   `final_obs_batch`.
# - `rlinf_mini/envs/metaworld.py`: `MetaWorldVectorEnv`, the worked example: B gymnasium envs of one task, seeded
#   per sub-env id, MetaWorld's `info["success"]` as success, `success_once` / `success_at_end` as RLinf logs them.
# - `stages/rollout.py::EnvWorker._run_epoch`: where chunk_step's outputs become the trajectory (rewards summed over
#   the chunk, `dones = terminations | truncations`) and `final_obs` goes to the rollout.

# %%
import dataclasses
import importlib.util

import torch
from workbench import ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.envs import make_env
from rlinf_mini.envs.base import final_obs_batch

HAVE_METAWORLD = importlib.util.find_spec("metaworld") is not None
CONFIG = "configs/metaworld_reach.yaml" if HAVE_METAWORLD else "configs/embodied_mlp.yaml"
base = load_config(["--config", str(ROOT / CONFIG)]).env.train
print(f"worked example: {CONFIG} ({base.env_type}{', ' + base.task_suite_name if HAVE_METAWORLD else ''})")


def split(**changes):
    """The config's env.train section with a few keys changed (what a YAML override would do)."""
    return dataclasses.replace(base, **changes)


# %% [markdown]
# ## Run it (1): reset, one chunk, the shapes
#
# Four sub-envs with global ids 0-3, chunks of C = 3 actions, zero actions. MetaWorld's state is 39 numbers (hand,
# gripper, object and goal poses); its action is 4 (hand motion and gripper).

# %%
C = 3
env = make_env(split(max_episode_steps=5), torch.arange(4), C)
obs = env.reset()
A = env.spec.action_dim
obs2, rewards, terms, truncs, stats = env.chunk_step(torch.zeros(4, C, A))
print(f"obs {list(obs.shape)}, actions [4, {C}, {A}], rewards {list(rewards.shape)}, episode_stats {sorted(stats)}")

# %% [markdown]
# ## What you should see (1)
#
# obs [4, obs_dim]; rewards, terminations and truncations [4, 3]: one per env step of the chunk; no episode ended
# yet (5 steps), so every `episode_stats` entry is empty.

# %%
assert obs.shape == obs2.shape == (4, env.spec.obs_dim) and rewards.shape == terms.shape == truncs.shape == (4, C)
assert not (terms | truncs).any() and all(len(v) == 0 for v in stats.values())

# %% [markdown]
# ## Run it (2): an episode ends inside a chunk
#
# With 5-step episodes and chunks of 3, the second chunk holds steps 4-6: the time limit cuts the episode after its
# 2nd env step. A twin env without `auto_reset` steps the same actions and keeps showing the episode's last
# observation: the reference for what `final_obs` must hold.

# %%
twin = make_env(split(max_episode_steps=5, auto_reset=False), torch.arange(4), C)
twin.reset()
twin.chunk_step(torch.zeros(4, C, A))
env.final_obs_of = "truncations"  # what the env worker sets for algorithm.bootstrap_type: standard
obs3, rewards, terms, truncs, stats = env.chunk_step(torch.zeros(4, C, A))
twin_obs, *_ = twin.chunk_step(torch.zeros(4, C, A))
ended, final = env.final_obs
print("truncations per env step:", truncs[0].tolist(), "| rewards of sub-env 0:", rewards[0].tolist())
print("episode_stats:", {k: v.tolist() for k, v in stats.items()})

# %% [markdown]
# ## What you should see (2)
#
# Each row's truncation sits on the chunk's 2nd step, and its 3rd reward reads 0: that step already belongs to the
# next episode (auto-reset), which the trajectory does not credit to this action. `episode_stats` has one entry per
# ended episode (length 5). `final_obs` marks the 4 rows and holds the twin's observation, the one the episode ended
# on, while the returned obs is the new episode's first (it differs). The env worker sends `final_obs` to the
# rollout, whose value of it becomes `gamma * V(final obs)` on the truncated step's reward: a time limit is not a
# terminal state (stages/rollout.py; tutorial 03 checks it on a trajectory).

# %%
assert truncs[:, 1].all() and not truncs[:, [0, 2]].any() and not terms.any()
assert (rewards[:, 2] == 0).all()
assert stats["episode_len"].tolist() == [5.0] * 4
assert ended.all() and torch.equal(final, twin_obs) and not torch.equal(obs3, twin_obs)
env.close()
twin.close()

# %% [markdown]
# ## Run it (3): reset states for GRPO groups
#
# GRPO compares the returns of G sub-envs that started from the same state. `group_size: 2` makes sub-envs 2k and
# 2k+1 share their reset states (`seed + env_id // group_size`; MetaWorld: the goal layout), and
# `use_fixed_reset_state_ids` repeats them at every reset (the eval split's held-out layouts).

# %%
grouped = make_env(split(group_size=2), torch.arange(4), 1)
first = grouped.reset()
grouped.close()

# %% [markdown]
# ## What you should see (3)
#
# Sub-envs 0 and 1 start identically, and so do 2 and 3; the two groups differ.

# %%
assert torch.equal(first[0], first[1]) and torch.equal(first[2], first[3]) and not torch.equal(first[0], first[2])

# %% [markdown]
# ## Run it (4): what success means and how it is logged
#
# A scripted controller drives the hand to the goal: MetaWorld ships one per task (`metaworld.policies`); for the
# fake env, a step towards the goal. MetaWorld's success is its own `info["success"]` (reach: the hand within 5 cm of
# the goal). With `ignore_terminations` (the MetaWorld configs' setting: the shaped reward keeps paying at the goal)
# success does not end the episode, so an episode records both `success_once` (at any step) and `success_at_end`
# (on its last step), as RLinf logs them; the env worker averages them into `env/success_once` and the eval's
# `eval/success_once`.

# %%
if HAVE_METAWORLD:
    import warnings

    import numpy as np
    from metaworld.policies import SawyerReachV3Policy

    scripted = SawyerReachV3Policy()
    warnings.filterwarnings("ignore", message="Constant")  # its gains exceed 1; the env clips actions to [-1, 1]

    def controller(obs: torch.Tensor) -> torch.Tensor:  # [B, 39] -> [B, 1, 4]: one chunk of one action
        return torch.from_numpy(np.stack([scripted.get_action(o.numpy()) for o in obs]).astype(np.float32))[:, None]
else:
    def controller(obs: torch.Tensor) -> torch.Tensor:  # obs = [position, goal]: move towards the goal
        d = obs.shape[1] // 2
        return ((obs[:, d:] - obs[:, :d]) / 0.2).clamp(-1, 1)[:, None]

STEPS = 100
# one episode per sub-env: no auto-reset, so a finished sub-env stays finished until the next reset()
episodes = make_env(split(max_episode_steps=STEPS, ignore_terminations=True, auto_reset=False), torch.arange(4), 1)
obs = episodes.reset()
logged: dict[str, list[float]] = {}
for _ in range(STEPS):
    obs, rewards, terms, truncs, stats = episodes.chunk_step(controller(obs))
    for name, values in stats.items():
        logged.setdefault(name, []).extend(values.tolist())
episodes.close()
print({name: values for name, values in logged.items()})

# %% [markdown]
# ## What you should see (4)
#
# Four episodes, one per sub-env, and the controller succeeded in every one. On MetaWorld all four ran to the time
# limit (100 steps: success did not end them) and `success_at_end` is logged beside `success_once`; the fake env
# always ends an episode on success, so its episodes are shorter and it logs `success_once` only.

# %%
assert len(logged["episode_len"]) == 4 and logged["success_once"] == [1.0] * 4
if HAVE_METAWORLD:
    assert logged["episode_len"] == [float(STEPS)] * 4 and len(logged["success_at_end"]) == 4
else:
    assert max(logged["episode_len"]) < STEPS and "success_at_end" not in logged
    print("MetaWorld is not installed: pip install -e '.[metaworld]' shows success_at_end and the 100-step episodes")

# %% [markdown]
# ## The RLinf counterpart
#
# RLinf's `rlinf/envs/metaworld/metaworld_env.py::MetaWorldEnv` wraps the same gymnasium envs (its `chunk_step`,
# `_calc_step_reward` with `use_rel_reward` and `reward_coef`, `RESET_STEP` settling steps), and
# `rlinf/envs/__init__.py::get_env_cls` chooses it by `env_type`; `EnvWorker.compute_bootstrap_rewards` adds
# `gamma * V(final obs)` on truncations. Differences here: a sub-env keeps its task (RLinf redraws a task per reset),
# sub-envs of a rank step in one process, and an episode that ends mid-chunk resets at once (RLinf finishes the
# chunk and resets after it). To add your own simulator: a class with these five calls in `rlinf_mini/envs/`, one
# branch in `make_env` and `get_env_spec`, and its keys in `EnvSplitConfig`.
#
# ## Exercise
#
# Implement `my_final_obs_batch(obs, finals)`: a new obs batch equal to `obs` except that row b is `finals[b]` (the
# final observation of the episode sub-env b just ended), for a tensor batch and for a dict batch with a list of
# strings (what the VLA envs return). Do not change `obs` itself.

# %%
def my_final_obs_batch(obs, finals):
    # EXERCISE: replace the line below with your own code.
    return final_obs_batch(obs, finals)


def obs_case(dict_obs: bool):
    g = torch.Generator().manual_seed(3)
    batch = torch.rand(4, 3, generator=g)
    finals = {1: torch.rand(3, generator=g), 3: torch.rand(3, generator=g)}
    if not dict_obs:
        return batch, finals
    words = ["go left", "go right", "stay", "jump"]
    return ({"states": batch, "task_descriptions": words},
            {b: {"states": f, "task_descriptions": f"ended {b}"} for b, f in finals.items()})


def as_tuple(fn):
    """fn's dict result as (states, task_descriptions), which check_exercise compares; and the input unchanged."""
    def wrapped(obs, finals):
        before = (obs["states"].clone(), list(obs["task_descriptions"]))
        out = fn(obs, finals)
        assert torch.equal(before[0], obs["states"]) and before[1] == obs["task_descriptions"], \
            f"{fn.__name__} changed its input"
        return out["states"], out["task_descriptions"]
    wrapped.__name__ = fn.__name__
    return wrapped


check_exercise(my_final_obs_batch, final_obs_batch, {"a tensor batch": obs_case(False)})
check_exercise(as_tuple(my_final_obs_batch), as_tuple(final_obs_batch), {"a dict batch with strings": obs_case(True)})


def in_place(obs, finals):  # a plausible wrong answer: writes the rows into the caller's batch
    for b, row in finals.items():
        obs["states"][b] = row["states"]
        obs["task_descriptions"][b] = row["task_descriptions"]
    return obs


try:
    as_tuple(in_place)(*obs_case(True))
    raise RuntimeError("in_place changed its input unnoticed")
except AssertionError as e:
    assert "changed its input" in str(e)
assert not matches(lambda o, f: o, final_obs_batch, {"the rows not replaced": obs_case(False)})
