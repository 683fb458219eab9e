# %% [markdown]
# # 04 — Advantages: from rewards (and values) to what the loss weighs each action by
#
# Run it: `python tutorials/04_advantages.py` (pure tensor functions and one small env, no processes; its time on 2
# cores is in README's tutorial table, which the tests check). Every stated fact is an `assert` in the cell after it.
# Words in doubt: the [glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# After the rollout, the actor holds for each env column b and chunk step t (one policy call, whose C actions the
# env executes open loop: C env steps): `rewards [T, B]` (the chunk's rewards, summed), `dones [T, B]` (the
# episode ended during chunk step t, by success or by the time limit) and, with a value head, `values [T+1, B]`
# (the last row bootstraps the state after the final step). The advantage says how much better an action was
# than expected; PPO multiplies the probability ratio by it. RLinf keeps the estimators as pure functions chosen
# by `algorithm.adv_type`, so PPO with a critic (`gae`) and critic-free group methods (`grpo`, `reinpp`) share
# one actor:
#
# - **GAE**: δ_t = r_t + γ V_{t+1} (1 − d_t) − V_t, and A_t = Σ_k (γλ)^k δ_{t+k}, cut at episode ends.
#   The value head learns from `returns = advantages + values`.
# - **GRPO**: each env's first-episode return is its score; the G envs of a group started from the same state,
#   and a score is normalized by its group's mean and std. Every step of the episode gets that advantage.
# - **Reinforce++**: the score sits at the first episode's last step and is summed backwards (minus an optional
#   per-step KL penalty), then whitened over the first episodes' steps.
# - **Whitening** (`normalize_advantages`): RLinf's `safe_normalize`, (x − mean) / (std + 1e-5) with the unbiased
#   std of the loss-masked entries, applied to every entry (`normalize_returns` must stay false, as RLinf runs).
#
# GAE as pseudocode (one env column; T chunk steps; Spinning Up style):
#
#     input:  r_0..r_{T-1}, d_0..d_{T-1} (1 = the episode ended at step t), V_0..V_T, γ, λ
#     for t = 0 .. T-1:
#         δ_t = r_t + γ V_{t+1} (1 − d_t) − V_t          # no bootstrap past an episode's end
#     for t = 0 .. T-1:
#         A_t = 0;  w = 1
#         for k = t .. T-1:
#             A_t = A_t + w δ_k
#             if d_k: stop                                 # the episode ended at step k
#             w = w γ λ
#         R_t = A_t + V_t                                  # the value head's target
#
# The code computes the same sums in one backward pass, A_t = δ_t + γλ (1 − d_t) A_{t+1} (checked below).
#
# ## The code to read
#
# - `stages/advantages.py`: `compute_gae_advantages_and_returns` (one backward loop, CleanRL-style),
#   `compute_grpo_advantages`, `compute_reinpp_advantages`, `first_episode_mask`, `safe_normalize`, and
#   `calculate_adv_and_returns` (picks the estimator by `cfg.adv_type`).
# - `stages/rollout.py::_stack_trajectory`: where the env worker sums a chunk's rewards and turns terminations and
#   truncations into `dones`, once per rollout epoch.
# - `stages/train.py::ActorWorker.compute_advantages_and_returns`: runs it on the actor rank's columns, passing its
#   all-reduce, so `safe_normalize` takes the mean and std of *all* ranks' samples and 1 or 2 actor ranks agree.

# %%
import dataclasses

import torch
from workbench import ROOT, check_exercise, matches

from rlinf_mini.config import AlgorithmConfig, load_config
from rlinf_mini.envs import make_env
from stages.advantages import calculate_adv_and_returns, compute_gae_advantages_and_returns, compute_grpo_advantages
from stages.rollout import _stack_trajectory

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
# **The code equals the pseudocode above.** The pseudocode as a plain loop over columns, steps and the forward
# sum (an oracle: written from the formula, not from the code), against the real function for λ = 0, 0.95 and 1.

# %%
def gae_from_the_pseudocode(rewards, values, dones, gamma, lam):
    T, B = rewards.shape
    advantages = torch.zeros(T, B)
    for b in range(B):
        d = [float(x) for x in dones[:, b]]
        delta = [float(rewards[t, b] + gamma * values[t + 1, b] * (1 - d[t]) - values[t, b]) for t in range(T)]
        for t in range(T):
            total, w = 0.0, 1.0
            for k in range(t, T):
                total += w * delta[k]
                if d[k]:
                    break
                w *= gamma * lam
            advantages[t, b] = total
    return advantages, advantages + values[:T]


for lam, (adv, ret) in [(0.0, (adv_0, adv_0 + values[:T])), (0.95, (adv_95, ret_95)), (1.0, (adv_1, ret_1))]:
    oracle_adv, oracle_ret = gae_from_the_pseudocode(rewards, values, dones, gamma, lam)
    assert torch.allclose(adv, oracle_adv, atol=1e-5) and torch.allclose(ret, oracle_ret, atol=1e-5), lam

# %% [markdown]
# **Episodes do not leak into each other**: changing what happens after env 1's episode ended at step 2 leaves
# its advantages at steps 0..2 unchanged.

# %%
later = rewards.clone()
later[3:, 1] += 10.0
adv_later, _ = compute_gae_advantages_and_returns(later, values, dones, gamma, gae_lambda=0.95)
assert torch.equal(adv_later[:3, 1], adv_95[:3, 1]) and not torch.equal(adv_later[3:, 1], adv_95[3:, 1])

# %% [markdown]
# ## Run it (2): where `rewards` and `dones` come from — chunks and time limits
#
# A real fake-reach env (the MLP config's `env.train`) with 2 sub-envs, C = 2 actions per chunk and a time limit
# of `max_episode_steps` = 3 env steps, stepped for T = 2 chunk steps with small moves towards the goal (too small
# to reach it), then reduced the way the env worker reduces every rollout epoch (`_stack_trajectory`).

# %%
split = dataclasses.replace(load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml")]).env.train,
                            max_episode_steps=3)
env = make_env(split, torch.arange(2), num_action_chunks=2)
obs = env.reset()  # [2, 4]: position (2), goal (2)
record = {name: [] for name in ("obs", "actions", "logprobs", "values", "rewards", "dones", "versions")}
raw = []  # per chunk step: rewards, terminations, truncations, each [B=2, C=2]
for _ in range(2):  # T = 2 chunk steps
    actions = (0.25 * (obs[:, 2:] - obs[:, :2]).sign())[:, None].expand(2, 2, 2).contiguous()  # [B, C, A]
    record["obs"].append(obs)
    record["actions"].append(actions)
    record["logprobs"].append(torch.zeros(2))
    record["values"].append(torch.zeros(2))
    obs, chunk_rewards, terminations, truncations, _ = env.chunk_step(actions)
    raw.append((chunk_rewards, terminations, truncations))
    record["rewards"].append(chunk_rewards)
    record["dones"].append((terminations, truncations))
    record["versions"].append(0)
record["values"].append(torch.zeros(2))
trajectory = _stack_trajectory(record)
for t, (r, term, trunc) in enumerate(raw):
    print(f"chunk step {t}: env-step rewards {r.tolist()}, terminated {term.tolist()}, truncated {trunc.tolist()}")
print("rewards [T, B]:", trajectory["rewards"].tolist(), " dones [T, B]:", trajectory["dones"].tolist())

# %% [markdown]
# **Rewards within a chunk are summed**: each row of `rewards` is the sum of that chunk step's C = 2 env-step
# rewards. **A time-limit truncation counts as a done**: the third env step hit the limit (truncated, not
# terminated), so `dones` is True at chunk step 1. With auto-reset the new episode has already taken the chunk's
# remaining action (its elapsed count is 1), and that action's reward is masked to 0 in this chunk step.

# %%
assert torch.equal(trajectory["rewards"], torch.stack([r.sum(dim=1) for r, _, _ in raw]))  # [T, B]
assert (raw[0][0] != 0).all()  # both env steps of chunk step 0 earned something: a real sum of two
assert not any(term.any() for _, term, _ in raw) and raw[1][2][:, 0].all()  # no success; the limit at env step 3
assert trajectory["dones"].tolist() == [[False, False], [True, True]]
assert env.elapsed.tolist() == [1, 1] and (raw[1][0][:, 1] == 0).all()

# %% [markdown]
# **GAE treats a truncation exactly like a success: no bootstrap.** The obs after the truncated step is the new
# episode's (the truncated episode's final obs is not kept), so δ at that step is r − V with no γ V_{t+1} term,
# whatever the values say. (RLinf's `algorithm.bootstrap_type` and the env's `final_observation`, which could
# bootstrap a truncated episode from its last state, are left out: see `rlinf_mini/port_config.py`.)

# %%
chunk_values = torch.rand(3, 2, generator=gen)  # [T+1, B]
td, _ = compute_gae_advantages_and_returns(trajectory["rewards"], chunk_values, trajectory["dones"], 0.99, 0.0)
assert torch.allclose(td[1], trajectory["rewards"][1] - chunk_values[1])
assert torch.allclose(td[0], trajectory["rewards"][0] + 0.99 * chunk_values[1] - chunk_values[0])

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
assert cfg.normalize_advantages and not cfg.normalize_returns  # the defaults
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
# [T, B]. Replace the body with one loop backwards over t (the pseudocode is at the top). Each case is named for
# what it tests: a version that forgets the dones passes "no episode ends" and fails "an episode ends
# mid-rollout", and so does one that stops the sum at a done but still bootstraps V_{t+1} there.

# %%
def my_gae(rewards, values, dones, gamma, gae_lambda):
    # EXERCISE: replace the line below with your own loop.
    return compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda)


def case(seed: int, T: int, B: int, gamma: float, lam: float, p_done: float):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, B, generator=g), torch.rand(T + 1, B, generator=g),
            torch.rand(T, B, generator=g) < p_done, gamma, lam)


CASES = {
    "no episode ends": case(1, 5, 3, 0.99, 0.95, 0.0),
    "an episode ends mid-rollout": case(2, 8, 4, 0.99, 0.95, 0.2),
    "lambda 1: returns minus values": case(3, 8, 4, 0.9, 1.0, 0.2),
    "lambda 0: the TD error": case(4, 6, 2, 0.9, 0.0, 0.2),
    "gamma 1, long rollout": case(5, 16, 8, 1.0, 0.9, 0.1),
    "one step": case(6, 1, 2, 0.5, 0.95, 0.5),
    "every step ends an episode": case(7, 4, 3, 0.99, 0.95, 1.1),
}
check_exercise(my_gae, compute_gae_advantages_and_returns, CASES)


def gae_ignoring_dones(rewards, values, dones, gamma, gae_lambda):
    return compute_gae_advantages_and_returns(rewards, values, torch.zeros_like(dones), gamma, gae_lambda)


assert matches(gae_ignoring_dones, compute_gae_advantages_and_returns, {"none": CASES["no episode ends"]})
assert not matches(gae_ignoring_dones, compute_gae_advantages_and_returns, CASES)  # a wrong answer fails
