"""Tests for the PPO losses in stages/train.py (`compute_ppo_actor_loss`, `compute_critic_loss`, `masked_mean`).

Oracle tests (as in minGPT's test_huggingface_import): each loss and each of its metrics against a plain per-sample
Python reference written from the formulas in the stages/train.py docstring, on random inputs whose ratios reach far
outside the clip range. Behavioural tests: where the gradient must vanish (clip, dual clip, mask), the dual-clip cap,
the asymmetric clip range. Gradient accumulation: the full-batch gradient equals the sum of (micro-batch loss / k)
gradients, the arithmetic of `ActorWorker.run_training`.
"""

import math

import pytest
import torch

from rlinf_mini.models.mlp_policy import MLPPolicy
from stages.train import compute_critic_loss, compute_ppo_actor_loss, masked_mean

SEEDS = [0, 1, 2]
CLIPS = [(0.2, 0.2, 3.0), (0.1, 0.3, 2.0), (0.3, 0.05, 10.0)]  # (clip_ratio_low, clip_ratio_high, clip_ratio_c)
N = 400


def make_actor_inputs(seed: int, n: int = N):
    """float64 logprobs, old_logprobs, advantages, loss_mask [n]; ratios exp(U(-3, 3)) in [0.05, 20]; some A == 0."""
    g = torch.Generator().manual_seed(seed)
    old_logprobs = torch.randn(n, generator=g, dtype=torch.float64) * 2 - 1
    logprobs = old_logprobs + (torch.rand(n, generator=g, dtype=torch.float64) * 6 - 3)
    advantages = torch.randn(n, generator=g, dtype=torch.float64) * 2
    advantages[torch.rand(n, generator=g) < 0.05] = 0.0
    loss_mask = (torch.rand(n, generator=g) < 0.7).to(torch.float64)
    return logprobs, old_logprobs, advantages, loss_mask


def make_critic_inputs(seed: int, n: int = N):
    """float64 values, old_values, returns, loss_mask [n]; |V - V_old| up to 2, so clipping is often active."""
    g = torch.Generator().manual_seed(seed)
    old_values = torch.randn(n, generator=g, dtype=torch.float64)
    values = old_values + (torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2)
    returns = torch.randn(n, generator=g, dtype=torch.float64) * 2
    loss_mask = (torch.rand(n, generator=g) < 0.7).to(torch.float64)
    return values, old_values, returns, loss_mask


# ---------------------------------------------------------------------------------------------------------------------
# Plain-Python references: scalar floats, one sample at a time


def ref_masked_mean(xs, mask):
    return sum(x * m for x, m in zip(xs, mask, strict=True)) / max(sum(mask), 1.0)


def ref_ppo_actor(logprobs, old_logprobs, advantages, loss_mask, low, high, c):
    """Per sample: loss, clip active, dual clip active, d loss / d logprob (before the mask and the mean)."""
    losses, clipped, dual, dloss = [], [], [], []
    for lp, olp, a in zip(logprobs.tolist(), old_logprobs.tolist(), advantages.tolist(), strict=True):
        r = math.exp(lp - olp)
        unclipped = -a * r
        clipped_term = -a * min(max(r, 1 - low), 1 + high)
        loss = max(unclipped, clipped_term)
        is_dual = a < 0 and -a * c < loss
        if is_dual:
            loss = -a * c
        is_clipped = (a > 0 and r > 1 + high) or (a < 0 and r < 1 - low)
        losses.append(loss)
        clipped.append(float(is_clipped))
        dual.append(float(is_dual))
        # d(-a r)/d logp = -a r; a clipped or capped sample is a constant in logp
        dloss.append(0.0 if (is_clipped or is_dual) else -a * r)
    mask = loss_mask.tolist()
    ratios = [math.exp(lp - olp) for lp, olp in zip(logprobs.tolist(), old_logprobs.tolist(), strict=True)]
    return {
        "loss": ref_masked_mean(losses, mask),
        "actor/ratio": ref_masked_mean(ratios, mask),
        "actor/approx_kl": ref_masked_mean([(r - 1) - math.log(r) for r in ratios], mask),
        "actor/clip_fraction": ref_masked_mean(clipped, mask),
        "actor/dual_clip_fraction": ref_masked_mean(dual, mask),
        "per_sample_loss": losses,
        "clipped": clipped,
        "dual": dual,
        "grad": [d * m / max(sum(mask), 1.0) for d, m in zip(dloss, mask, strict=True)],
    }


def ref_critic(values, old_values, returns, loss_mask, value_clip):
    losses, clipped = [], []
    for v, ov, ret in zip(values.tolist(), old_values.tolist(), returns.tolist(), strict=True):
        v_clipped = ov + min(max(v - ov, -value_clip), value_clip)
        losses.append(0.5 * max((v - ret) ** 2, (v_clipped - ret) ** 2))
        clipped.append(float(abs(v - ov) > value_clip))
    mask = loss_mask.tolist()
    return {"loss": ref_masked_mean(losses, mask), "critic/value_clip_ratio": ref_masked_mean(clipped, mask)}


def close(actual: torch.Tensor, expected: float, atol: float = 1e-10) -> bool:
    return abs(float(actual) - expected) <= atol + 1e-10 * abs(expected)


# ---------------------------------------------------------------------------------------------------------------------
# Oracle tests


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("low,high,c", CLIPS)
def test_ppo_actor_loss_matches_reference(seed, low, high, c):
    inputs = make_actor_inputs(seed)
    ref = ref_ppo_actor(*inputs, low, high, c)
    # the inputs reach every branch, among the samples that count
    mask = inputs[3].tolist()
    adv = inputs[2].tolist()
    assert sum(k * m for k, m in zip(ref["clipped"], mask, strict=True)) > 10
    assert sum(k * m for k, m in zip(ref["dual"], mask, strict=True)) > 10
    assert sum(m for k, d, m in zip(ref["clipped"], ref["dual"], mask, strict=True) if not k and not d) > 10
    assert sum(1 for a, m in zip(adv, mask, strict=True) if a > 0 and m) > 10
    assert sum(1 for a, m in zip(adv, mask, strict=True) if a < 0 and m) > 10
    assert sum(1 for m in mask if m == 0) > 10

    loss, metrics = compute_ppo_actor_loss(*inputs, low, high, c)
    assert close(loss, ref["loss"]), (float(loss), ref["loss"])
    for key in ("actor/ratio", "actor/approx_kl", "actor/clip_fraction", "actor/dual_clip_fraction"):
        assert close(metrics[key], ref[key]), (key, float(metrics[key]), ref[key])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("low,high,c", CLIPS)
def test_ppo_actor_gradient_matches_reference(seed, low, high, c):
    logprobs, old_logprobs, advantages, loss_mask = make_actor_inputs(seed)
    ref = ref_ppo_actor(logprobs, old_logprobs, advantages, loss_mask, low, high, c)
    logprobs = logprobs.clone().requires_grad_(True)
    loss, _ = compute_ppo_actor_loss(logprobs, old_logprobs, advantages, loss_mask, low, high, c)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor(ref["grad"], dtype=torch.float64), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("value_clip", [0.1, 0.2, 1.0])
def test_critic_loss_matches_reference(seed, value_clip):
    inputs = make_critic_inputs(seed)
    ref = ref_critic(*inputs, value_clip)
    assert 0.1 < ref["critic/value_clip_ratio"] < 0.99  # both clipped and unclipped samples count
    loss, metrics = compute_critic_loss(*inputs, value_clip)
    assert close(loss, ref["loss"]), (float(loss), ref["loss"])
    assert close(metrics["critic/value_clip_ratio"], ref["critic/value_clip_ratio"])


def test_critic_loss_takes_the_larger_error():
    # V_old = 0, clip 0.2, R = 1: V = 0.5 -> V_clipped = 0.2; errors 0.25 and 0.64 -> 0.5 * 0.64 (pessimistic)
    # V = -0.5 -> V_clipped = -0.2; errors 2.25 and 1.44 -> 0.5 * 2.25 (the clip never lowers the loss)
    for v, expected in ((0.5, 0.32), (-0.5, 1.125), (0.1, 0.405)):
        loss, _ = compute_critic_loss(torch.tensor([v]), torch.tensor([0.0]), torch.tensor([1.0]), torch.ones(1), 0.2)
        assert abs(float(loss) - expected) < 1e-6, (v, float(loss), expected)


def test_masked_mean():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    assert float(masked_mean(x, torch.tensor([1.0, 1.0, 1.0, 0.0]))) == 2.0  # masked sample is left out
    assert float(masked_mean(x, torch.zeros(4))) == 0.0  # nothing counts: 0, not NaN


# ---------------------------------------------------------------------------------------------------------------------
# Behaviour: where the gradient vanishes, the dual-clip cap, the asymmetric range

LOW, HIGH, C = 0.2, 0.2, 3.0


def actor_grad(ratio: float, advantage: float, mask: float = 1.0, low=LOW, high=HIGH, c=C):
    """Loss and d loss / d logprob of a single sample with the given ratio."""
    logprobs = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_ppo_actor_loss(logprobs, torch.zeros(1, dtype=torch.float64),
                                     torch.tensor([advantage], dtype=torch.float64),
                                     torch.tensor([mask], dtype=torch.float64), low, high, c)
    loss.backward()
    return float(loss.detach()), float(logprobs.grad[0])


@pytest.mark.parametrize("ratio,advantage,why", [
    (1.5, 1.0, "clip: A > 0 and ratio > 1 + high"),
    (20.0, 2.0, "clip: A > 0 and ratio >> 1 + high"),
    (0.5, -1.0, "clip: A < 0 and ratio < 1 - low"),
    (0.01, -3.0, "clip: A < 0 and ratio << 1 - low"),
    (5.0, -1.0, "dual clip: A < 0 and ratio > clip_ratio_c"),
    (100.0, -0.5, "dual clip: A < 0 and ratio >> clip_ratio_c"),
])
def test_gradient_is_zero_where_a_clip_is_active(ratio, advantage, why):
    _, grad = actor_grad(ratio, advantage)
    assert grad == 0.0, why


@pytest.mark.parametrize("ratio,advantage,why", [
    (1.1, 1.0, "inside the trust region, A > 0"),
    (0.9, -1.0, "inside the trust region, A < 0"),
    (1.0, 0.7, "ratio 1"),
    (0.5, 1.0, "A > 0 below 1 - low: the unclipped term is the larger loss, no clip"),
    (2.0, -1.0, "A < 0 above 1 + high but below clip_ratio_c: no clip"),
])
def test_gradient_is_minus_a_times_ratio_where_no_clip_is_active(ratio, advantage, why):
    _, grad = actor_grad(ratio, advantage)
    assert abs(grad - (-advantage * ratio)) < 1e-12, (why, grad)


def test_masked_sample_gets_no_gradient():
    logprobs = torch.tensor([0.05, -0.05], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_ppo_actor_loss(logprobs, torch.zeros(2, dtype=torch.float64),
                                     torch.tensor([1.0, 1.0], dtype=torch.float64),
                                     torch.tensor([1.0, 0.0], dtype=torch.float64), LOW, HIGH, C)
    loss.backward()
    assert logprobs.grad[1] == 0.0 and logprobs.grad[0] != 0.0


@pytest.mark.parametrize("advantage", [-0.3, -1.0, -4.0])
def test_dual_clip_caps_the_loss_at_minus_a_times_c(advantage):
    for ratio in (1.0, 2.0, 2.999, 3.001, 10.0, 1e4):
        loss, _ = actor_grad(ratio, advantage)
        expected = min(-advantage * max(ratio, 1 - LOW), -advantage * C)
        assert abs(loss - expected) < 1e-9 * max(1.0, abs(expected)), (ratio, loss, expected)
        assert loss <= -advantage * C + 1e-12


def test_dual_clip_leaves_positive_advantages_alone():
    # A > 0: the loss is max(-A r, -A clip(r)); capping it with min(., -A c) would give -A c = -3 here
    assert abs(actor_grad(1e4, 1.0)[0] - (-(1 + HIGH))) < 1e-12
    assert abs(actor_grad(0.01, 1.0)[0] - (-0.01)) < 1e-12


def test_asymmetric_clip_uses_low_and_high_separately():
    low, high = 0.1, 0.3
    # A > 0: the upper bound is 1 + high = 1.3 (not 1 + low = 1.1)
    assert abs(actor_grad(1.25, 1.0, low=low, high=high)[0] - (-1.25)) < 1e-12
    assert actor_grad(1.25, 1.0, low=low, high=high)[1] != 0.0
    assert abs(actor_grad(1.35, 1.0, low=low, high=high)[0] - (-1.3)) < 1e-12
    assert actor_grad(1.35, 1.0, low=low, high=high)[1] == 0.0
    # A < 0: the lower bound is 1 - low = 0.9 (not 1 - high = 0.7)
    assert abs(actor_grad(0.85, -1.0, low=low, high=high)[0] - 0.9) < 1e-12
    assert actor_grad(0.85, -1.0, low=low, high=high)[1] == 0.0
    assert abs(actor_grad(0.95, -1.0, low=low, high=high)[0] - 0.95) < 1e-12
    assert actor_grad(0.95, -1.0, low=low, high=high)[1] != 0.0
    # and the clip fraction counts with the same bounds
    lp = torch.log(torch.tensor([1.25, 1.35, 0.85, 0.95], dtype=torch.float64))
    _, metrics = compute_ppo_actor_loss(lp, torch.zeros(4, dtype=torch.float64),
                                        torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64),
                                        torch.ones(4, dtype=torch.float64), low, high, 3.0)
    assert float(metrics["actor/clip_fraction"]) == 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Gradient accumulation: full batch == sum over k equal micro-batches of (loss / k), all-ones masks


def make_policy_batch(discrete: bool, n: int = 24, seed: int = 0):
    torch.manual_seed(seed)
    policy = MLPPolicy(obs_dim=5, action_dim=3, discrete=discrete, num_action_chunks=2, hidden_dim=16)
    g = torch.Generator().manual_seed(seed + 1)
    obs = torch.randn(n, 5, generator=g)
    noise = torch.rand(n, 2 * 3, generator=g).clamp(1e-4, 1 - 1e-4)
    with torch.no_grad():
        out = policy.predict_action_batch(obs, noise)
    batch = {
        "obs": obs,
        "actions": out["actions"],
        # old logprobs off by up to +-0.5: ratios in [0.6, 1.65], so the clip is active on some samples
        "old_logprobs": out["logprobs"] + torch.rand(n, generator=g) - 0.5,
        "old_values": out["values"] + 0.5 * torch.randn(n, generator=g),
        "advantages": torch.randn(n, generator=g),
        "returns": torch.randn(n, generator=g),
        "loss_mask": torch.ones(n),
    }
    return policy, batch


def ppo_loss(policy: MLPPolicy, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of ActorWorker._micro_batch_loss (loss_type actor_critic, entropy bonus and value loss on)."""
    out = policy.default_forward(mb["obs"], mb["actions"], compute_values=True)
    pg_loss, _ = compute_ppo_actor_loss(out["logprobs"], mb["old_logprobs"], mb["advantages"], mb["loss_mask"],
                                        0.2, 0.2, 3.0)
    v_loss, _ = compute_critic_loss(out["values"], mb["old_values"], mb["returns"], mb["loss_mask"], 0.2)
    return pg_loss - 0.01 * masked_mean(out["entropy"], mb["loss_mask"]) + 0.5 * v_loss


def full_batch_grads(policy, batch):
    policy.zero_grad(set_to_none=True)
    ppo_loss(policy, batch).backward()
    return [p.grad.clone() for p in policy.parameters()]


def accumulated_grads(policy, batch, k: int, divide: bool = True):
    """run_training's loop: k micro-batches, each (loss / k).backward() into the same .grad."""
    policy.zero_grad(set_to_none=True)
    n = batch["obs"].shape[0]
    size = n // k
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(123))  # micro-batches need not be contiguous
    for m in range(k):
        idx = perm[m * size : (m + 1) * size]
        loss = ppo_loss(policy, {name: v[idx] for name, v in batch.items()})
        (loss / k if divide else loss).backward()
    return [p.grad.clone() for p in policy.parameters()]


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("k", [2, 3, 6])
def test_gradient_accumulation_matches_full_batch(discrete, k):
    policy, batch = make_policy_batch(discrete)
    full = full_batch_grads(policy, batch)
    assert all(g.abs().max() > 1e-4 for g in full)  # every parameter gets a gradient worth comparing
    accum = accumulated_grads(policy, batch, k)
    for (name, _), a, f in zip(policy.named_parameters(), accum, full, strict=True):
        torch.testing.assert_close(a, f, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_gradient_accumulation_check_detects_a_missing_division():
    # the comparison above is sensitive: forgetting "/ k" gives k times the gradient
    policy, batch = make_policy_batch(discrete=False)
    full = full_batch_grads(policy, batch)
    wrong = accumulated_grads(policy, batch, 4, divide=False)
    for a, f in zip(wrong, full, strict=True):
        torch.testing.assert_close(a, 4 * f, atol=1e-6, rtol=1e-5)
    assert not all(torch.allclose(a, f, atol=1e-6, rtol=1e-5) for a, f in zip(wrong, full, strict=True))
