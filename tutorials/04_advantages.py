# %% [markdown]
# # 04 — Advantages: from rewards (and values) to what the loss weighs each action by
#
# Run it: `python tutorials/04_advantages.py` (a couple of seconds; pure tensor functions, no processes). Every
# stated fact is an `assert` in the cell after it.
# Terms: [the glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# After the rollout, the actor holds for each env column b and chunk step t: `rewards [T, B]`, `dones [T, B]`
# (the episode ended at step t) and, with a value head, `values [T+1, B]` (the last row bootstraps the state after
# the final step). The advantage says how much better an action was than expected; PPO multiplies the probability
# ratio by it. RLinf keeps the estimators as pure functions chosen by `algorithm.adv_type`, so PPO with a critic
# (`gae`) and critic-free group methods (`grpo`, `reinpp`) share one actor:
#
# - **GAE**: δ_t = r_t + γ V_{t+1} (1 − d_t) − V_t, and A_t = Σ_k (γλ)^k δ_{t+k}, cut at episode ends.
#   The value head learns from `returns = advantages + values`.
# - **GRPO**: each env's first-episode return is its score; the G envs of a group started from the same state,
#   and a score is normalized by its group's mean and std. Every step of the episode gets that advantage.
# - **Reinforce++**: the score sits at the first episode's last step and is summed backwards (minus an optional
#   per-step KL penalty), then whitened over the first episodes' steps.
# - **Whitening** (`normalize_advantages`, `normalize_returns`): RLinf's `safe_normalize`, (x − mean) / (std + 1e-5)
#   with the unbiased std of the loss-masked entries, applied to every entry.
#
# ## The code to read
#
# - `stages/advantages.py`: `compute_gae_advantages_and_returns` (one backward loop, CleanRL-style),
#   `compute_grpo_advantages`, `compute_reinpp_advantages`, `first_episode_mask`, `safe_normalize`, and
#   `calculate_adv_and_returns` (picks the estimator by `cfg.adv_type`).
# - `stages/train.py::ActorWorker.compute_advantages_and_returns`: runs it on the actor rank's columns, passing its
#   all-reduce, so `safe_normalize` takes the mean and std of *all* ranks' samples and 1 or 2 actor ranks agree.

# %%
import dataclasses

import torch
from workbench import check_exercise, matches

from rlinf_mini.config import AlgorithmConfig
from stages.advantages import calculate_adv_and_returns, compute_gae_advantages_and_returns, compute_grpo_advantages

# %% [markdown]
# ## Run it
#
# A small batch: T = 6 chunk steps, B = 4 envs; env 1's episode ends at step 2 and env 3's at step 4 (with
# auto-reset, a new episode starts on the next row).

# %%
T, B, gamma = 6, 4, 0.9
gen = torch.Generator().manual_seed(0)
rewards = torch.rand(T, B, generator=gen)  # [T, B]
values = torch.rand(T + 1, B, generator=gen)  # [T+1, B]
dones = torch.zeros(T, B, dtype=torch.bool)  # [T, B]
dones[2, 1] = dones[4, 3] = True
adv_1, ret_1 = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=1.0)
adv_0, _ = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=0.0)
adv_95, ret_95 = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=0.95)
print("advantages, lambda=0.95 [T, B]:\n", adv_95)

# %% [markdown]
# ## What you should see
#
# **GAE with λ = 1 equals the discounted returns minus the values.** The discounted return, written directly:
# G_t = r_t + γ G_{t+1}, restarting at an episode end, and bootstrapped with V_T after the last step.

# %%
G = torch.zeros(T, B)
next_return = values[T]  # [B] bootstrap: the value of the state after the last step
for t in reversed(range(T)):
    next_return = rewards[t] + gamma * next_return * (~dones[t])
    G[t] = next_return
assert torch.allclose(adv_1, G - values[:T], atol=1e-6)

# %% [markdown]
# **With λ = 0 it is the one-step TD error** δ_t = r_t + γ V_{t+1} (1 − d_t) − V_t, and **returns are always
# advantages + values** (the value head's target).

# %%
delta = rewards + gamma * values[1:] * (~dones) - values[:T]
assert torch.allclose(adv_0, delta, atol=1e-6)
assert torch.allclose(ret_95, adv_95 + values[:T], atol=1e-6)

# %% [markdown]
# **Episodes do not leak into each other**: changing what happens after env 1's episode ended at step 2 leaves
# its advantages at steps 0..2 unchanged.

# %%
later = rewards.clone()
later[3:, 1] += 10.0
adv_later, _ = compute_gae_advantages_and_returns(later, values, dones, gamma, gae_lambda=0.95)
assert torch.equal(adv_later[:3, 1], adv_95[:3, 1]) and not torch.equal(adv_later[3:, 1], adv_95[3:, 1])

# %% [markdown]
# **GRPO** on groups of G = 2 envs (envs 0-1 and 2-3 share reset states). Each env's score is its first episode's
# summed reward; within a group the advantages are (score − mean) / (std + 1e-6), so each group's two advantages
# are ±1/√2 ≈ ±0.707 (the unbiased std of two numbers is |a − b| / √2). Steps after an env's first done are
# masked out of the loss and carry advantage 0.

# %%
grpo_adv, loss_mask = compute_grpo_advantages(rewards, dones, group_size=2)
print("GRPO advantages at step 0:", grpo_adv[0])
first = grpo_adv[0].view(2, 2)  # [groups, G]
assert torch.allclose(first.sum(dim=1), torch.zeros(2), atol=1e-5)
assert torch.allclose(first.abs(), torch.full((2, 2), 2**-0.5), atol=1e-4)
assert not loss_mask[3:, 1].any() and (grpo_adv[3:, 1] == 0).all() and loss_mask[:3, 1].all()

# %% [markdown]
# `calculate_adv_and_returns` is what the actor calls; with `normalize_advantages` (the default) GAE advantages
# come out with mean 0 and (unbiased) std 1, up to the 1e-5 that `safe_normalize` adds to the std.

# %%
cfg = dataclasses.replace(AlgorithmConfig(), gamma=gamma, gae_lambda=0.95)
out = calculate_adv_and_returns(cfg, rewards, values, dones)
assert abs(out["advantages"].mean()) < 1e-6 and abs(out["advantages"].std() - 1) < 1e-3
assert torch.allclose(out["returns"], ret_95)

# %% [markdown]
# **Without a value head GAE is critic-free**, as in RLinf: γ = λ = 1 and the advantage of a step is the reward
# still to come in its episode, whatever `gamma` and `gae_lambda` say.

# %%
free, _ = compute_gae_advantages_and_returns(rewards, None, dones, gamma, gae_lambda=0.95)
assert torch.allclose(free[0, 1], rewards[:3, 1].sum()) and torch.allclose(free[0, 0], rewards[:, 0].sum())

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/algorithms/advantages.py`: `compute_gae_advantages_and_returns`, `compute_grpo_advantages`,
#   `compute_reinpp_advantages` (registered with `@register_advantage`).
# - `rlinf/algorithms/registry.py::calculate_adv_and_returns`: reshapes embodied tensors
#   (`[n_chunk, B, chunk]` → `[n_steps, B]`, dones padded to T+1) and dispatches on `algorithm.adv_type`.
# - `rlinf/algorithms/utils.py`: `calculate_scores` (first-episode returns for GRPO), `safe_normalize`.
# - `rlinf/workers/actor/embodied_fsdp_actor_worker.py::EmbodiedFSDPActor.compute_advantages_and_returns`.
# - One layout difference: RLinf pads dones to [T+1, B] and reads dones[t+1] where we read dones[t].
#
# ## Exercise
#
# Implement GAE: `my_gae(rewards, values, dones, gamma, gae_lambda)` returning `(advantages, returns)`, both
# [T, B]. Replace the body with one loop backwards over t (the formulas are at the top). The cases include
# episode ends; a version that forgets them fails the check.

# %%
def my_gae(rewards, values, dones, gamma, gae_lambda):
    # EXERCISE: replace the line below with your own loop.
    return compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda)


def case(seed: int, T: int, B: int, gamma: float, lam: float):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, B, generator=g), torch.rand(T + 1, B, generator=g),
            torch.rand(T, B, generator=g) < 0.2, gamma, lam)


CASES = [case(1, 5, 3, 0.99, 0.95), case(2, 8, 4, 0.9, 1.0), case(3, 1, 2, 0.5, 0.0), case(4, 16, 8, 1.0, 0.9)]
check_exercise(my_gae, compute_gae_advantages_and_returns, CASES)


def gae_ignoring_dones(rewards, values, dones, gamma, gae_lambda):
    return compute_gae_advantages_and_returns(rewards, values, torch.zeros_like(dones), gamma, gae_lambda)


assert not matches(gae_ignoring_dones, compute_gae_advantages_and_returns, CASES)  # a wrong answer fails
