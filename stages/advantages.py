"""Stage 4 of one RL step: turn a rollout's rewards (and values) into advantages, returns and a loss mask.

    out = calculate_adv_and_returns(cfg.algorithm, rewards, values, dones)   # all_reduce=... over actor ranks
    out["advantages"], out["returns"], out["loss_mask"]   # each [T, B]; loss_mask is bool

Inputs, one column per env, one row per env step: rewards [T, B]; values [T+1, B] (values[T] bootstraps the obs after
the last step; None = no value head); dones [T, B] bool (the episode ended at step t). Estimators (`adv_type`):
gae (GAE, https://arxiv.org/abs/1506.02438; critic-free without values), grpo (first-episode score normalized within
groups of G envs), reinpp (Reinforce++: the score placed at the episode's last step, minus an optional KL penalty
per step, summed backwards, whitened over the loss mask).

RLinf counterpart: `rlinf/algorithms/advantages.py`, `rlinf/algorithms/utils.py` (`calculate_scores`,
`safe_normalize`, `kl_penalty`), `rlinf/algorithms/registry.py::calculate_adv_and_returns`. RLinf pads dones to
[T+1, B] and reads dones[t+1] where we read dones[t]. Left out: the registry and its **kwargs, chunk reshaping,
grpo_video / grpo_dynamic / opd / raw. Next stage: `stages/train.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlinf_mini.config import AlgorithmConfig

AllReduce = Callable[[Tensor], Tensor]  # sums a tensor over the actor ranks (identity on one rank)


def _no_reduce(x: Tensor) -> Tensor:
    return x


def masked_moments(x: Tensor, mask: Tensor | None,
                   all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, sum of squared deviations, count) of x over the entries where mask is True, over every actor rank.

    Two passes (mean first, then squared deviations) rather than E[x^2] - E[x]^2, which cancels badly in float32.
    `all_reduce` sums over ranks, so 1 rank holding all columns and 2 ranks holding half each get the same numbers.
    """
    reduce = all_reduce or _no_reduce
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool()
    s = reduce(torch.stack([(x * m).sum(), m.sum().to(x.dtype)]))  # [2] sum, count
    mean = s[0] / s[1].clamp(min=1)
    sq = reduce(((x - mean) ** 2 * m).sum().reshape(1))[0]  # [1]: collectives want at least one dimension
    return mean, sq, s[1]


def safe_normalize(x: Tensor, mask: Tensor | None = None, all_reduce: AllReduce | None = None) -> Tensor:
    """RLinf's safe_normalize: (x - mean) / (std + 1e-5), mean and unbiased std over the masked entries, applied to
    every entry (masked ones included: the loss mask removes them later). No masked entry: x unchanged (RLinf too).
    One masked entry: RLinf 0.3.0 returns NaN (unbiased std of one number); here x - mean, the std taken as 0."""
    mean, sq, n = masked_moments(x, mask, all_reduce)
    if n < 1:
        return x
    std = (sq / (n - 1)).sqrt() if n > 1 else torch.zeros_like(mean)
    return (x - mean) / (std + 1e-5)


def first_episode_mask(dones: Tensor) -> Tensor:
    """[T, B] bool: True up to and including each env's first done (RLinf's compute_loss_mask for auto_reset off).

    GRPO and Reinforce++ score one episode per env, the first: it started from the group's shared reset state."""
    dones = dones.long()
    return (dones.cumsum(dim=0) - dones) == 0  # no done strictly before step t


def compute_gae_advantages_and_returns(
    rewards: Tensor, values: Tensor | None, dones: Tensor, gamma: float, gae_lambda: float
) -> tuple[Tensor, Tensor]:
    """GAE: advantages[t] = sum_k (gamma * lambda)^k * delta[t+k], cut at the end of each episode.

    delta[t] = rewards[t] + gamma * values[t+1] * (1 - dones[t]) - values[t];  returns = advantages + values[:T].
    Critic-free (values None, as RLinf): gamma = lambda = 1 and delta = rewards, so returns = advantages = the
    undiscounted reward-to-go within the episode. Returns (advantages [T, B], returns [T, B]), not normalized.
    """
    T = rewards.shape[0]
    critic_free = values is None
    if critic_free:
        gamma, gae_lambda = 1.0, 1.0
    nextnonterminal = 1.0 - dones.to(rewards.dtype)  # [T, B] 0 where step t+1 belongs to a new episode
    advantages = torch.zeros_like(rewards)  # [T, B]
    lastgaelam = torch.zeros_like(rewards[0])  # [B]
    for t in reversed(range(T)):
        delta = rewards[t] if critic_free else rewards[t] + gamma * values[t + 1] * nextnonterminal[t] - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
        advantages[t] = lastgaelam
    returns = advantages.clone() if critic_free else advantages + values[:T]  # [T, B]
    return advantages, returns


def first_episode_scores(rewards: Tensor, dones: Tensor) -> Tensor:
    """[B]: each env's undiscounted first-episode return (RLinf's calculate_scores)."""
    return (rewards * first_episode_mask(dones)).sum(dim=0)


def _check_groups(batch_size: int, group_size: int) -> None:
    if group_size < 1 or batch_size % group_size:
        raise ValueError(f"{batch_size} envs cannot be split into groups of group_size={group_size}")


def compute_grpo_advantages(
    rewards: Tensor, dones: Tensor, group_size: int, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """GRPO: advantage = (score - group mean) / (group std + eps), the same at every step of the first episode.

    Envs b*G .. b*G+G-1 form one group; the std is unbiased (torch.std), like RLinf, so G >= 2. Steps after the
    first done get advantage 0 and loss_mask False. Returns (advantages [T, B], loss_mask [T, B] bool).
    """
    B = rewards.shape[1]
    _check_groups(B, group_size)
    if group_size < 2:
        raise ValueError(f"GRPO needs group_size >= 2 to compare episodes within a group, got {group_size}")
    loss_mask = first_episode_mask(dones)  # [T, B]
    scores = first_episode_scores(rewards, dones).view(B // group_size, group_size)  # [B/G, G]
    scores = (scores - scores.mean(dim=1, keepdim=True)) / (scores.std(dim=1, keepdim=True) + eps)  # [B/G, G]
    return scores.view(1, B) * loss_mask, loss_mask


def compute_reinpp_advantages(
    rewards: Tensor, dones: Tensor, group_size: int, use_reinpp_baseline: bool,
    kl: Tensor | None = None, kl_beta: float = 0.0, all_reduce: AllReduce | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reinforce++ (RLinf's compute_reinpp_advantages, with what its comments say it means).

    score[b] = first-episode return (minus its group's mean with use_reinpp_baseline), put at the episode's last
    step e[b]; every step gets -kl_beta * kl[t, b] (kl [T, B]: the per-step penalty against the reference policy);
    returns = reverse cumulative sum over t (undiscounted, as RLinf); advantages = (returns - mean) / sqrt(var),
    mean and population var over the loss mask (var clamped at 1e-8), applied to every entry, over every actor rank.
    Two places where RLinf 0.3.0 is wrong and this is not: it finds e[b] from the left-right mirrored column
    (`loss_mask.fliplr()` flips the env axis, so env b gets env B-1-b's end row), and its baseline returns a
    1-D score tensor that `scatter_` then rejects (an error for every use_reinpp_baseline: true run).
    Returns (advantages [T, B], returns [T, B], loss_mask [T, B] bool).
    """
    T, B = rewards.shape
    loss_mask = first_episode_mask(dones)  # [T, B]
    scores = first_episode_scores(rewards, dones)  # [B]
    if use_reinpp_baseline:
        _check_groups(B, group_size)
        grouped = scores.view(B // group_size, group_size)  # [B/G, G]
        scores = (grouped - grouped.mean(dim=1, keepdim=True)).view(B)
    last = T - 1 - loss_mask.long().flip(dims=[0]).argmax(dim=0)  # [B] last True row of each column
    r = torch.zeros_like(rewards).scatter_(0, last.view(1, B), scores.view(1, B))  # [T, B]
    if kl_beta > 0:
        if kl is None:
            raise ValueError("reinpp with reinpp_kl_beta > 0 needs the per-step KL against the reference policy")
        r = r - kl_beta * kl
    returns = r.flip(dims=[0]).cumsum(dim=0).flip(dims=[0])  # [T, B]
    mean, sq, n = masked_moments(returns, loss_mask, all_reduce)
    var = sq / n.clamp(min=1)
    return (returns - mean) * var.clamp(min=1e-8).rsqrt(), returns, loss_mask


def calculate_adv_and_returns(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    values: Tensor | None,
    dones: Tensor,
    all_reduce: AllReduce | None = None,
    kl: Tensor | None = None,
    loss_mask: Tensor | None = None,
) -> dict[str, Tensor]:
    """Run the estimator named by cfg.adv_type; returns {"advantages", "returns", "loss_mask"}, each [T, B].

    GAE's whitening (normalize_advantages, normalize_returns) and Reinforce++'s take their statistics over every
    actor rank through `all_reduce` (None: this tensor is the whole batch). `kl` [T, B] is the per-step penalty
    against the reference policy (Reinforce++ with reinpp_kl_beta > 0). GRPO has no critic: returns = advantages.
    `loss_mask` [T, B] is GAE's (None = every step; RLinf masks the steps after the first done when
    env.train.auto_reset is off); GRPO and Reinforce++ always train each env's first episode only.
    """
    if cfg.adv_type == "gae":
        mask = torch.ones_like(rewards, dtype=torch.bool) if loss_mask is None else loss_mask.bool()  # [T, B]
        advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, cfg.gamma, cfg.gae_lambda)
        if cfg.normalize_advantages:
            advantages = safe_normalize(advantages, mask, all_reduce)
        if cfg.normalize_returns:
            returns = safe_normalize(returns, mask, all_reduce)
        return {"advantages": advantages, "returns": returns, "loss_mask": mask}
    if cfg.adv_type == "grpo":
        advantages, loss_mask = compute_grpo_advantages(rewards, dones, cfg.group_size)
        return {"advantages": advantages, "returns": advantages, "loss_mask": loss_mask}
    if cfg.adv_type == "reinpp":
        advantages, returns, loss_mask = compute_reinpp_advantages(
            rewards, dones, cfg.group_size, cfg.use_reinpp_baseline, kl, cfg.reinpp_kl_beta, all_reduce)
        return {"advantages": advantages, "returns": returns, "loss_mask": loss_mask}
    raise ValueError(f"unknown adv_type {cfg.adv_type!r} (known: 'gae', 'grpo', 'reinpp')")
