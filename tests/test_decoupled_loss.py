"""Tests for asynchronous PPO's maths in stages/losses.py: `compute_decoupled_ppo_actor_loss`, its two proximal
modes (interpolated from weight versions by `interpolate_proximal_logprobs`; recomputed by an actor forward, passed
in by the caller) and the version diagnostics (`compute_data_staleness`, `compute_average_version`).

Oracle tests: the loss, its gradient and every metric against plain per-sample Python loops written from RLinf's
formulas (rlinf/algorithms/losses.py::compute_decoupled_ppo_actor_loss, the AReaL loss), on fixed inputs chosen so
that every branch is taken: the ratio clipped above and below, the dual clip, samples masked by the behaviour weight
and by the loss mask, versions that are current, stale, too new and negative. The reduction: with the behaviour
policy as the proximal one (staleness 0) the decoupled loss is compute_ppo_actor_loss, bit for bit.
"""

import math

import pytest
import torch

from stages.losses import (
    compute_average_version,
    compute_data_staleness,
    compute_decoupled_ppo_actor_loss,
    compute_ppo_actor_loss,
    interpolate_proximal_logprobs,
)

CURRENT_VERSION = 6  # the version this update makes: the actor holds version 5
LOW, HIGH, C, THRESHOLD = 0.2, 0.3, 3.0, 2.0

# one row per sample: (behaviour version, old logp, current logp, recomputed proximal logp, advantage, in loss mask)
ROWS = [
    (5, -1.0, -0.5, -1.0, 1.0, 1),    # current version: alpha 0; ratio e^0.5 clipped above (A > 0)
    (5, -2.0, -0.5, -2.0, -1.5, 1),   # current version; ratio e^1.5 > c: dual clip (A < 0)
    (4, -1.0, -0.4, -0.8, 0.7, 1),    # one behind: alpha 1/2
    (4, -0.5, -1.5, -0.9, -0.8, 1),   # one behind, ratio below 1 - low (A < 0: clipped side)
    (3, -1.2, -1.1, -1.15, 2.0, 1),   # two behind: alpha 2/3
    (2, -3.0, -1.0, -2.0, 0.5, 1),    # three behind: alpha 3/4, weight e^1.5 (recomputed e^1) > 2: masked
    (2, -1.0, -1.3, -0.2, -0.3, 1),   # three behind; recomputed weight e^0.8 > 2: masked in the recompute mode
    (6, -0.7, -0.2, -0.7, 1.2, 1),    # newer than the actor (v_theta - v = 0): alpha 0
    (-1, -0.9, -0.6, -0.9, 0.4, 1),   # negative version (not generated): alpha 0
    (4, -1.0, -4.0, -1.0, 3.0, 0),    # outside the loss mask: counts for nothing
    (1, -0.2, -0.25, -0.22, -2.5, 1),  # four behind: alpha 4/5
    (5, -1.5, -1.6, -1.5, 0.0, 1),    # A == 0
]


def inputs(dtype=torch.float64):
    cols = list(zip(*ROWS, strict=True))
    versions = torch.tensor(cols[0], dtype=torch.long)
    old, logp, prox, adv, mask = (torch.tensor(c, dtype=dtype) for c in cols[1:])
    return versions, old, logp, prox, adv, mask


# --------------------------------------------------------------------------------------------------------------------
# The reference: RLinf's formulas, one sample at a time, in Python floats


def ref_alpha(v: int, current_version: float) -> float:
    v_theta, v_prox = float(current_version), float(current_version) - 1.0
    if v < 0 or v_theta - v <= 0:
        return 0.0
    return min(max((v_prox - v) / (v_theta - v), 0.0), 1.0)


def ref_interpolated(versions, old, logp, current_version):
    return [o + ref_alpha(v, current_version) * (lp - o) for v, o, lp in zip(versions, old, logp, strict=True)]


def ref_loss(old, logp, prox, adv, mask, threshold, clip_ratio_c=C):
    """(loss, d loss / d logp per sample, metrics) of the decoupled loss, sample by sample."""
    n_mask = sum(mask) or 1
    kept = [m and math.exp(p - o) <= (threshold if threshold is not None else math.inf)
            for o, p, m in zip(old, prox, mask, strict=True)]
    n_kept = sum(kept) or 1
    total, grads, clipped, dual, ratio_sum, prox_kl, behav_kl = 0.0, [], 0, 0, 0.0, 0.0, 0.0
    for o, lp, p, a, m, k in zip(old, logp, prox, adv, mask, kept, strict=True):
        r = math.exp(lp - p)
        w = math.exp(p - o)
        unclipped, clipped_loss = -a * r, -a * min(max(r, 1 - LOW), 1 + HIGH)
        loss = max(unclipped, clipped_loss)
        grad = -a * r if unclipped >= clipped_loss else 0.0  # a ratio outside the clip range has no gradient
        if clip_ratio_c is not None and a < 0 and loss > -a * clip_ratio_c:
            loss, grad = -a * clip_ratio_c, 0.0
            dual += m
        clipped += m and clipped_loss > unclipped
        if k:
            total += loss * w / n_kept
            grads.append(grad * w / n_kept)
        else:
            grads.append(0.0)
        if m:
            ratio_sum += r
            prox_kl += p - lp
        if k:
            behav_kl += o - p
    metrics = {"actor/proximal_ratio": ratio_sum / n_mask, "actor/clip_fraction": clipped / n_mask,
               "actor/dual_clip_fraction": dual / n_mask, "actor/proximal_approx_kl": prox_kl / n_mask,
               "actor/behav_approx_kl": behav_kl / n_kept,
               "actor/behav_clip_fraction": (sum(mask) - sum(kept)) / n_mask}
    return total, grads, metrics


def run_ours(logp, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = compute_decoupled_ppo_actor_loss(logp, **kwargs)
    loss.backward()
    return loss.item(), logp.grad.tolist(), {k: v.item() for k, v in metrics.items()}


def assert_matches(ours, ref, tol=1e-12):
    (loss, grads, metrics), (ref_l, ref_g, ref_m) = ours, ref
    assert loss == pytest.approx(ref_l, abs=tol)
    assert grads == pytest.approx(ref_g, abs=tol)
    for key, value in ref_m.items():
        assert metrics[key] == pytest.approx(value, abs=tol), key


# --------------------------------------------------------------------------------------------------------------------
# Mode (a): the proximal log-probs interpolated from the versions


def test_the_interpolated_anchor_is_rlinfs_formula_sample_by_sample():
    versions, old, logp, *_ = inputs()
    ours = interpolate_proximal_logprobs(logp, old, versions, CURRENT_VERSION)
    assert ours.tolist() == pytest.approx(ref_interpolated(versions.tolist(), old.tolist(), logp.tolist(),
                                                           CURRENT_VERSION), abs=1e-15)
    alphas = [ref_alpha(v, CURRENT_VERSION) for v in versions.tolist()]
    assert alphas[:2] == [0.0, 0.0] and alphas[2] == 0.5 and alphas[5] == 0.75 and alphas[7] == alphas[8] == 0.0
    assert torch.equal(ours[versions == CURRENT_VERSION - 1], old[versions == CURRENT_VERSION - 1])  # exactly old


@pytest.mark.parametrize("threshold", [THRESHOLD, None])
def test_interpolated_mode_loss_gradient_and_metrics_match_the_loop(threshold):
    versions, old, logp, _, adv, mask = inputs()
    ours = run_ours(logp, old_logprobs=old, advantages=adv, loss_mask=mask, clip_ratio_low=LOW, clip_ratio_high=HIGH,
                    clip_ratio_c=C, versions=versions, current_version=CURRENT_VERSION,
                    behave_weight_threshold=threshold)
    prox = ref_interpolated(versions.tolist(), old.tolist(), logp.tolist(), CURRENT_VERSION)
    ref = ref_loss(old.tolist(), logp.tolist(), prox, adv.tolist(), mask.tolist(), threshold)
    assert_matches(ours, ref)  # the gradient too: the interpolated anchor is detached, as in RLinf
    metrics = ours[2]
    if threshold is not None:
        assert 0 < metrics["actor/behav_clip_fraction"] < 1  # sample 5 is masked by its behaviour weight
    assert metrics["actor/dual_clip_fraction"] > 0 and metrics["actor/clip_fraction"] > 0
    assert metrics["actor/average_version"] == pytest.approx(
        sum(v for v, m in zip(versions.tolist(), mask.tolist(), strict=True) if m) / sum(mask.tolist()))
    assert metrics["actor/current_version"] == CURRENT_VERSION


# --------------------------------------------------------------------------------------------------------------------
# Mode (b): the proximal log-probs recomputed by the actor, passed in


@pytest.mark.parametrize("threshold", [THRESHOLD, None])
@pytest.mark.parametrize("clip_ratio_c", [C, None])
def test_recomputed_mode_loss_gradient_and_metrics_match_the_loop(threshold, clip_ratio_c):
    versions, old, logp, prox, adv, mask = inputs()
    prox_with_grad = prox.clone().requires_grad_(True)  # the anchor takes no gradient even if the caller forgot
    ours = run_ours(logp, old_logprobs=old, advantages=adv, loss_mask=mask, clip_ratio_low=LOW, clip_ratio_high=HIGH,
                    clip_ratio_c=clip_ratio_c, proximal_logprobs=prox_with_grad, versions=versions,
                    current_version=CURRENT_VERSION, behave_weight_threshold=threshold)
    ref = ref_loss(old.tolist(), logp.tolist(), prox.tolist(), adv.tolist(), mask.tolist(), threshold, clip_ratio_c)
    assert_matches(ours, ref)
    assert prox_with_grad.grad is None
    if threshold is not None:  # samples 5 and 6: behaviour weights e^1 and e^0.8 > 2
        assert ours[2]["actor/behav_clip_fraction"] == pytest.approx(2 / 11)  # of the 11 in the loss mask
    if clip_ratio_c is None:
        assert ours[2]["actor/dual_clip_fraction"] == 0


def test_the_recomputed_anchor_wins_over_the_versions():
    versions, old, logp, prox, adv, mask = inputs()
    common = dict(old_logprobs=old, advantages=adv, loss_mask=mask, clip_ratio_low=LOW, clip_ratio_high=HIGH,
                  clip_ratio_c=C, behave_weight_threshold=THRESHOLD)
    with_versions = compute_decoupled_ppo_actor_loss(logp, proximal_logprobs=prox, versions=versions,
                                                     current_version=CURRENT_VERSION, **common)[0]
    without = compute_decoupled_ppo_actor_loss(logp, proximal_logprobs=prox, **common)[0]
    assert torch.equal(with_versions, without)


# --------------------------------------------------------------------------------------------------------------------
# Staleness 0: behaviour == proximal, and the decoupled loss is the synchronous PPO loss


def sync_inputs(seed: int, n: int = 400, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    old = (torch.randn(n, generator=g) * 2 - 1).to(dtype)
    logp = old + (torch.rand(n, generator=g) * 6 - 3).to(dtype)  # ratios in [0.05, 20]: every clip branch
    adv = (torch.randn(n, generator=g) * 2).to(dtype)
    mask = (torch.rand(n, generator=g) < 0.7).to(dtype)
    return old, logp, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["no_anchor", "interpolated", "recomputed"])
@pytest.mark.parametrize("clip_ratio_c", [C, None])
@pytest.mark.parametrize("threshold", [THRESHOLD, None])
def test_staleness_zero_is_the_ppo_loss_bit_for_bit(seed, mode, clip_ratio_c, threshold):
    old, logp, adv, mask = sync_inputs(seed)
    actor_version = 7
    anchor = {"no_anchor": {},
              "interpolated": {"versions": torch.full_like(old, actor_version, dtype=torch.long),
                               "current_version": actor_version + 1},
              "recomputed": {"proximal_logprobs": old.clone()}}[mode]
    lp_ppo, lp_dec = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ppo, ppo_m = compute_ppo_actor_loss(lp_ppo, old, adv, mask, LOW, HIGH, clip_ratio_c)
    dec, dec_m = compute_decoupled_ppo_actor_loss(lp_dec, old, adv, mask, LOW, HIGH, clip_ratio_c,
                                                  behave_weight_threshold=threshold, **anchor)
    ppo.backward()
    dec.backward()
    assert torch.equal(ppo, dec) and torch.equal(lp_ppo.grad, lp_dec.grad)
    for ours, theirs in (("actor/proximal_ratio", "actor/ratio"), ("actor/clip_fraction", "actor/clip_fraction"),
                         ("actor/dual_clip_fraction", "actor/dual_clip_fraction")):
        assert torch.equal(dec_m[ours], ppo_m[theirs]), ours
    assert dec_m["actor/behav_approx_kl"] == 0 and dec_m["actor/behav_clip_fraction"] == 0


# --------------------------------------------------------------------------------------------------------------------
# The version diagnostics


def test_data_staleness_is_the_share_of_samples_per_version_lag():
    versions = torch.tensor([[5, 5, 4], [3, 5, 4]])  # [T, B]
    assert compute_data_staleness(versions, actor_version=5) == {
        "data_staleness_0/ratio": 3 / 6, "data_staleness_1/ratio": 2 / 6, "data_staleness_2/ratio": 1 / 6}
    assert compute_data_staleness(torch.tensor([2.0, 2.4, 1.6]), actor_version=2) == {"data_staleness_0/ratio": 1.0}


def test_average_version_counts_only_the_loss_mask():
    versions, mask = torch.tensor([5, 4, 1, 3]), torch.tensor([1.0, 1.0, 0.0, 1.0])
    assert compute_average_version(versions, mask).item() == pytest.approx(4.0)
