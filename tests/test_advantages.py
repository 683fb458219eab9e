"""Tests for stages/advantages.py.

Oracle tests (as in minGPT's test_huggingface_import): every function against a plain per-env, per-step Python loop
on scalar floats written from RLinf's formulas (rlinf/algorithms/advantages.py, utils.py), on random rewards, values
and dones (several auto-reset episodes per env), in float32 and float64, with masked entries. Where RLinf 0.3.0 is
wrong (Reinforce++'s end row, its baseline), the reference is what RLinf's comments say and a test shows the gap.
"""

import math
import statistics
import threading

import pytest
import torch

from rlinf_mini.config import AlgorithmConfig
from stages.advantages import (
    calculate_adv_and_returns,
    compute_gae_advantages_and_returns,
    compute_grpo_advantages,
    compute_reinpp_advantages,
    first_episode_mask,
    safe_normalize,
)
from stages.losses import kl_penalty

SEEDS = [0, 1, 2]
TS = [1, 7, 33]
BS = [1, 4, 12]
GROUPED_BS_GS = [(4, 2), (4, 4), (12, 3), (12, 4)]  # (B, G) with B % G == 0 and G >= 2


def make_rollout(seed: int, T: int, B: int, done_prob: float = 0.2, dtype=torch.float32):
    """Random rewards [T, B], values [T+1, B], dones [T, B] bool (auto-reset: an env may end several episodes)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64).to(dtype)
    values = torch.randn(T + 1, B, generator=g, dtype=torch.float64).to(dtype)
    dones = torch.rand(T, B, generator=g) < done_prob
    return rewards, values, dones


def close_atol(dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-5


def close(actual: torch.Tensor, expected) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=close_atol(actual.dtype))


DTYPES = [torch.float32, torch.float64]


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


def ref_critic_free_gae(rewards, dones):
    """RLinf without values: gamma = lambda = 1, delta = reward, so advantage = return = reward-to-go in the episode."""
    r, d = rewards.tolist(), dones.tolist()
    T, B = len(r), len(r[0])
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for t in range(T):
            total, k = 0.0, t
            while k < T:
                total += r[k][b]
                if d[k][b]:
                    break
                k += 1
            out[t][b] = total
    return out


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


def ref_reinpp(rewards, dones, group_size, use_reinpp_baseline, kl=None, kl_beta=0.0):
    """Per env column: the first-episode score (minus the group mean) at the episode's last step, minus kl_beta * kl
    at every step, summed from the end; whitened by the masked mean and masked population variance (>= 1e-8)."""
    scores, mask = ref_scores(rewards, dones), ref_first_episode_mask(dones)
    T, B = len(mask), len(mask[0])
    if use_reinpp_baseline:
        scores = [scores[b] - statistics.mean(scores[b // group_size * group_size:(b // group_size + 1) * group_size])
                  for b in range(B)]
    k = kl.tolist() if kl is not None else [[0.0] * B for _ in range(T)]
    ret = [[0.0] * B for _ in range(T)]
    for b in range(B):
        end = max(t for t in range(T) if mask[t][b])
        running = 0.0
        for t in reversed(range(T)):
            running += (scores[b] if t == end else 0.0) - kl_beta * k[t][b]
            ret[t][b] = running
    valid = [ret[t][b] for t in range(T) for b in range(B) if mask[t][b]]
    mean = statistics.mean(valid)
    var = statistics.mean([(x - mean) ** 2 for x in valid])
    adv = [[(x - mean) / math.sqrt(max(var, 1e-8)) for x in row] for row in ret]
    return adv, ret, mask


def ref_safe_normalize(x, mask):
    """RLinf's safe_normalize: mean and unbiased std over the masked entries, (x - mean) / (std + 1e-5) everywhere."""
    xs, m = x.tolist(), mask.tolist()
    valid = [xs[t][b] for t in range(len(xs)) for b in range(len(xs[0])) if m[t][b]]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    return [[(v - mean) / (std + 1e-5) for v in row] for row in xs]


# ---------------------------------------------------------------------------------------------------------------------
# Oracle tests


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B", BS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_matches_reference_loop(seed, T, B, dtype):
    rewards, values, dones = make_rollout(seed, T, B, dtype=dtype)
    gamma, gae_lambda = 0.9 + 0.03 * seed, 0.8 + 0.05 * seed
    advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda)
    ref_adv, ref_ret = ref_gae(rewards, values, dones, gamma, gae_lambda)
    assert advantages.shape == returns.shape == (T, B) and advantages.dtype == dtype
    assert close(advantages, ref_adv)
    assert close(returns, ref_ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_critic_free_gae_is_the_reward_to_go_whatever_gamma_and_lambda(seed, T, dtype):
    rewards, _, dones = make_rollout(seed, T, 5, done_prob=0.3, dtype=dtype)
    advantages, returns = compute_gae_advantages_and_returns(rewards, None, dones, gamma=0.5, gae_lambda=0.3)
    assert close(advantages, ref_critic_free_gae(rewards, dones)) and torch.equal(advantages, returns)


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
@pytest.mark.parametrize("dtype", DTYPES)
def test_reinpp_matches_reference_loop(seed, T, B, G, use_reinpp_baseline, dtype):
    rewards, _, dones = make_rollout(seed, T, B, dtype=dtype)
    kl = torch.rand(T, B, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    for kl_beta in (0.0, 0.3):
        advantages, returns, mask = compute_reinpp_advantages(rewards, dones, G, use_reinpp_baseline, kl, kl_beta)
        ref_adv, ref_ret, ref_mask = ref_reinpp(rewards, dones, G, use_reinpp_baseline, kl, kl_beta)
        assert mask.tolist() == ref_mask
        assert close(returns, ref_ret)
        # whitening divides the returns' rounding error by their std (>= 1e-4): scale the tolerance with it
        valid = returns[mask].double()
        scale = float(valid.abs().max().clamp(min=1) / valid.var(correction=0).clamp(min=1e-8).sqrt())
        atol = (1e-12 if dtype == torch.float64 else 1e-6) * scale
        assert torch.allclose(advantages, torch.tensor(ref_adv, dtype=dtype), atol=max(atol, close_atol(dtype)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T", [2, 7, 33])
@pytest.mark.parametrize("B", [4, 12])
@pytest.mark.parametrize("dtype", DTYPES)
def test_safe_normalize_matches_reference_loop(seed, T, B, dtype):
    rewards, _, dones = make_rollout(seed, T, B, dtype=dtype)
    mask = first_episode_mask(dones)
    assert close(safe_normalize(rewards, mask), ref_safe_normalize(rewards, mask))
    everything = torch.ones_like(mask)
    assert close(safe_normalize(rewards), ref_safe_normalize(rewards, everything))


# ---------------------------------------------------------------------------------------------------------------------
# Where RLinf 0.3.0 is wrong: Reinforce++ finds each env's end row in the mirrored column, and its baseline breaks


def rlinf_030_end_rows(loss_mask):
    """RLinf 0.3.0's `seq_length - 1 - loss_mask.fliplr().argmax(0)`: fliplr flips the env axis of [T, B] (meant:
    the step axis), so argmax reads another env's column from its first step."""
    return loss_mask.shape[0] - 1 - loss_mask.long().fliplr().argmax(dim=0)


def test_reinpp_places_each_score_at_its_own_episode_end_not_the_mirrored_one():
    rewards = torch.zeros(5, 2)
    dones = torch.zeros(5, 2, dtype=torch.bool)
    dones[1, 0] = True  # env 0's first episode ends at step 1; env 1 runs through step 4
    rewards[0, 0], rewards[3, 1] = 1.0, 2.0
    mask = first_episode_mask(dones)
    # RLinf 0.3.0 takes T - 1 - (first True row of the mirrored column): 4 for both, so env 0's score lands at
    # step 4, outside its episode, and its masked-in steps 0-1 get a return of 0
    assert rlinf_030_end_rows(mask).tolist() == [4, 4]
    _, returns, _ = compute_reinpp_advantages(rewards, dones, 1, False)
    # the score reaches every step of its own episode: env 0 rows 0-1 carry 1, env 1 rows 0-4 carry 2
    assert returns[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0] and returns[:, 1].tolist() == [2.0] * 5


def test_reinpp_baseline_works_where_rlinf_030_raises():
    rewards, _, dones = make_rollout(5, 7, 4)
    scores = (rewards * first_episode_mask(dones)).sum(0).view(2, 2)
    centred = (scores - scores.mean(dim=1, keepdim=True)).view(-1)  # [B] RLinf 0.3.0's baseline output: 1-D
    index = rlinf_030_end_rows(first_episode_mask(dones)).view(1, -1)  # [1, B]
    with pytest.raises(IndexError):  # what RLinf 0.3.0's scatter_ does with it
        torch.zeros(7, 4).scatter_(0, index, centred)
    advantages, _, _ = compute_reinpp_advantages(rewards, dones, 2, True)
    assert torch.isfinite(advantages).all()


# ---------------------------------------------------------------------------------------------------------------------
# Held-out oracle: RLinf 0.3.0's whole embodied path, as a plain loop of its rules (not its code): the env's dones
# padded to [T+1, B] with row 0 the bootstrap step's zeros (rlinf/workers/env/env_worker.py::bootstrap_step), read
# at t+1; the loss mask of rlinf/utils/metric_utils.py::compute_loss_mask (built only when env.train.auto_reset and
# ignore_terminations are off); calculate_scores; the actor passing neither normalize key
# (rlinf/workers/actor/fsdp_actor_worker.py:1241), so advantages are always whitened and returns never.


def rlinf_padded_dones(dones):
    d = [[bool(x) for x in row] for row in dones.tolist()]
    return [[False] * len(d[0])] + d  # [T+1][B]


def rlinf_loss_mask(dones):
    """compute_loss_mask: cumsum over the padded dones == 0, its last row dropped."""
    pd = rlinf_padded_dones(dones)
    T, B = len(pd) - 1, len(pd[0])
    mask = [[False] * B for _ in range(T)]
    for b in range(B):
        total = 0
        for t in range(T):
            total += pd[t][b]
            mask[t][b] = total == 0
    return mask


def rlinf_grpo(rewards, dones, group_size):
    r, pd, mask = rewards.tolist(), rlinf_padded_dones(dones), rlinf_loss_mask(dones)
    T, B = len(r), len(r[0])
    scores = [0.0] * B
    for t in reversed(range(T)):  # calculate_scores
        scores = [(0.0 if pd[t + 1][b] else scores[b]) + r[t][b] for b in range(B)]
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        group = scores[b // group_size * group_size:(b // group_size + 1) * group_size]
        a = (scores[b] - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
        for t in range(T):
            adv[t][b] = a * mask[t][b]
    return adv, mask


def rlinf_gae(rewards, values, dones, gamma, gae_lambda, mask):
    r, pd = rewards.tolist(), rlinf_padded_dones(dones)
    v = values.tolist() if values is not None else None
    T, B = len(r), len(r[0])
    if v is None:
        gamma, gae_lambda = 1.0, 1.0
    ret = [[0.0] * B for _ in range(T)]
    for b in range(B):
        gae = 0.0
        for t in reversed(range(T)):
            alive = 0.0 if pd[t + 1][b] else 1.0
            delta = r[t][b] if v is None else r[t][b] + gamma * v[t + 1][b] * alive - v[t][b]
            gae = delta + gamma * gae_lambda * alive * gae
            ret[t][b] = gae if v is None else gae + v[t][b]
    adv = [[ret[t][b] - (v[t][b] if v is not None else 0.0) for b in range(B)] for t in range(T)]
    valid = [adv[t][b] for t in range(T) for b in range(B) if mask is None or mask[t][b]]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    return [[(x - mean) / (std + 1e-5) for x in row] for row in adv], ret  # advantages whitened, returns not


def held_out_dones(T: int, B: int, seed: int):
    """Dones with the cases that differed: an env done at step 0, one done twice, one done at the last step only,
    one never done; the rest random."""
    dones = torch.rand(T, B, generator=torch.Generator().manual_seed(100 + seed)) < 0.25
    dones[:, 0] = False
    dones[0, 0] = True  # done at the first step: one step of loss mask
    dones[:, 1] = False
    dones[2, 1] = dones[T - 2, 1] = True  # two episodes: the second is not scored
    dones[:, 2] = False
    dones[T - 1, 2] = True  # done at the last step
    dones[:, 3] = False  # never done
    return dones


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize(("B", "G"), [(8, 2), (8, 4), (12, 3)])
def test_grpo_after_the_first_done_equals_rlinf(seed, B, G):
    T = 9
    rewards, _, _ = make_rollout(seed + 50, T, B, dtype=torch.float64)
    dones = held_out_dones(T, B, seed)
    last = slice(B - G, B)  # the last group: equal scores (std 0, so advantage 0), rewards after the done differ
    dones[:, last], rewards[:, last] = False, 0.0
    dones[4, last], rewards[1, last] = True, 1.0
    rewards[6:, last] = torch.arange(G, dtype=torch.float64)  # after the first done: not scored
    out = calculate_adv_and_returns(AlgorithmConfig(adv_type="grpo", group_size=G), rewards, None, dones)
    ref_adv, ref_mask = rlinf_grpo(rewards, dones, G)
    assert out["loss_mask"].tolist() == ref_mask
    assert close(out["advantages"], ref_adv)
    assert torch.equal(out["advantages"][:, last], torch.zeros(T, G, dtype=torch.float64))
    assert not out["loss_mask"][1:, 0].any() and out["loss_mask"][:, 3].all()  # done at step 0; never done


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("auto_reset", [False, True])
@pytest.mark.parametrize("value_head", [False, True])
def test_gae_equals_rlinf_with_its_loss_mask(seed, auto_reset, value_head):
    T, B = 9, 6
    rewards, values, _ = make_rollout(seed + 60, T, B, dtype=torch.float64)
    values = values if value_head else None
    dones = held_out_dones(T, B, seed)
    mask = None if auto_reset else rlinf_loss_mask(dones)
    ours_mask = None if auto_reset else first_episode_mask(dones)  # what the actor passes (stages/train.py)
    cfg = AlgorithmConfig(adv_type="gae", gamma=0.93, gae_lambda=0.9)  # normalize_returns: false, the only value
    out = calculate_adv_and_returns(cfg, rewards, values, dones, loss_mask=ours_mask)
    ref_adv, ref_ret = rlinf_gae(rewards, values, dones, 0.93, 0.9, mask)
    assert close(out["advantages"], ref_adv) and close(out["returns"], ref_ret)
    if mask is not None:
        assert out["loss_mask"].tolist() == mask


def test_normalize_returns_and_grpo_with_auto_reset_are_refused_by_name(tmp_path):
    """RLinf never whitens returns (the key is read nowhere) and builds GRPO's loss mask only without auto_reset or
    ignore_terminations (it fails without one): both refused, naming the key."""
    from rlinf_mini.config import ConfigError, load_config

    cases = [
        ("algorithm:\n  normalize_returns: true\n", "algorithm.normalize_returns"),
        ("algorithm:\n  adv_type: grpo\n  loss_type: actor\n  group_size: 2\nactor:\n  model:\n"
         "    add_value_head: false\nenv:\n  train:\n    group_size: 2\n    auto_reset: true\n",
         "env.train.auto_reset"),
        ("algorithm:\n  adv_type: grpo\n  loss_type: actor\n  group_size: 2\nactor:\n  model:\n"
         "    add_value_head: false\nenv:\n  train:\n    group_size: 2\n    auto_reset: false\n"
         "    ignore_terminations: true\n", "env.train.ignore_terminations"),
        ("env:\n  train:\n    auto_reset: false\n    ignore_terminations: true\n    max_episode_steps: 8\n"
         "    max_steps_per_rollout_epoch: 16\n", "env.train.max_steps_per_rollout_epoch"),
    ]
    for text, key in cases:
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
            load_config(["--config", str(path)])
        assert "\n" not in str(info.value) and "RLinf" in str(info.value)
    path.write_text(cases[1][0].replace("auto_reset: true", "auto_reset: false"))
    assert load_config(["--config", str(path)]).algorithm.adv_type == "grpo"  # RLinf's GRPO setting loads


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
def test_reinpp_advantages_are_whitened_over_the_loss_mask(use_reinpp_baseline):
    rewards, _, dones = make_rollout(3, 33, 12)
    advantages, _, mask = compute_reinpp_advantages(rewards, dones, 4, use_reinpp_baseline)
    assert abs(advantages[mask].mean().item()) < 1e-5
    assert abs(advantages[mask].std(correction=0).item() - 1.0) < 1e-4


def test_reinpp_without_dones_puts_the_whole_return_on_every_step():
    rewards, _, _ = make_rollout(4, 7, 4)
    dones = torch.zeros(7, 4, dtype=torch.bool)
    _, returns, mask = compute_reinpp_advantages(rewards, dones, 1, False)
    assert mask.all() and torch.allclose(returns, rewards.sum(0).expand(7, 4), atol=1e-5)


def test_reinpp_baseline_changes_the_advantages():
    rewards, _, dones = make_rollout(5, 7, 4)
    without, _, _ = compute_reinpp_advantages(rewards, dones, 2, False)
    with_baseline, _, _ = compute_reinpp_advantages(rewards, dones, 2, True)
    assert not torch.allclose(without, with_baseline, atol=1e-3)


@pytest.mark.parametrize("seed", SEEDS)
def test_safe_normalize_takes_statistics_over_the_mask_and_applies_them_everywhere(seed):
    x, _, dones = make_rollout(seed, 33, 12)
    x = 3.0 * x + 5.0
    mask = first_episode_mask(dones)
    out = safe_normalize(x, mask)
    assert abs(out[mask].mean().item()) < 1e-5
    assert abs(out[mask].std().item() - 1.0) < 1e-4  # unbiased, as RLinf
    assert torch.allclose(out[~mask], (x[~mask] - x[mask].mean()) / (x[mask].std() + 1e-5), atol=1e-5)
    x_changed = torch.where(mask, x, torch.full_like(x, 1e6))  # entries outside the mask do not move the statistics
    assert torch.allclose(safe_normalize(x_changed, mask)[mask], out[mask])


def test_safe_normalize_edge_cases():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(safe_normalize(x, torch.zeros(2, 2, dtype=torch.bool)), x)  # nothing selected: unchanged
    one = torch.tensor([[True, False], [False, False]])
    assert torch.equal(safe_normalize(x, one), (x - 1.0) / 1e-5)  # RLinf 0.3.0: NaN (unbiased std of one number)
    assert torch.equal(safe_normalize(torch.full((3, 3), 0.25)), torch.zeros(3, 3))  # a constant: 0 / (0 + 1e-5)


class TwoRanks:
    """An all-reduce between two threads: each rank's tensor becomes the sum of both, like Worker.all_reduce."""

    def __init__(self):
        self.barrier, self.slots = threading.Barrier(2), [None, None]

    def all_reduce(self, rank):
        def reduce(t):
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0] + self.slots[1]
            self.barrier.wait()
            return total
        return reduce


@pytest.mark.parametrize("adv_type", ["gae", "reinpp"])
def test_whitening_over_two_ranks_equals_whitening_the_whole_batch(adv_type):
    rewards, values, dones = make_rollout(7, 16, 8, dtype=torch.float64)
    cfg = AlgorithmConfig(adv_type=adv_type, gamma=0.9, gae_lambda=0.8, normalize_returns=True)
    whole = calculate_adv_and_returns(cfg, rewards, values, dones)
    ranks, halves = TwoRanks(), [None, None]

    def run(rank):
        cols = slice(4 * rank, 4 * rank + 4)
        halves[rank] = calculate_adv_and_returns(cfg, rewards[:, cols], values[:, cols], dones[:, cols],
                                                 all_reduce=ranks.all_reduce(rank))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key in ("advantages", "returns"):
        torch.testing.assert_close(torch.cat([halves[0][key], halves[1][key]], dim=1), whole[key])
    alone = calculate_adv_and_returns(cfg, rewards[:, :4], values[:, :4], dones[:, :4])  # per-rank statistics differ
    assert not torch.allclose(alone["advantages"], whole["advantages"][:, :4])


# ---------------------------------------------------------------------------------------------------------------------
# Dispatch


@pytest.mark.parametrize("normalize_advantages", [False, True])
@pytest.mark.parametrize("normalize_returns", [False, True])
def test_calculate_dispatches_gae(normalize_advantages, normalize_returns):
    rewards, values, dones = make_rollout(0, 7, 4)
    cfg = AlgorithmConfig(adv_type="gae", gamma=0.9, gae_lambda=0.8, normalize_advantages=normalize_advantages,
                          normalize_returns=normalize_returns)
    out = calculate_adv_and_returns(cfg, rewards, values, dones)
    advantages, returns = compute_gae_advantages_and_returns(rewards, values, dones, 0.9, 0.8)
    assert torch.allclose(out["advantages"], safe_normalize(advantages) if normalize_advantages else advantages)
    assert torch.allclose(out["returns"], safe_normalize(returns) if normalize_returns else returns)
    assert out["loss_mask"].dtype == torch.bool and out["loss_mask"].shape == (7, 4) and out["loss_mask"].all()
    mask = first_episode_mask(dones)  # auto_reset off: RLinf whitens over the first episodes only
    masked = calculate_adv_and_returns(cfg, rewards, values, dones, loss_mask=mask)
    assert torch.equal(masked["loss_mask"], mask)
    if normalize_advantages:
        assert torch.allclose(masked["advantages"], safe_normalize(advantages, mask))


def test_calculate_dispatches_critic_free_gae():
    rewards, _, dones = make_rollout(3, 7, 4)
    out = calculate_adv_and_returns(AlgorithmConfig(adv_type="gae", normalize_advantages=False), rewards, None, dones)
    assert close(out["advantages"], ref_critic_free_gae(rewards, dones))


def test_calculate_dispatches_grpo():
    rewards, _, dones = make_rollout(1, 7, 4)
    cfg = AlgorithmConfig(adv_type="grpo", group_size=2)
    out = calculate_adv_and_returns(cfg, rewards, None, dones)
    advantages, loss_mask = compute_grpo_advantages(rewards, dones, 2)
    assert torch.equal(out["advantages"], advantages)
    assert torch.equal(out["returns"], advantages)
    assert torch.equal(out["loss_mask"], loss_mask)


@pytest.mark.parametrize("use_reinpp_baseline", [False, True])
def test_calculate_dispatches_reinpp_with_its_kl_penalty(use_reinpp_baseline):
    rewards, _, dones = make_rollout(2, 7, 4)
    g = torch.Generator().manual_seed(0)
    logprobs, ref_logprobs = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)
    cfg = AlgorithmConfig(adv_type="reinpp", group_size=2, use_reinpp_baseline=use_reinpp_baseline,
                          reinpp_kl_beta=0.1, kl_penalty_type="k3")
    kl = kl_penalty(logprobs, ref_logprobs, "k3")
    out = calculate_adv_and_returns(cfg, rewards, None, dones, kl=kl)
    advantages, returns, mask = compute_reinpp_advantages(rewards, dones, 2, use_reinpp_baseline, kl, 0.1)
    assert torch.equal(out["advantages"], advantages) and torch.equal(out["returns"], returns)
    assert torch.equal(out["loss_mask"], mask)
    with pytest.raises(ValueError, match="KL"):
        calculate_adv_and_returns(cfg, rewards, None, dones)


def test_calculate_rejects_unknown_adv_type():
    rewards, values, dones = make_rollout(0, 7, 4)
    with pytest.raises(ValueError, match="adv_type"):
        calculate_adv_and_returns(AlgorithmConfig(adv_type="ppo"), rewards, values, dones)
