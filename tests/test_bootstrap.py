"""algorithm.bootstrap_type: a truncated episode's last reward gains gamma * V(final observation).

Oracles: an env with auto_reset False stops at its first episode's end and keeps showing that final observation, so
it is the reference for what an auto-resetting env must keep in `final_obs`; and a plain loop (the same env stepped
with the trajectory's own actions, the rollout's weights evaluating the final observation) is the reference for the
rewards the env worker hands the actor."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_pipeline import INLINE, collect, small_cfg

from rlinf_mini.envs import make_env
from rlinf_mini.models import build_policy

SHORT = {"env": {"train": {"max_episode_steps": 3}}}  # episodes end inside the 8 chunk steps of a rollout epoch


def _first_end(cfg, actions_of, steps: int, of: str):
    """Step an auto-resetting env and one without auto-reset side by side with the same actions: for every row whose
    first episode ended by `of`, (the auto-resetting env's final_obs row, the stopped env's obs row)."""
    ids = torch.arange(cfg.total_num_envs)
    C = 2
    env = make_env(dataclasses.replace(cfg, auto_reset=True), ids, C)
    ref = make_env(dataclasses.replace(cfg, auto_reset=False), ids, C)
    env.final_obs_of = of
    env.reset(), ref.reset()
    seen = torch.zeros(len(ids), dtype=torch.bool)
    pairs = []
    for t in range(steps):
        a = actions_of(t, env)
        _, _, term, trunc, _ = env.chunk_step(a)
        ref_obs, *_ = ref.chunk_step(a)
        ended = (trunc if of == "truncations" else term | trunc).any(dim=1) & ~seen
        first = (term | trunc).any(dim=1) & ~seen
        if ended.any():
            assert env.final_obs is not None
            mask, final = env.final_obs
            assert torch.equal(mask & ~seen, ended)  # exactly the rows that ended that way
            for b in ended.nonzero().flatten().tolist():
                pairs.append((final[b], ref_obs[b]))
        seen |= first
    env.close(), ref.close()
    return pairs


@pytest.mark.parametrize("of", ["truncations", "dones"])
def test_fake_env_keeps_the_final_observation_of_an_episode_it_resets(tmp_path, of):
    cfg, _ = small_cfg(tmp_path, None, None, None, env={"train": {"max_episode_steps": 5, "total_num_envs": 32}})
    gen = torch.Generator().manual_seed(0)
    pairs = _first_end(cfg.env.train, lambda t, env: torch.rand(env.num_envs, 2, 2, generator=gen) * 2 - 1, 4, of)
    assert len(pairs) >= 10  # 5-step episodes end in the third chunk of 2 steps (mid-chunk for the odd length)
    for got, want in pairs:
        assert torch.equal(got, want)


def test_gymnasium_env_keeps_the_final_observation_of_a_truncated_episode(tmp_path):
    cfg, _ = small_cfg(tmp_path, None, None, None, base="configs/cartpole.yaml",
                       env={"train": {"max_episode_steps": 3, "total_num_envs": 4}})
    pairs = _first_end(cfg.env.train, lambda t, env: torch.zeros(env.num_envs, 2, dtype=torch.int64) + t % 2, 3,
                       "truncations")
    assert len(pairs) == 4  # CartPole does not fall in 3 steps: every row truncates
    for got, want in pairs:
        assert torch.equal(got, want)


def test_metaworld_env_keeps_the_final_observation_of_a_truncated_episode(tmp_path):
    pytest.importorskip("metaworld", reason="metaworld not installed (pip install -e '.[metaworld]')")
    cfg, _ = small_cfg(tmp_path, None, None, None, base="configs/metaworld_reach.yaml",
                       env={"train": {"max_episode_steps": 3, "total_num_envs": 2}})
    pairs = _first_end(cfg.env.train, lambda t, env: torch.zeros(env.num_envs, 2, 4), 3, "truncations")
    assert len(pairs) == 2
    for got, want in pairs:
        assert torch.equal(got, want)


def test_no_final_observation_is_kept_unless_asked(tmp_path):
    cfg, _ = small_cfg(tmp_path, None, None, None, env={"train": {"max_episode_steps": 1}})
    env = make_env(cfg.env.train, torch.arange(4), 1)
    env.reset()
    _, _, _, trunc, _ = env.chunk_step(torch.zeros(4, 1, 2))
    assert trunc.all() and env.final_obs is None


@pytest.mark.parametrize("bootstrap_type", ["standard", "always"])
def test_truncated_episodes_last_reward_gains_gamma_times_the_value_of_the_final_observation(tmp_path,
                                                                                            bootstrap_type):
    algo = {"algorithm": {"bootstrap_type": bootstrap_type}}
    batches, _, rollout_weights, _ = collect(tmp_path, {"env": "0", "rollout": "1", "actor": "0"}, 2, 1,
                                             cluster=INLINE, **SHORT, **algo)
    batch = batches[0][0]  # one env rank, one actor rank: columns are env ids 0..15
    (tmp_path / "ref").mkdir()
    cfg, _ = small_cfg(tmp_path / "ref", None, None, None, **SHORT, **algo)
    spec_env = make_env(dataclasses.replace(cfg.env.train, auto_reset=False), torch.arange(16), 1)
    policy = build_policy(cfg.actor.model, spec_env.spec.obs_dim, spec_env.spec.action_dim, False)
    policy.load_state_dict(rollout_weights[0])  # the weights that produced the batch (version 0)
    # the plain loop: the same actions in an env without auto-reset, up to every row's first episode end (3 steps)
    spec_env.reset()
    live = torch.ones(16, dtype=torch.bool)  # still in its first episode
    truncated = 0
    for t in range(3):
        obs, raw, term, trunc, _ = spec_env.chunk_step(batch["actions"][t])
        ends = (trunc if bootstrap_type == "standard" else term | trunc)[:, 0]
        with torch.no_grad():  # a row without auto-reset shows its final obs
            value = policy.predict_action_batch(obs, None, mode="eval")["values"]
        want = raw[:, 0] + torch.where(ends, cfg.algorithm.gamma * value, 0.0)
        torch.testing.assert_close(batch["rewards"][t][live], want[live], rtol=1e-6, atol=1e-6)
        assert torch.equal(batch["dones"][t][live], (term | trunc)[live, 0])
        truncated += int(trunc[live, 0].sum())
        live &= ~(term | trunc)[:, 0]
    assert not live.any() and truncated >= 4  # time-limit truncations are part of the check
    spec_env.close()


def test_bootstrapped_rewards_are_the_same_pipelined_or_not(tmp_path):
    placement = {"env": "0", "rollout": "1", "actor": "0"}
    one = collect(tmp_path, placement, 2, 1, train_steps=1, cluster=INLINE, **SHORT)[0][0][0]
    two = collect(tmp_path, placement, 2, 2, train_steps=1, cluster=INLINE, **SHORT)[0][0][0]
    for key in ("rewards", "values", "dones"):
        assert torch.equal(one[key], two[key]), key


def test_the_rollout_s_bootstrap_values_are_predict_action_batch_s_values():
    """The rollout infers V(final obs) with predict_values (no action head, no sampling): bitwise the values
    predict_action_batch returns for the same inputs, for both policies."""
    from test_vla import _inputs, small_vla

    from rlinf_mini.models import MLPPolicy

    mlp = MLPPolicy(obs_dim=4, action_dim=2, discrete=False).eval()
    vla = small_vla().eval()
    obs = torch.randn(16, 4)
    with torch.no_grad():
        for policy, inputs in ((mlp, obs), (vla, _inputs(vla))):
            want = policy.predict_action_batch(inputs, None, mode="eval")["values"]
            assert want.abs().sum() > 0 and torch.equal(policy.predict_values(inputs), want)


def test_values_asked_with_an_action_call_are_the_values_of_separate_calls():
    """A message with truncated episodes' final obs: the rollout asks the action call for their values too
    (bootstrap_obs; the MLP runs its value head once over both batches). Oracle: predict_action_batch without them
    (same actions, logprobs and values) and predict_values of the final obs alone, bitwise, for both policies."""
    from test_vla import _inputs, small_vla

    from rlinf_mini.models import MLPPolicy
    from rlinf_mini.utils.seeding import counter_uniform

    mlp = MLPPolicy(obs_dim=4, action_dim=2, discrete=False).eval()
    vla = small_vla().eval()
    with torch.no_grad():
        for policy, inputs, final in ((mlp, torch.randn(16, 4), torch.randn(16, 4)),
                                      (vla, _inputs(vla), _inputs(vla, seed=1))):
            for mode in ("train", "eval"):
                noise = counter_uniform(7, torch.arange(16), 3, policy.noise_width)
                alone = policy.predict_action_batch(inputs, noise, mode=mode)
                both = policy.predict_action_batch(inputs, noise, mode=mode, bootstrap_obs=final)
                for key in ("actions", "logprobs", "values"):
                    assert torch.equal(both[key], alone[key]), (type(policy).__name__, mode, key)
                want = policy.predict_values(final)
                assert not torch.equal(want, alone["values"]) and torch.equal(both["bootstrap_values"], want)


def test_the_last_values_row_is_predict_action_batch_s_values_of_the_last_observation(tmp_path):
    """After T chunk steps the rollout replies with the value head alone (predict_values, no noise, no actions):
    the trajectory's values[T] must be what predict_action_batch, with that step's noise, gives for the observation
    the env reached. Oracle: the same env stepped with the trajectory's own actions (a plain loop)."""
    from rlinf_mini.utils.seeding import counter_uniform

    batches, _, rollout_weights, _ = collect(tmp_path, {"env": "0", "rollout": "1", "actor": "0"}, 2, 2,
                                             cluster=INLINE, **SHORT)
    batch = batches[0][0]  # one env rank, one actor rank: columns are env ids 0..15
    (tmp_path / "ref").mkdir()
    cfg, _ = small_cfg(tmp_path / "ref", None, None, None, **SHORT)
    ids = torch.arange(16)
    env = make_env(cfg.env.train, ids, 1)
    policy = build_policy(cfg.actor.model, env.spec.obs_dim, env.spec.action_dim, False).eval()
    policy.load_state_dict(rollout_weights[0])  # the weights that produced the batch (version 0)
    obs = env.reset()
    T = batch["actions"].shape[0]
    for t in range(T):
        assert torch.equal(batch["obs"][t], obs)  # the replay is the rollout's own
        obs, *_ = env.chunk_step(batch["actions"][t])
    noise = counter_uniform(cfg.actor.seed, ids, T, policy.noise_width)  # sample step T of the first epoch
    with torch.no_grad():
        want = policy.predict_action_batch(obs, noise)["values"]
    assert batch["values"].shape[0] == T + 1 and want.abs().sum() > 0
    assert torch.equal(batch["values"][T], want)
    env.close()
