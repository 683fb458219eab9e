"""GRPO's options against the papers' equations, written as plain loops: algorithm.scale_rewards (group: GRPO;
batch; none: Dr. GRPO, arXiv 2503.20783) and algorithm.importance_sampling_level (token: GRPO; sequence: GSPO,
arXiv 2507.18071), with an all-equal group, a one-token response and padding among the inputs."""

from __future__ import annotations

import itertools
import math
import types

import pytest
import torch

from rlinf_mini.config.schema_reasoning import REWARD_FUNC_NAMES
from stages.dynamic_sampling import constant_groups, dynamic_sampling, join_groups, split_groups
from stages.reasoning_reward import REWARD_FUNCS, overlong_reward, pass_at_k, score_responses
from stages.reasoning_train import compute_grpo_token_advantages, grpo_policy_loss, loss_mask_of, truncated_responses

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


# --- DAPO's overlong reward shaping (arXiv 2503.14476, eq. 13) ----------------------------------------------------

def dapo_length_reward(length: int, l_max: int, l_cache: int) -> float:  # the paper's piecewise function
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


@pytest.mark.parametrize("coef", [1.0, 0.1])
def test_overlong_reward_against_dapo_eq_13(coef):
    safe, longest = 6, 10  # L_cache = 4
    lengths = torch.tensor([0, 1, 5, 6, 7, 8, 9, 10, 11, 40])  # a one-token response, the bounds, past the cap
    got = overlong_reward(lengths, coef, safe, longest)
    for n, g in zip(lengths.tolist(), got.tolist(), strict=True):
        assert g == pytest.approx(coef * dapo_length_reward(n, longest, longest - safe), abs=1e-7)


def reward_cfg(**kw):
    base = dict(reward_funcs=["accuracy"], reward_weights=[], reward_scale=1.0, reward_max_val=1.0,
                reward_min_val=-1.0, verifier="rule")
    return types.SimpleNamespace(**(base | kw))


def algo_cfg(**kw):
    return types.SimpleNamespace(**(dict(len_reward_penalty=0.0, safe_length=16384, max_length=20480) | kw))


TEXTS = ["52", "\\boxed{52}", "51", "it is 52 I think", "", "#### 7"]
REFS = [["52"], ["52"], ["52"], ["52"], ["52"], ["8"]]


def test_weighted_reward_functions_against_a_plain_sum():
    cfg = reward_cfg(reward_funcs=["accuracy", "format"], reward_weights=[1.0, 0.5], reward_scale=2.0)
    lengths = torch.tensor([3, 4, 3, 8, 1, 2])
    rewards, terms = score_responses(TEXTS, REFS, lengths, cfg, algo_cfg())
    accuracy = [1.0, 1.0, -1.0, 1.0, -1.0, -1.0]  # the last number of the fourth; nothing in the empty one
    form = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]  # a bare number, a box, '####' are final forms; prose is not
    assert terms["accuracy"].tolist() == accuracy and terms["format"].tolist() == form
    assert rewards.tolist() == pytest.approx([2.0 * (a + 0.5 * f) for a, f in zip(accuracy, form, strict=True)])


def test_overlong_term_is_added_after_the_scale_and_logged():
    cfg = reward_cfg(reward_scale=3.0)
    lengths = torch.tensor([3, 4, 3, 8, 1, 2])  # safe 2, max 6: 0.25, 0.5, 0.25, 1 (capped), 0, 0 of the penalty
    rewards, terms = score_responses(TEXTS, REFS, lengths, cfg, algo_cfg(len_reward_penalty=0.4, safe_length=2,
                                                                         max_length=6))
    penalty = [-0.4 * min(max((n - 2) / 4, 0.0), 1.0) for n in lengths.tolist()]
    assert terms["overlong"].tolist() == pytest.approx(penalty)
    assert rewards.tolist() == pytest.approx([3.0 * a + p for a, p in zip(terms["accuracy"].tolist(), penalty,
                                                                            strict=True)])
    _, off = score_responses(TEXTS, REFS, lengths, cfg, algo_cfg())
    assert "overlong" not in off  # len_reward_penalty 0: no term, the reward unchanged


def test_reward_func_names_in_the_schema_are_the_stage_s():
    assert tuple(REWARD_FUNCS) == REWARD_FUNC_NAMES


# --- DAPO's dynamic sampling (arXiv 2503.14476, eq. 11) -----------------------------------------------------------

def fake_group(prompt: int, width: int = 2) -> dict:
    """A scored group of G responses whose rewards are a fixed function of the prompt: all equal when prompt % 3 == 0
    (alternately all 1 and all -1), else mixed."""
    if prompt % 3 == 0:
        rewards = torch.full((G,), 1.0 if prompt % 2 else -1.0)
    else:
        rewards = torch.tensor([1.0, -1.0, -1.0, -1.0]).roll(prompt)
    ids = torch.full((G, width), prompt)
    return {"prompt_ids": ids, "prompt_mask": torch.ones(G, width, dtype=torch.long), "response_ids": ids.clone(),
            "response_mask": torch.ones(G, width, dtype=torch.long), "logprobs": torch.zeros(G, width),
            "rewards": rewards, "answers": [[str(prompt)]] * G, "version": 0}


def plain_dynamic_sampling(prompts, next_prompt, max_resample):  # the rule written out: drop, refill, repeat
    batch, dropped, rounds = list(prompts), 0, 0
    while rounds < max_resample and any(p % 3 == 0 for p in batch):
        rounds += 1
        for i, p in enumerate(batch):
            if p % 3 == 0:
                dropped += 1
                batch[i] = next_prompt()
    return sorted(batch), dropped, rounds


@pytest.mark.parametrize("max_resample", [0, 1, 2, 5])
def test_dynamic_sampling_counts_against_a_plain_loop(max_resample):
    counter = iter(range(8, 100))
    rounds_seen = []

    def sample(n, round_):
        rounds_seen.append((n, round_))
        return [fake_group(next(counter)) for _ in range(n)]

    groups, stats = dynamic_sampling([fake_group(p) for p in range(8)], sample, G, max_resample)
    plain_counter = iter(range(8, 100))
    want, dropped, rounds = plain_dynamic_sampling(range(8), lambda: next(plain_counter), max_resample)
    got = sorted(int(g["prompt_ids"][0, 0]) for g in groups)
    assert got == want and len(groups) == 8
    # prompts 0, 3, 6 dropped -> 8, 9, 10 (9 dropped) -> 11: three, then one, after two rounds
    assert stats == {"rollout/dropped_groups": float(dropped), "rollout/resample_rounds": float(rounds),
                     "rollout/constant_groups_kept": float(sum(p % 3 == 0 for p in want))}
    assert stats["rollout/dropped_groups"] == {0: 0, 1: 3, 2: 4, 5: 4}[max_resample]
    assert rounds_seen == [(3, 1), (1, 2)][:max_resample]


def test_constant_groups_and_join_groups():
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 0.9, -1.0, -1.0, -1.0, -1.0])
    assert constant_groups(rewards, G).tolist() == [True, False, True]
    narrow, wide = fake_group(1, width=1), fake_group(2, width=3)  # a one-token response beside a longer one
    chunk = join_groups([narrow, wide])
    assert chunk["prompt_ids"].shape == (2 * G, 3) and chunk["response_ids"].shape == (2 * G, 3)
    assert chunk["prompt_mask"][:G].tolist() == [[0, 0, 1]] * G  # prompts left-padded
    assert chunk["response_mask"][:G].tolist() == [[1, 0, 0]] * G  # responses right-padded
    assert chunk["rewards"].tolist() == narrow["rewards"].tolist() + wide["rewards"].tolist()
    assert chunk["answers"] == narrow["answers"] + wide["answers"]
    again = split_groups(chunk, G)
    assert [g["rewards"].tolist() for g in again] == [narrow["rewards"].tolist(), wide["rewards"].tolist()]


# --- algorithm.mask_truncated_completions (TRL's) ------------------------------------------------------------------

EOS = 9
# R = 4: ends with <eos>; cut at the limit; a one-token <eos>; a one-token response cut at a limit of 1 is not
# possible beside R = 4, but a 4-token one whose last is <eos> is complete; padding (pad id 0) after <eos>
TRUNC_IDS = torch.tensor([[3, 4, EOS, 0], [3, 4, 5, 6], [EOS, 0, 0, 0], [5, 6, 7, EOS], [2, 3, 4, 5], [4, 0, 0, 0]])
TRUNC_LEN = [3, 4, 1, 4, 4, 1]  # the last: a one-token response that hit max_new_tokens 1 of its chunk
TRUNC_MASK = torch.tensor([[1] * n + [0] * (4 - n) for n in TRUNC_LEN])


def test_truncated_responses_are_those_without_eos():
    assert truncated_responses(TRUNC_IDS, TRUNC_MASK, EOS).tolist() == [False, True, False, False, True, True]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_masked_truncated_completions_leave_the_loss(agg):
    gen = torch.Generator().manual_seed(5)
    old = torch.randn(6, 4, generator=gen) * 0.3 - 1.0
    new = old + torch.randn(6, 4, generator=gen) * 0.4
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:, None] * TRUNC_MASK
    mask = loss_mask_of(TRUNC_IDS, TRUNC_MASK, EOS, True)
    assert mask.tolist() == [[1, 1, 1, 0], [0] * 4, [1, 0, 0, 0], [1, 1, 1, 1], [0] * 4, [0] * 4]
    got, _ = grpo_policy_loss(new, old, adv, mask, algo("token", agg, c=3.0))
    per_token = [[clipped(math.exp(float(new[i, t] - old[i, t])), float(adv[i, t]), 3.0) for t in range(n)]
                 if i in (0, 2, 3) else [] for i, n in enumerate(TRUNC_LEN)]  # the complete responses' tokens only
    if agg == "token-mean":  # the mean over the tokens left
        want = sum(map(sum, per_token)) / sum(map(len, per_token))
    elif agg == "seq-mean-token-sum":  # a masked response still counts as a response, with loss 0 (RLinf, TRL)
        want = mean([sum(x) for x in per_token])
    else:
        want = mean([mean(x) if x else 0.0 for x in per_token])
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert torch.equal(loss_mask_of(TRUNC_IDS, TRUNC_MASK, EOS, False), TRUNC_MASK.float())  # off: every token
    only_truncated = mask[[1, 4]]  # a micro-batch of truncated responses only: no loss, no NaN
    zero, _ = grpo_policy_loss(new[[1, 4]], old[[1, 4]], adv[[1, 4]], only_truncated, algo("token", agg))
    assert float(zero) == 0.0


# --- eval/pass@k: Chen et al. 2021's unbiased estimator --------------------------------------------------------------

def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of the k-subsets of the n samples that hold a correct one (what the estimator is unbiased for)."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_against_every_subset(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12), (n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert pass_at_k(n, 0, 1) == 0.0 and pass_at_k(n, n, 1) == 1.0  # none right; all right
    assert pass_at_k(n, 1, 1) == pytest.approx(1 / n)  # pass@1 is the fraction correct


def test_pass_at_k_with_many_samples_stays_finite():
    assert 0.0 < pass_at_k(2000, 3, 100) < 1.0  # C(2000, 100) overflows a float; the product does not


# --- bad values: one line naming the key ----------------------------------------------------------------------------

@pytest.mark.parametrize("override,key", [
    ("algorithm.len_reward_penalty=-0.1", "algorithm.len_reward_penalty"),
    ("algorithm.max_length=4", "algorithm.max_length"),  # not above safe_length (16384)
    ("algorithm.safe_length=-1", "algorithm.safe_length"),
    ("algorithm.max_resample=-2", "algorithm.max_resample"),
    ("reward.reward_funcs=[]", "reward.reward_funcs"),
    ("reward.reward_funcs=[accuracy,lenght]", "reward.reward_funcs[1]"),
    ("reward.reward_weights=[1.0,0.5]", "reward.reward_weights"),  # two weights, one function
    ("runner.val_pass_k=-1", "runner.val_pass_k"),
    ("runner.val_num_samples=2", "runner.val_num_samples"),  # with val_pass_k 4 below
])
def test_bad_values_name_their_key(override, key, tmp_path):
    from conftest import ROOT

    from rlinf_mini.config import ConfigError, load_config

    extra = ["runner.val_pass_k=4"] if key == "runner.val_num_samples" else []
    with pytest.raises(ConfigError) as error:
        load_config(["--config", str(ROOT / "configs/math.yaml"), override, *extra,
                     f"runner.logger.log_path={tmp_path}"])
    message = str(error.value)
    assert f"{key}:" in message and "\n" not in message, message
