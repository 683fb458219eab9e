"""GRPO's options against the papers' equations, written as plain loops: algorithm.scale_rewards (group: GRPO;
batch; none: Dr. GRPO, arXiv 2503.20783) and algorithm.importance_sampling_level (token: GRPO; sequence: GSPO,
arXiv 2507.18071), with an all-equal group, a one-token response and padding among the inputs."""

from __future__ import annotations

import math
import types

import pytest
import torch

from stages.reasoning_train import compute_grpo_token_advantages, grpo_policy_loss

G = 4
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0])  # group 2 all equal
LENGTHS = [3, 1, 5, 2, 5, 4, 1, 3, 2, 5, 4, 3]  # response tokens; the rest of R = 5 is padding
MASK = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in LENGTHS])  # [N, R]


def mean(xs):
    return sum(xs) / len(xs)


def std(xs):  # unbiased, as torch.std and RLinf
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_per_scale_rewards_against_the_equations(scale):
    adv = compute_grpo_token_advantages(REWARDS, MASK, G, scale)
    r = REWARDS.tolist()
    for i in range(len(r)):
        group = r[i // G * G : i // G * G + G]
        want = r[i] - mean(group)
        if scale == "group":
            want /= std(group) + 1e-6
        elif scale == "batch":
            want /= std(r) + 1e-6
        for t in range(5):
            assert float(adv[i, t]) == pytest.approx(want if t < LENGTHS[i] else 0.0, abs=1e-6)
    assert torch.all(adv[4:8] == 0)  # an all-equal group carries no signal, whatever the scaling


def algo(level: str, agg: str, c: float | None = None):
    return types.SimpleNamespace(importance_sampling_level=level, loss_agg_func=agg, clip_ratio_low=0.2,
                                 clip_ratio_high=0.28, clip_ratio_c=c)


def clipped(ratio: float, a: float, c: float | None) -> float:
    loss = max(-a * ratio, -a * min(max(ratio, 1 - 0.2), 1 + 0.28))
    return min(loss, -a * c) if c is not None and a < 0 else loss


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_policy_loss_against_grpo_and_gspo_loops(level, agg):
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(12, 5, generator=gen) * 0.3 - 1.0
    new = old + torch.randn(12, 5, generator=gen) * 0.4  # ratios on both sides of the clip
    adv = compute_grpo_token_advantages(REWARDS, MASK, G)
    got, _ = grpo_policy_loss(new, old, adv, MASK, algo(level, agg, c=3.0))
    per_token = []  # [i][t] the loss of token t of response i
    for i, n in enumerate(LENGTHS):
        if level == "sequence":  # GSPO: s_i = exp(mean_t log(pi / pi_old)), one clipped term per response
            s = math.exp(mean([float(new[i, t] - old[i, t]) for t in range(n)]))
            per_token.append([clipped(s, float(adv[i, 0]), 3.0)] * n)
        else:
            per_token.append([clipped(math.exp(float(new[i, t] - old[i, t])), float(adv[i, t]), 3.0)
                              for t in range(n)])
    if agg == "token-mean":
        want = sum(map(sum, per_token)) / sum(LENGTHS)
    elif agg == "seq-mean-token-sum":
        want = mean([sum(x) for x in per_token])
    else:
        want = mean([mean(x) for x in per_token])
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_gspo_gradient_moves_every_token_of_a_response_by_its_sequence_ratio():
    # d/d logp_t of -A s with s = exp(mean log-ratio) is -A s / |y| for every token t of the response (no clip)
    old = torch.zeros(1, 4)
    new = torch.full((1, 4), 0.05, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = torch.full((1, 4), 1.0) * mask
    loss, _ = grpo_policy_loss(new, old, adv, mask, algo("sequence", "seq-mean-token-mean"))
    loss.backward()
    s = math.exp(0.05)
    assert new.grad[0, :3].tolist() == pytest.approx([-s / 3] * 3, rel=1e-5) and float(new.grad[0, 3]) == 0.0
