"""Tests for stages/advantages.py.

Oracle tests (as in minGPT's test_huggingface_import): every function against a plain per-env, per-step Python loop
on scalar floats, on random rewards, values and dones. Invariant tests: properties that hold whatever the inputs.
"""

import math
import statistics

import pytest
import torch

from rlinf_mini.config import AlgorithmConfig
from stages.advantages import (
    calculate_adv_and_returns,
    compute_gae_advantages_and_returns,
    compute_grpo_advantages,
    compute_reinpp_advantages,
    first_episode_mask,
    normalize_advantages,
)

SEEDS = [0, 1, 2]
TS = [1, 7, 33]
BS = [1, 4, 12]
GROUPED_BS_GS = [(4, 2), (4, 4), (12, 3), (12, 4)]  # (B, G) with B % G == 0 and G >= 2


def make_rollout(seed: int, T: int, B: int, done_prob: float = 0.2):
    """Random rewards [T, B], values [T+1, B], dones [T, B] bool."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g)
    values = torch.randn(T + 1, B, generator=g)
    dones = torch.rand(T, B, generator=g) < done_prob
    return rewards, values, dones


def close(actual: torch.Tensor, expected) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Plain-Python references: scalar floats, for b: for t (reversed where it recurses)


def ref_gae(rewards, values, dones, gamma, gae_lambda):
    r, v, d = rewards.tolist(), values.tolist(), dones.tolist()
    T, B = len(r), len(r[0])
    adv = [[0.0] * B for _ in range(T)]
    ret = [[0.0] * B for _ in range(T)]
    for b in range(B):
        lastgaelam = 0.0
        for t in reversed(range(T)):
            nonterminal = 0.0 if d[t][b] else 1.0
            delta = r[t][b] + gamma * v[t + 1][b] * nonterminal - v[t][b]
            lastgaelam = delta + gamma * gae_lambda * nonterminal * lastgaelam
            adv[t][b] = lastgaelam
            ret[t][b] = lastgaelam + v[t][b]
    return adv, ret


def ref_first_episode_mask(dones):
    d = dones.tolist()
    T, B = len(d), len(d[0])
    mask = [[False] * B for _ in range(T)]
    for b in range(B):
        alive = True
        for t in range(T):
            mask[t][b] = alive
            if d[t][b]:
                alive = False
    return mask


def ref_scores(rewards, dones):
    r, mask = rewards.tolist(), ref_first_episode_mask(dones)
    T, B = len(r), len(r[0])
    return [sum(r[t][b] for t in range(T) if mask[t][b]) for b in range(B)]


def ref_grpo(rewards, dones, group_size, eps=1e-6):
    scores, mask = ref_scores(rewards, dones), ref_first_episode_mask(dones)
    T, B = len(mask), len(mask[0])
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        group = scores[b // group_size * group_size : (b // group_size + 1) * group_size]
        a = (scores[b] - statistics.mean(group)) / (statistics.stdev(group) + eps)  # stdev: unbiased
        for t in range(T):
            adv[t][b] = a if mask[t][b] else 0.0
    return adv, mask


def ref_reinpp(rewards, dones, gamma, group_size, use_reinpp_baseline):
    r, d = rewards.tolist(), dones.tolist()
    T, B = len(r), len(r[0])
    ret = [[0.0] * B for _ in range(T)]
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            running = r[t][b] + gamma * running * (0.0 if d[t][b] else 1.0)
            ret[t][b] = running
    adv = [row[:] for row in ret]
    if use_reinpp_baseline:
        scores = ref_scores(rewards, dones)
        for b in range(B):
            baseline = statistics.mean(scores[b // group_size * group_size : (b // group_size + 1) * group_size])
            for t in range(T):
                adv[t][b] -= baseline
    flat = [x for row in adv for x in row]
    mean = statistics.mean(flat)
    var = statistics.mean([(x - mean) ** 2 for x in flat])
    adv = [[(x - mean) / math.sqrt(max(var, 1e-8)) for x in row] for row in adv]
    return adv, ret


def ref_normalize(x, mask, eps=1e-8):
    xs, m = x.tolist(), mask.tolist()
    valid = [xs[t][b] for t in range(len(xs)) for b in range(len(xs[0])) if m[t][b]]
    mean, std = statistics.mean(valid), statistics.pstdev(valid)
    return [[(v - mean) / (std + eps) if m[t][b] else 0.0 for b, v in enumerate(row)] for t, row in enumerate(xs)]


# ---------------------------------------------------------------------------------------------------------------------
# Oracle tests


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B", BS)
def test_gae_matches_reference_loop(seed, T, B):
    rewards, values, dones = make_rollout(seed, T, B)
    gamma, gae_lambda = 0.9 + 0.03 * seed, 0.8 + 0.05 * seed
    advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda)
    ref_adv, ref_ret = ref_gae(rewards, values, dones, gamma, gae_lambda)
    assert advantages.shape == returns.shape == (T, B)
    assert close(advantages, ref_adv)
    assert close(returns, ref_ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B", BS)
def test_first_episode_mask_matches_reference_loop(seed, T, B):
    _, _, dones = make_rollout(seed, T, B, done_prob=0.3)
    mask = first_episode_mask(dones)
    assert mask.dtype == torch.bool
    assert mask.tolist() == ref_first_episode_mask(dones)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize(("B", "G"), GROUPED_BS_GS)
def test_grpo_matches_reference_loop(seed, T, B, G):
    rewards, _, dones = make_rollout(seed, T, B)
    advantages, loss_mask = compute_grpo_advantages(rewards, dones, G)
    ref_adv, ref_mask = ref_grpo(rewards, dones, G)
    assert close(advantages, ref_adv)
    assert loss_mask.tolist() == ref_mask


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize(("B", "G"), [(1, 1), *GROUPED_BS_GS])
@pytest.mark.parametrize("use_reinpp_baseline", [False, True])
def test_reinpp_matches_reference_loop(seed, T, B, G, use_reinpp_baseline):
    rewards, _, dones = make_rollout(seed, T, B)
    gamma = 0.95
    advantages, returns = compute_reinpp_advantages(rewards, dones, gamma, G, use_reinpp_baseline)
    ref_adv, ref_ret = ref_reinpp(rewards, dones, gamma, G, use_reinpp_baseline)
    assert close(returns, ref_ret)
    assert close(advantages, ref_adv)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B", [4, 12])
def test_normalize_advantages_matches_reference_loop(seed, T, B):
    rewards, _, dones = make_rollout(seed, T, B)
    mask = first_episode_mask(dones)
    assert close(normalize_advantages(rewards, mask), ref_normalize(rewards, mask))
    everything = torch.ones_like(mask)
    assert close(normalize_advantages(rewards), ref_normalize(rewards, everything))


# ---------------------------------------------------------------------------------------------------------------------
# Invariants: GAE


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_lambda_one_is_discounted_return_minus_value(seed):
    T, B, gamma = 33, 12, 0.97
    rewards, values, dones = make_rollout(seed, T, B)
    advantages, _ = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=1.0)
    r, v, d = rewards.tolist(), values.tolist(), dones.tolist()
    expected = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for t in range(T):  # forward sum to the episode's end, not the recursion under test
            total, k = 0.0, t
            while True:
                total += gamma ** (k - t) * r[k][b]
                if d[k][b]:
                    break
                if k == T - 1:  # rollout cut mid-episode: bootstrap with the value of the next obs
                    total += gamma ** (T - t) * v[T][b]
                    break
                k += 1
            expected[t][b] = total - v[t][b]
    assert close(advantages, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_lambda_zero_is_one_step_td_error(seed):
    rewards, values, dones = make_rollout(seed, 33, 12)
    gamma = 0.9
    advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=0.0)
    td_error = rewards + gamma * values[1:] * (~dones) - values[:-1]
    assert torch.allclose(advantages, td_error, atol=1e-6)
    assert torch.allclose(returns, rewards + gamma * values[1:] * (~dones), atol=1e-6)


def test_gae_does_not_bootstrap_across_a_done():
    rewards, values, dones = make_rollout(0, 10, 3, done_prob=0.0)
    dones[4, 1] = True
    before, _ = compute_gae_advantages_and_returns(rewards, values, dones, 0.99, 0.95)
    values[5, 1] += 100.0  # the first value of env 1's next episode
    after, _ = compute_gae_advantages_and_returns(rewards, values, dones, 0.99, 0.95)
    assert torch.equal(before[:5, 1], after[:5, 1])  # the ended episode does not see it
    assert not torch.allclose(before[5, 1], after[5, 1])  # the new episode does
    assert torch.equal(before[:, [0, 2]], after[:, [0, 2]])  # nor do the other envs


# ---------------------------------------------------------------------------------------------------------------------
# Invariants: GRPO and masks


def test_first_episode_mask_by_hand():
    dones = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1], [1, 1, 0, 1]], dtype=torch.bool)  # [T=3, B=4]
    expected = [[True, True, True, True], [True, False, True, True], [True, False, True, False]]
    assert first_episode_mask(dones).tolist() == expected


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("B", "G"), GROUPED_BS_GS)
def test_grpo_advantages_are_group_normalized_and_constant_over_the_episode(seed, B, G):
    rewards, _, dones = make_rollout(seed, 33, B)
    advantages, loss_mask = compute_grpo_advantages(rewards, dones, G)
    per_env = advantages[0]  # [B] step 0 is always in the first episode
    assert torch.allclose(per_env.view(-1, G).sum(dim=1), torch.zeros(B // G), atol=1e-5)
    assert torch.allclose(per_env.view(-1, G).std(dim=1), torch.ones(B // G), atol=1e-4)
    assert torch.equal(advantages, per_env.expand_as(advantages) * loss_mask)  # same value at every masked step
    assert torch.equal(advantages[~loss_mask], torch.zeros(int((~loss_mask).sum())))


def test_grpo_scores_only_the_first_episode():
    rewards = torch.zeros(4, 2)
    dones = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=torch.bool)
    rewards[0, 0] = 1.0  # env 0's first episode scores 1
    rewards[3, 0] = 50.0  # env 0's second episode: must not count
    rewards[2, 1] = 2.0  # env 1 never ends: its score is 2
    advantages, loss_mask = compute_grpo_advantages(rewards, dones, group_size=2)
    assert advantages[0, 0] < 0 < advantages[0, 1]
    assert loss_mask[:, 0].tolist() == [True, True, False, False]


def test_grpo_rejects_bad_groups():
    rewards, _, dones = make_rollout(0, 5, 6)
    with pytest.raises(ValueError, match="group_size"):
        compute_grpo_advantages(rewards, dones, group_size=4)
    with pytest.raises(ValueError, match="group_size"):
        compute_grpo_advantages(rewards, dones, group_size=1)


# ---------------------------------------------------------------------------------------------------------------------
# Invariants: Reinforce++ and normalization


@pytest.mark.parametrize("use_reinpp_baseline", [False, True])
def test_reinpp_advantages_are_whitened(use_reinpp_baseline):
    rewards, _, dones = make_rollout(3, 33, 12)
    advantages, _ = compute_reinpp_advantages(rewards, dones, 0.99, 4, use_reinpp_baseline)
    assert abs(advantages.mean().item()) < 1e-5
    assert abs(advantages.std(correction=0).item() - 1.0) < 1e-4


def test_reinpp_returns_without_dones_are_reverse_cumsum_at_gamma_one():
    rewards, _, _ = make_rollout(4, 7, 4)
    dones = torch.zeros(7, 4, dtype=torch.bool)
    _, returns = compute_reinpp_advantages(rewards, dones, 1.0, 1, False)
    assert torch.allclose(returns, rewards.flip(0).cumsum(0).flip(0), atol=1e-5)


def test_reinpp_baseline_changes_the_advantages():
    rewards, _, dones = make_rollout(5, 7, 4)
    without, returns_a = compute_reinpp_advantages(rewards, dones, 0.99, 2, False)
    with_baseline, returns_b = compute_reinpp_advantages(rewards, dones, 0.99, 2, True)
    assert torch.equal(returns_a, returns_b)  # the baseline goes into the advantages only
    assert not torch.allclose(without, with_baseline, atol=1e-3)


@pytest.mark.parametrize("seed", SEEDS)
def test_normalize_advantages_masked_statistics(seed):
    x, _, dones = make_rollout(seed, 33, 12)
    x = 3.0 * x + 5.0
    mask = first_episode_mask(dones)
    out = normalize_advantages(x, mask)
    assert abs(out[mask].mean().item()) < 1e-5
    assert abs(out[mask].std(correction=0).item() - 1.0) < 1e-5
    assert torch.equal(out[~mask], torch.zeros(int((~mask).sum())))
    x_changed = torch.where(mask, x, torch.full_like(x, 1e6))  # entries outside the mask do not move the statistics
    assert torch.allclose(normalize_advantages(x_changed, mask), out)


@pytest.mark.parametrize("value", [0.0, 0.1, -3.7, 250.0])
def test_normalize_advantages_of_a_constant_is_zero_not_noise(value):
    out = normalize_advantages(torch.full((33, 12), value))
    assert torch.equal(out, torch.zeros(33, 12))


def test_normalize_advantages_keeps_a_small_genuine_spread():
    x, _, _ = make_rollout(0, 33, 12)
    out = normalize_advantages(1e-4 * x + 1.0)  # std 1e-4 around a mean of 1: small, but real
    assert abs(out.std(correction=0).item() - 1.0) < 1e-2


# ---------------------------------------------------------------------------------------------------------------------
# Dispatch


@pytest.mark.parametrize("normalize_cfg", [False, True])
@pytest.mark.parametrize("normalize_arg", [None, False, True])
def test_calculate_dispatches_gae(normalize_cfg, normalize_arg):
    rewards, values, dones = make_rollout(0, 7, 4)
    cfg = AlgorithmConfig(adv_type="gae", gamma=0.9, gae_lambda=0.8, normalize_advantages=normalize_cfg)
    out = calculate_adv_and_returns(cfg, rewards, values, dones, normalize=normalize_arg)
    advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, 0.9, 0.8)
    normalize = normalize_cfg if normalize_arg is None else normalize_arg
    assert torch.allclose(out["advantages"], normalize_advantages(advantages) if normalize else advantages)
    assert torch.allclose(out["returns"], returns)
    assert out["loss_mask"].dtype == torch.bool and out["loss_mask"].shape == (7, 4) and out["loss_mask"].all()


def test_calculate_dispatches_grpo():
    rewards, _, dones = make_rollout(1, 7, 4)
    cfg = AlgorithmConfig(adv_type="grpo", group_size=2)
    out = calculate_adv_and_returns(cfg, rewards, None, dones)
    advantages, loss_mask = compute_grpo_advantages(rewards, dones, 2)
    assert torch.equal(out["advantages"], advantages)
    assert torch.equal(out["returns"], advantages)
    assert torch.equal(out["loss_mask"], loss_mask)


@pytest.mark.parametrize("use_reinpp_baseline", [False, True])
def test_calculate_dispatches_reinpp(use_reinpp_baseline):
    rewards, _, dones = make_rollout(2, 7, 4)
    cfg = AlgorithmConfig(adv_type="reinpp", gamma=0.9, group_size=2, use_reinpp_baseline=use_reinpp_baseline)
    out = calculate_adv_and_returns(cfg, rewards, None, dones)
    advantages, returns = compute_reinpp_advantages(rewards, dones, 0.9, 2, use_reinpp_baseline)
    assert torch.equal(out["advantages"], advantages)
    assert torch.equal(out["returns"], returns)
    assert out["loss_mask"].dtype == torch.bool and out["loss_mask"].all()


def test_calculate_rejects_unknown_adv_type_and_gae_without_values():
    rewards, values, dones = make_rollout(0, 7, 4)
    with pytest.raises(ValueError, match="adv_type"):
        calculate_adv_and_returns(AlgorithmConfig(adv_type="ppo"), rewards, values, dones)
    with pytest.raises(ValueError, match="values"):
        calculate_adv_and_returns(AlgorithmConfig(adv_type="gae"), rewards, None, dones)
