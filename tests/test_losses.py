"""Tests for stages/losses.py (`compute_ppo_actor_loss`, `compute_ppo_critic_loss`, `kl_penalty`, `masked_mean`) and
the update in stages/train.py (`compute_micro_batch_loss`, `update_policy`, what the actor worker calls).

Oracle tests (as in minGPT's test_huggingface_import): each loss and each of its metrics against a plain per-sample
Python reference written from RLinf's formulas (rlinf/algorithms/losses.py, utils.py), in float64, with masked
samples and ratios far outside the clip range. Behavioural tests: where the gradient must vanish (clip, dual clip,
mask), the dual-clip cap, the asymmetric clip range. The update: `update_policy` with k micro-batches takes the
same optimizer step as the full-batch gradient of `compute_micro_batch_loss`.
"""

import math

import pytest
import torch

import stages.train
from rlinf_mini.config import TrainConfig
from rlinf_mini.models.mlp_policy import MLPPolicy
from stages.losses import compute_ppo_actor_loss, compute_ppo_critic_loss, kl_penalty, masked_mean
from stages.train import compute_micro_batch_loss, update_policy

SEEDS = [0, 1, 2]
CLIPS = [(0.2, 0.2, 3.0), (0.1, 0.3, 2.0), (0.3, 0.05, 10.0), (0.2, 0.2, None)]  # (low, high, c); None: no dual
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
        is_dual = c is not None and a < 0 and -a * c < loss
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


def ref_huber(e, delta):
    return 0.5 * e * e if abs(e) < delta else delta * (abs(e) - 0.5 * delta)


def ref_critic(values, old_values, returns, loss_mask, value_clip, huber_delta):
    losses, clipped = [], []
    for v, ov, ret in zip(values.tolist(), old_values.tolist(), returns.tolist(), strict=True):
        v_clipped = ov + min(max(v - ov, -value_clip), value_clip)
        losses.append(max(ref_huber(ret - v, huber_delta), ref_huber(ret - v_clipped, huber_delta)))
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
    assert sum(k * m for k, m in zip(ref["dual"], mask, strict=True)) > (10 if c is not None else -1)
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
@pytest.mark.parametrize("huber_delta", [0.5, 1.0, 10.0])
def test_critic_loss_matches_reference(seed, value_clip, huber_delta):
    inputs = make_critic_inputs(seed)
    ref = ref_critic(*inputs, value_clip, huber_delta)
    assert 0.1 < ref["critic/value_clip_ratio"] < 0.99  # both clipped and unclipped samples count
    loss, metrics = compute_ppo_critic_loss(*inputs, value_clip, huber_delta)
    assert close(loss, ref["loss"]), (float(loss), ref["loss"])
    assert close(metrics["critic/value_clip_ratio"], ref["critic/value_clip_ratio"])


def test_critic_loss_takes_the_larger_error_and_is_linear_beyond_huber_delta():
    # V_old = 0, clip 0.2, R = 1: V = 0.5 -> V_clipped = 0.2; errors 0.5 and 0.8 -> 0.5 * 0.64 (pessimistic)
    # V = -0.5 -> V_clipped = -0.2; errors 1.5 and 1.2 -> 0.5 * 2.25 (the clip never lowers the loss)
    for v, expected in ((0.5, 0.32), (-0.5, 1.125), (0.1, 0.405)):
        loss, _ = compute_ppo_critic_loss(torch.tensor([v]), torch.tensor([0.0]), torch.tensor([1.0]), torch.ones(1),
                                          0.2, huber_delta=10.0)
        assert abs(float(loss) - expected) < 1e-6, (v, float(loss), expected)
    # huber_delta 1: an error of 1.5 costs 1 * (1.5 - 0.5) = 1.0, not 0.5 * 1.5^2
    loss, _ = compute_ppo_critic_loss(torch.tensor([-0.5]), torch.tensor([0.0]), torch.tensor([1.0]), torch.ones(1),
                                      0.2, huber_delta=1.0)
    assert abs(float(loss) - 1.0) < 1e-6


@pytest.mark.parametrize("kl_type", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalty_matches_reference(kl_type):
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(200, generator=g, dtype=torch.float64) * 8  # differences up to ~+-40: the clamps act
    ref_logprobs = torch.randn(200, generator=g, dtype=torch.float64) * 8
    expected = []
    for lp, ref in zip(logprobs.tolist(), ref_logprobs.tolist(), strict=True):
        if kl_type in ("kl", "k1"):
            expected.append(lp - ref)
        elif kl_type == "abs":
            expected.append(abs(lp - ref))
        elif kl_type in ("mse", "k2"):
            expected.append(0.5 * (lp - ref) ** 2)
        else:  # Schulman's k3 on log(ref / policy), clamped as RLinf does
            x = min(max(ref - lp, -20.0), 20.0)
            expected.append(min(max(math.exp(x) - x - 1, -10.0), 10.0))
    torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, kl_type), torch.tensor(expected, dtype=torch.float64))
    assert float(kl_penalty(logprobs, logprobs, kl_type).abs().max()) == 0.0  # no penalty at the reference


def test_kl_penalty_rejects_an_unknown_type():
    with pytest.raises(ValueError, match="kl_penalty_type"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "full")


def test_the_loss_functions_stay_importable_from_stages_train():
    assert stages.train.compute_ppo_actor_loss is compute_ppo_actor_loss and stages.train.masked_mean is masked_mean


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
# The update: update_policy (what ActorWorker.run_training calls) against one step on the full-batch gradient


def make_policy_batch(discrete: bool, n: int = 24, seed: int = 0):
    torch.manual_seed(seed)
    policy = MLPPolicy(obs_dim=5, action_dim=3, discrete=discrete, num_action_chunks=2, hidden_dim=16)
    g = torch.Generator().manual_seed(seed + 1)
    obs = torch.randn(n, 5, generator=g)
    noise = torch.rand(n, 2 * 3, generator=g).clamp(1e-4, 1 - 1e-4)
    with torch.no_grad():
        out = policy.predict_action_batch(obs, noise)
    flat = {
        "obs": obs,
        "actions": out["actions"],
        # old logprobs off by up to +-0.5: ratios in [0.6, 1.65], so the clip is active on some samples
        "old_logprobs": out["logprobs"] + torch.rand(n, generator=g) - 0.5,
        "old_values": out["values"] + 0.5 * torch.randn(n, generator=g),
        "advantages": torch.randn(n, generator=g),
        "returns": torch.randn(n, generator=g),
        # all ones: a micro-batch's masked mean / k sums to the full batch's only when every micro-batch counts as
        # many samples (RLinf's accumulation has the same property); masks are covered by the oracle tests above
        "loss_mask": torch.ones(n),
        "ref_logprobs": out["logprobs"] + 0.3 * torch.randn(n, generator=g),
    }
    return policy, flat


def update_cfg(n: int, k: int, update_epoch: int = 1) -> TrainConfig:
    cfg = TrainConfig()
    cfg.actor.global_batch_size, cfg.actor.micro_batch_size, cfg.actor.optim.clip_grad = n, n // k, 0.0
    cfg.algorithm.update_epoch, cfg.algorithm.entropy_bonus, cfg.algorithm.kl_beta = update_epoch, 0.01, 0.1
    cfg.algorithm.huber_delta = 0.5  # the value errors reach both sides of it
    return cfg


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_update_policy_with_k_micro_batches_takes_the_full_batch_step(discrete, k):
    policy, flat = make_policy_batch(discrete)
    cfg = update_cfg(24, k)
    loss, _ = compute_micro_batch_loss(policy, flat, cfg)  # the full batch at once
    grads = torch.autograd.grad(loss, list(policy.parameters()))
    assert all(g.abs().max() > 1e-4 for g in grads)  # every parameter gets a gradient worth comparing
    expected = [p.detach() - 0.1 * g for p, g in zip(policy.parameters(), grads, strict=True)]
    means, skipped = update_policy(policy, torch.optim.SGD(policy.parameters(), lr=0.1), flat, cfg)
    assert skipped == 0 and {"actor/policy_loss", "critic/value_loss", "actor/kl_loss"} <= means.keys()
    for (name, p), e in zip(policy.named_parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("update_epoch", [1, 3])
def test_update_policy_takes_update_epoch_times_batch_over_global_batch_steps(update_epoch):
    policy, flat = make_policy_batch(False)
    cfg = update_cfg(8, 2, update_epoch)  # 24 samples, global batch 8: 3 steps per epoch
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    update_policy(policy, optimizer, flat, cfg)
    assert len(steps) == 3 * update_epoch


def test_update_policy_stops_on_a_non_finite_loss():
    policy, flat = make_policy_batch(False)
    flat["advantages"][0] = float("nan")
    with pytest.raises(stages.train.NonFiniteError):
        update_policy(policy, torch.optim.SGD(policy.parameters(), lr=0.01), flat, update_cfg(24, 1))


def _lrs_along(optim, steps: int, base_lr: float = 0.1) -> list[float]:
    """The lr of each of `steps` optimizer steps under build_lr_scheduler, two groups (lr and value_lr) at once."""
    from stages.train import build_lr_scheduler

    w = torch.nn.Parameter(torch.zeros(1))
    v = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [w], "lr": base_lr}, {"params": [v], "lr": base_lr / 2}])
    sched = build_lr_scheduler(opt, optim)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        assert opt.param_groups[1]["lr"] == pytest.approx(out[-1] / 2)  # every group scaled alike
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("warmup,ratio,floor", [(3, 0.0, {"min_lr_rate": 0.1}), (-1, 0.2, {"min_lr": 0.02}),
                                                (0, 0.0, {})])
def test_cosine_schedule_is_rlinfs(warmup, ratio, floor):
    """RLinf's FSDP actor (get_lr_scheduler 'cosine' = transformers' cosine-with-min-lr): linear warmup from 0, then
    a half cosine from lr to the floor over total_training_steps; written out here step by step."""
    from rlinf_mini.config.schema import OptimConfig

    total, lr = 10, 0.1
    optim = OptimConfig(lr=lr, lr_scheduler="cosine", lr_warmup_steps=warmup, lr_warmup_steps_ratio=ratio,
                        total_training_steps=total, **floor)
    w = warmup if warmup >= 0 else int(ratio * total)
    rate = floor.get("min_lr_rate", floor.get("min_lr", 0.0) / lr)
    expected = [lr * s / w if s < w else
                lr * (rate + (1 - rate) * 0.5 * (1 + math.cos(math.pi * (s - w) / (total - w)))) for s in range(total)]
    assert _lrs_along(optim, total, lr) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert _lrs_along(optim, total + 1, lr)[-1] == pytest.approx(lr * rate)  # the floor at total_training_steps


def test_constant_schedule_warms_up_then_holds():
    from rlinf_mini.config.schema import OptimConfig

    assert _lrs_along(OptimConfig(), 4) == [0.1] * 4  # the default: no schedule at all
    assert _lrs_along(OptimConfig(lr_warmup_steps=4), 6) == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
