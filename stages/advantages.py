"""Stage 4 of one RL step: turn a rollout's rewards (and values) into advantages, returns and a loss mask.

    out = calculate_adv_and_returns(cfg.algorithm, rewards, values, dones)
    out["advantages"], out["returns"], out["loss_mask"]   # each [T, B]; loss_mask is bool

Inputs, one column per env, one row per env step:
    rewards [T, B] float   reward of step t
    values  [T+1, B] float value of the obs before step t; values[T] bootstraps the obs after the last step (GAE only)
    dones   [T, B] bool    the episode ended at step t, so values[t+1] (and everything later) is a new episode

Estimators, chosen by `cfg.adv_type`:
    gae     Generalized Advantage Estimation (https://arxiv.org/abs/1506.02438), as in CleanRL's ppo.py.
    grpo    one score per env (its first episode's summed reward), normalized within each group of G envs that share a
            reset state; only the first episode is trained (loss_mask).
    reinpp  Reinforce++: discounted returns, optionally minus the group mean score, whitened over the whole batch.

RLinf counterpart: `rlinf/algorithms/advantages.py` (`compute_gae_advantages_and_returns`, `compute_grpo_advantages`,
`compute_reinpp_advantages`), `rlinf/algorithms/utils.py` (`calculate_scores`, `safe_normalize`) and
`rlinf/algorithms/registry.py::calculate_adv_and_returns`. One difference in layout: RLinf pads dones to [T+1, B] and
reads dones[t+1] where we read dones[t] (same flag, shifted by one row).

Left out: the registry and its **kwargs (an explicit if/elif instead), action-chunk reshaping ([n_chunk, B, C] ->
[T, B] is the caller's job), the KL penalty in Reinforce++ rewards, normalize_returns, critic-free GAE, and the
other estimators (grpo_video, grpo_dynamic, opd, raw).

Next stage: `stages/train.py` (PPO / actor-only updates on these advantages).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlinf_mini.config import AlgorithmConfig


def first_episode_mask(dones: Tensor) -> Tensor:
    """[T, B] bool: True from step 0 up to and including each env's first done; all True if it never ends.

    GRPO scores one episode per env, the first one: it started from the group's shared reset state, later ones
    (after an auto-reset) did not.
    """
    dones = dones.bool()
    dones_before = dones.long().cumsum(dim=0) - dones.long()  # [T, B] dones strictly before step t
    return dones_before == 0


def compute_gae_advantages_and_returns(
    rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, gae_lambda: float
) -> tuple[Tensor, Tensor]:
    """GAE: advantages[t] = sum_k (gamma * lambda)^k * delta[t+k], cut at the end of each episode.

    delta[t] = rewards[t] + gamma * values[t+1] * (1 - dones[t]) - values[t]   (one-step TD error)
    Returns (advantages [T, B], returns [T, B] = advantages + values[:T], the value head's target).
    """
    T = rewards.shape[0]
    nextnonterminal = 1.0 - dones.to(rewards.dtype)  # [T, B] 0 where values[t+1] belongs to a new episode
    advantages = torch.zeros_like(rewards)  # [T, B]
    lastgaelam = torch.zeros_like(rewards[0])  # [B]
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * values[t + 1] * nextnonterminal[t] - values[t]  # [B]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
        advantages[t] = lastgaelam
    returns = advantages + values[:T]  # [T, B]
    return advantages, returns


def _check_groups(batch_size: int, group_size: int) -> None:
    if group_size < 1 or batch_size % group_size:
        raise ValueError(f"{batch_size} envs cannot be split into groups of group_size={group_size}")


def compute_grpo_advantages(
    rewards: Tensor, dones: Tensor, group_size: int, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """GRPO: advantage = (score - group mean) / (group std + eps), the same at every step of the first episode.

    score[b] is env b's undiscounted first-episode return; envs b*G .. b*G+G-1 form one group. The std is unbiased
    (torch.std), like RLinf, so a group needs G >= 2. Steps after the first done get advantage 0 and loss_mask False.
    Returns (advantages [T, B], loss_mask [T, B] bool).
    """
    B = rewards.shape[1]
    _check_groups(B, group_size)
    if group_size < 2:
        raise ValueError(f"GRPO needs group_size >= 2 to compare episodes within a group, got {group_size}")
    loss_mask = first_episode_mask(dones)  # [T, B]
    scores = (rewards * loss_mask).sum(dim=0).view(B // group_size, group_size)  # [B/G, G]
    scores = (scores - scores.mean(dim=1, keepdim=True)) / (scores.std(dim=1, keepdim=True) + eps)  # [B/G, G]
    advantages = scores.view(1, B) * loss_mask  # [T, B]
    return advantages, loss_mask


def compute_reinpp_advantages(
    rewards: Tensor, dones: Tensor, gamma: float, group_size: int, use_reinpp_baseline: bool
) -> tuple[Tensor, Tensor]:
    """Reinforce++: discounted returns (reset at dones), minus an optional group baseline, whitened over the batch.

    returns[t] = rewards[t] + gamma * returns[t+1] * (1 - dones[t]). With use_reinpp_baseline, the group mean of the
    first-episode scores (as in GRPO) is subtracted from every step's return first. Whitening uses the population
    variance clamped at 1e-8, like RLinf. Returns (advantages [T, B], returns [T, B], without the baseline).
    """
    T, B = rewards.shape
    nextnonterminal = 1.0 - dones.to(rewards.dtype)  # [T, B]
    returns = torch.zeros_like(rewards)  # [T, B]
    running = torch.zeros_like(rewards[0])  # [B]
    for t in reversed(range(T)):
        running = rewards[t] + gamma * running * nextnonterminal[t]
        returns[t] = running
    advantages = returns
    if use_reinpp_baseline:
        _check_groups(B, group_size)
        scores = (rewards * first_episode_mask(dones)).sum(dim=0).view(B // group_size, group_size)  # [B/G, G]
        baseline = scores.mean(dim=1, keepdim=True).expand(-1, group_size).reshape(1, B)  # [1, B]
        advantages = returns - baseline  # [T, B]
    mean = advantages.mean()
    var = (advantages - mean).pow(2).mean()
    advantages = (advantages - mean) * var.clamp(min=1e-8).rsqrt()
    return advantages, returns


def normalize_advantages(advantages: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """Whiten to mean 0, std 1 (population std), with the statistics taken over the entries where mask is True.

    Entries outside the mask are set to 0 so that they carry nothing into the loss. If the masked entries are
    constant, all advantages are 0 rather than rounding noise divided by eps (RLinf's safe_normalize zeroes them
    too, but only when std < eps: a float32 constant like 0.1 has a std of ~1e-8 from rounding in the mean).
    """
    if mask is None:
        mask = torch.ones_like(advantages, dtype=torch.bool)
    valid = advantages[mask]  # [N] the masked-in entries
    mean, std = valid.mean(), valid.std(correction=0)
    normalized = (advantages - mean) / (std + eps)
    constant = std <= eps + 1e-5 * mean.abs()  # a spread below 1e-5 of the mean is float32 rounding, not signal
    keep = mask & ~constant & torch.isfinite(std)
    return torch.where(keep, normalized, torch.zeros_like(advantages))


def calculate_adv_and_returns(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    values: Tensor | None,
    dones: Tensor,
    normalize: bool | None = None,
) -> dict[str, Tensor]:
    """Run the estimator named by cfg.adv_type; returns {"advantages", "returns", "loss_mask"}, each [T, B].

    `normalize` overrides cfg.normalize_advantages for GAE when not None: pass False when the caller normalizes
    across ranks itself. GRPO has no critic, so its "returns" are its advantages.
    """
    all_steps = torch.ones_like(rewards, dtype=torch.bool)  # [T, B]
    if cfg.adv_type == "gae":
        if values is None:
            raise ValueError("adv_type 'gae' needs values [T+1, B] from a value head, got None")
        advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, cfg.gamma, cfg.gae_lambda)
        if cfg.normalize_advantages if normalize is None else normalize:
            advantages = normalize_advantages(advantages)
        return {"advantages": advantages, "returns": returns, "loss_mask": all_steps}
    if cfg.adv_type == "grpo":
        advantages, loss_mask = compute_grpo_advantages(rewards, dones, cfg.group_size)
        return {"advantages": advantages, "returns": advantages, "loss_mask": loss_mask}
    if cfg.adv_type == "reinpp":
        advantages, returns = compute_reinpp_advantages(
            rewards, dones, cfg.gamma, cfg.group_size, cfg.use_reinpp_baseline
        )
        return {"advantages": advantages, "returns": returns, "loss_mask": all_steps}
    raise ValueError(f"unknown adv_type {cfg.adv_type!r} (known: 'gae', 'grpo', 'reinpp')")
