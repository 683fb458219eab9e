"""Stage 5's maths: the PPO policy loss (synchronous and decoupled), the Huber value loss and the KL penalty, on [N].

    pg_loss, metrics = compute_ppo_actor_loss(logprobs, old_logprobs, advantages, loss_mask, 0.2, 0.2, 3.0)
    v_loss, metrics = compute_ppo_critic_loss(values, old_values, returns, loss_mask, value_clip, huber_delta)
    kl = kl_penalty(logprobs, ref_logprobs, "low_var_kl")                           # [N], per sample

ratio = exp(logp - old_logp); pg_loss = max(-A r, -A clip(r, 1 - low, 1 + high)), capped at c |A| where A < 0 (dual
clip, https://arxiv.org/abs/1912.09729); v_loss = max(huber(R - V), huber(R - V_clip)), V_clip = V_old + clip(V -
V_old, -value_clip, value_clip); all over the loss mask. Async PPO's decoupled loss: docs/async_ppo.md.

RLinf counterpart: `rlinf/algorithms/losses.py` (`compute_ppo_actor_loss`, `compute_decoupled_ppo_actor_loss`,
`compute_ppo_critic_loss`), `rlinf/algorithms/utils.py` (`huber_loss`, `kl_penalty`). Left out: log-ratio clamps,
RLinf's masked_mean_ratio aggregation (with a loss mask from auto_reset off, RLinf weights each step by
max_episode_steps / its episode's length; here every masked-in step weighs the same). Used by `stages/train.py`.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the entries where mask is 1 (0 if none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def huber_loss(error: Tensor, delta: float) -> Tensor:
    """0.5 e^2 where |e| < delta, delta (|e| - delta / 2) beyond: quadratic near 0, linear for outliers."""
    return torch.where(error.abs() < delta, 0.5 * error**2, delta * (error.abs() - 0.5 * delta))


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kl_penalty_type: str) -> Tensor:
    """Per-sample estimate of KL(policy || reference) from the sampled actions' log-probs (RLinf's penalty types,
    http://joschu.net/blog/kl-approx.html): 'kl'/'k1' logp - ref; 'abs' |logp - ref|; 'mse'/'k2' (logp - ref)^2 / 2;
    'low_var_kl'/'k3' exp(ref - logp) - (ref - logp) - 1, its log-ratio clamped to [-20, 20] and result to [-10, 10].
    RLinf 0.3.0's actor loss calls kl_penalty(ref_logprobs, logprobs, ...), the arguments swapped: for 'kl' that
    rewards moving away from the reference. Here the policy's log-probs come first, as in its advantages."""
    diff = logprobs - ref_logprobs
    if kl_penalty_type in ("kl", "k1"):
        return diff
    if kl_penalty_type == "abs":
        return diff.abs()
    if kl_penalty_type in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty_type in ("low_var_kl", "k3"):
        log_ratio = (-diff).clamp(min=-20, max=20)  # log(ref / policy)
        return (log_ratio.exp() - log_ratio - 1).clamp(min=-10, max=10)
    raise ValueError(f"unknown kl_penalty_type {kl_penalty_type!r} (known: {', '.join(KL_PENALTY_TYPES)})")


def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_ratio_low: float, clip_ratio_high: float,
                      clip_ratio_c: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's per-sample clipped surrogate [N], and where the ratio clip and the dual clip were active ([N] bool)."""
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses, dual = clip_pg_losses1, torch.zeros_like(advantages, dtype=torch.bool)
    if clip_ratio_c is not None:
        # RLinf caps every sample at c |A|; where A > 0 the clipped loss is <= 0 < c |A| already
        pg_losses3 = -advantages * clip_ratio_c
        dual = (clip_pg_losses1 > pg_losses3) & (advantages < 0)
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses3, clip_pg_losses1), clip_pg_losses1)
    return pg_losses, pg_losses2 > pg_losses1, dual


def compute_ppo_actor_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
                           clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None = None,
                           ) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate with optional dual clip. All inputs [N]; loss_mask [N] float (1 = counts)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg_losses, clipped, dual = clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    with torch.no_grad():
        metrics = {
            "actor/ratio": masked_mean(ratio, loss_mask),
            "actor/approx_kl": masked_mean((ratio - 1) - log_ratio, loss_mask),  # http://joschu.net/blog/kl-approx.html
            "actor/clip_fraction": masked_mean(clipped.float(), loss_mask),
            "actor/dual_clip_fraction": masked_mean(dual.float(), loss_mask),
        }
    return masked_mean(pg_losses, loss_mask), metrics


# --------------------------------------------------------------------------------------------------------------------
# Asynchronous PPO: the decoupled loss (AReaL, https://arxiv.org/abs/2505.24298) and its version diagnostics


def interpolate_proximal_logprobs(logprobs: Tensor, old_logprobs: Tensor, versions: Tensor,
                                  current_version: float) -> Tensor:
    """RLinf's version-interpolated proximal log-probs [N], detached: old + alpha (logp - old), alpha =
    (v_prox - v_behav) / (v_theta - v_behav) clamped to [0, 1], with v_theta = current_version (the version this
    update makes: the actor's + 1) and v_prox = v_theta - 1 (the actor's weights now); alpha = 0 where v_theta <=
    v_behav or the version is negative (not generated). A sample of the actor's own version gets its old log-prob."""
    v_behav, v_theta = versions.to(old_logprobs.dtype), float(current_version)
    version_diff = v_theta - v_behav
    alpha = torch.where((version_diff > 0) & (versions >= 0), (v_theta - 1.0 - v_behav) / version_diff,
                        torch.zeros_like(v_behav)).clamp(0.0, 1.0)
    alpha = alpha.reshape(alpha.shape + (1,) * (logprobs.dim() - alpha.dim()))  # [N] -> [N, 1, ...] if logp has more
    return (old_logprobs + alpha * (logprobs - old_logprobs)).detach()


def compute_average_version(versions: Tensor, loss_mask: Tensor) -> Tensor:
    """actor/average_version: the mean weight version of the samples in the loss mask."""
    return masked_mean(versions.to(loss_mask.dtype), loss_mask)


def compute_data_staleness(versions: Tensor, actor_version: int) -> dict[str, float]:
    """RLinf's rollout/data_staleness_<k>/ratio: the share of samples made k versions before the actor's own (every
    sample of the batch counts, masked or not; versions rounded)."""
    flat = torch.round(versions.reshape(-1).double()).long()
    kept, counts = torch.unique(flat, return_counts=True)
    return {f"data_staleness_{actor_version - v}/ratio": c / flat.numel()
            for v, c in zip(kept.tolist(), counts.tolist(), strict=True)}


def compute_decoupled_ppo_actor_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
                                     clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None = None,
                                     *, proximal_logprobs: Tensor | None = None, versions: Tensor | None = None,
                                     current_version: float | None = None,
                                     behave_weight_threshold: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Decoupled PPO: the clipped surrogate of r = pi / pi_prox, times w = pi_prox / pi_behav (old_logprobs are the
    behaviour policy's), averaged over the samples with w <= behave_weight_threshold. pi_prox is `proximal_logprobs`
    (recomputed by the actor: rollout.recompute_logprobs), else interpolated from `versions` (RLinf's default), else
    the behaviour policy itself: then w = 1 and this is compute_ppo_actor_loss, bit for bit. All inputs [N].

    Metrics as RLinf computes them (k1 estimators, unlike actor/approx_kl's k3): proximal_approx_kl = mean of
    log pi_prox - log pi, behav_approx_kl = mean of log pi_behav - log pi_prox over the kept samples. RLinf's
    behav_clip_fraction reads 1 - 1/N when every sample is masked; here 1."""
    if proximal_logprobs is None:
        if versions is None or current_version is None:
            proximal_logprobs = old_logprobs
        else:
            proximal_logprobs = interpolate_proximal_logprobs(logprobs, old_logprobs, versions, current_version)
    proximal_logprobs = proximal_logprobs.detach()  # an anchor: no gradient, whichever way it was made
    log_ratio = logprobs - proximal_logprobs
    ratio = torch.exp(log_ratio)
    pg_losses, clipped, dual = clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    behav_log_weight = (proximal_logprobs - old_logprobs).detach()
    behav_weight = torch.exp(behav_log_weight)  # [N]
    behav_mask = loss_mask
    if behave_weight_threshold is not None:
        behav_mask = loss_mask * (behav_weight <= behave_weight_threshold).to(loss_mask.dtype)
    with torch.no_grad():
        metrics = {
            "actor/proximal_ratio": masked_mean(ratio, loss_mask),
            "actor/clip_fraction": masked_mean(clipped.float(), loss_mask),
            "actor/dual_clip_fraction": masked_mean(dual.float(), loss_mask),
            "actor/proximal_approx_kl": masked_mean(-log_ratio, loss_mask),
            "actor/behav_approx_kl": masked_mean(-behav_log_weight, behav_mask),
            "actor/behav_clip_fraction": masked_mean((loss_mask - behav_mask).clamp(min=0), loss_mask),
        }
        if versions is not None and current_version is not None:
            metrics["actor/average_version"] = compute_average_version(versions, loss_mask)
            metrics["actor/current_version"] = torch.tensor(float(current_version), device=logprobs.device)
    return masked_mean(pg_losses * behav_weight, behav_mask), metrics


def compute_ppo_critic_loss(values: Tensor, old_values: Tensor, returns: Tensor, loss_mask: Tensor,
                            value_clip: float, huber_delta: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped Huber value loss. All inputs [N]. value_clip <= 0 turns the clipping off (RLinf: needs a number).

    RLinf 0.3.0's critic/value_clip_ratio compares the already clipped value with the clip, so it is always 0; here
    it is the fraction of samples whose new value moved further than value_clip."""
    if value_clip <= 0:
        value_clip = float("inf")
    values_clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    v_losses = torch.maximum(huber_loss(returns - values, huber_delta),
                             huber_loss(returns - values_clipped, huber_delta))  # [N]
    with torch.no_grad():
        metrics = {"critic/value_clip_ratio": masked_mean(((values - old_values).abs() > value_clip).float(),
                                                          loss_mask)}
    return masked_mean(v_losses, loss_mask), metrics
