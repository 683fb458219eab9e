"""The env contract (rlinf_mini/envs/__init__.py) for FakeReach-v0 and the gymnasium adapter."""

from __future__ import annotations

import dataclasses
import io
import time

import pytest
import torch

from rlinf_mini.config import EnvSplitConfig, InitParams
from rlinf_mini.envs import EnvError, EnvSpec, get_env_spec, make_env
from rlinf_mini.envs.fake_reach import STEP_SIZE
from rlinf_mini.utils.seeding import counter_uniform


def fake_cfg(**kw) -> EnvSplitConfig:
    return EnvSplitConfig(env_type="fake", **kw)


def gym_cfg(env_id: str, **kw) -> EnvSplitConfig:
    return EnvSplitConfig(env_type="gymnasium", init_params=InitParams(id=env_id), **kw)


def fixed_actions(env, step: int) -> torch.Tensor:
    """Actions that depend only on (global env id, step), so any split of the ids gets the same ones."""
    B, C, spec = env.num_envs, env.num_action_chunks, env.spec
    if spec.discrete:
        u = counter_uniform(123, env.env_ids, step, C)  # [B, C]
        return (u * spec.action_dim).to(torch.int64)
    u = counter_uniform(123, env.env_ids, step, C * spec.action_dim)
    return (u * 2 - 1).reshape(B, C, spec.action_dim)


def rollout(envs, steps: int, start: int = 0, reset: bool = True):
    """Step a list of envs (one stage each) in lockstep; returns the per-step outputs concatenated over the envs."""
    out = {"obs": [], "rewards": [], "terminations": [], "truncations": [], "stats": []}
    if reset:
        out["obs"].append(torch.cat([env.reset() for env in envs]))
    for t in range(start, start + steps):
        results = [env.chunk_step(fixed_actions(env, t)) for env in envs]
        for i, name in enumerate(["obs", "rewards", "terminations", "truncations"]):
            out[name].append(torch.cat([r[i] for r in results]))
        # Within one call episodes are listed sub-step by sub-step; compare them as a sorted set of rows.
        rows = [torch.stack([r[4]["return"], r[4]["episode_len"], r[4]["success_once"]], 1) for r in results]
        out["stats"].append(torch.cat(rows).sort(dim=0).values)
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, values in a.items():
        assert len(values) == len(b[name])
        for x, y in zip(values, b[name], strict=True):
            assert torch.equal(x, y), name


# ---------------------------------------------------------------------------------------------------------------------


def test_spec():
    assert get_env_spec(fake_cfg()) == EnvSpec(obs_dim=4, action_dim=2, discrete=False)
    assert get_env_spec(fake_cfg(init_params=InitParams(dim=3))) == EnvSpec(6, 3, False)
    assert get_env_spec(gym_cfg("CartPole-v1")) == EnvSpec(obs_dim=4, action_dim=2, discrete=True)
    assert get_env_spec(gym_cfg("Pendulum-v1")) == EnvSpec(obs_dim=3, action_dim=1, discrete=False)
    env = make_env(gym_cfg("CartPole-v1"), torch.arange(2), 1)
    assert env.spec == get_env_spec(gym_cfg("CartPole-v1")) and env.num_envs == 2
    env.close()


def test_unknown_ids_and_spaces_raise_env_error():
    with pytest.raises(EnvError, match=r"^env\.eval\.init_params\.id: unknown gymnasium id 'Foo-v0'"):
        get_env_spec(gym_cfg("Foo-v0"), key="env.eval")
    with pytest.raises(EnvError, match=r"^env\.train\.init_params\.id: unknown gymnasium id"):
        make_env(gym_cfg("Foo-v0"), torch.arange(2), 1)
    with pytest.raises(EnvError, match=r"^env\.train\.init_params\.id: .*observation space Discrete"):
        get_env_spec(gym_cfg("FrozenLake-v1"))
    with pytest.raises(EnvError, match=r"^env\.train\.init_params\.id: unknown fake env id 'Nope-v0'"):
        make_env(EnvSplitConfig(init_params=InitParams(id="Nope-v0")), torch.arange(2), 1)


@pytest.mark.parametrize("cfg", [fake_cfg(max_episode_steps=10), gym_cfg("CartPole-v1", max_episode_steps=20)])
def test_deterministic(cfg):
    a = rollout([make_env(cfg, torch.arange(4), 2)], 20)
    b = rollout([make_env(cfg, torch.arange(4), 2)], 20)
    assert_same(a, b)
    other = rollout([make_env(dataclasses.replace(cfg, seed=1), torch.arange(4), 2)], 20)
    assert not torch.equal(a["obs"][0], other["obs"][0])


@pytest.mark.parametrize("cfg", [fake_cfg(max_episode_steps=10), fake_cfg(max_episode_steps=10, auto_reset=False),
                                 gym_cfg("CartPole-v1", max_episode_steps=30), gym_cfg("Pendulum-v1",
                                                                                        max_episode_steps=15)])
def test_stage_split_invariance(cfg):
    """ids 0..15 in one env or split into [0..7] + [8..15] give bitwise the same trajectories."""
    one = rollout([make_env(cfg, torch.arange(16), 2)], 50)
    two = rollout([make_env(cfg, torch.arange(0, 8), 2), make_env(cfg, torch.arange(8, 16), 2)], 50)
    assert_same(one, two)
    assert sum(len(s) for s in one["stats"]) > 0  # episodes did end on the way


def test_group_reset():
    env = make_env(fake_cfg(group_size=4), torch.arange(8), 1)
    for _ in range(2):  # two reset rounds: groups share each one, and the rounds differ
        obs = env.reset()
        assert (obs[:4] == obs[0]).all() and (obs[4:] == obs[4]).all()
        assert not torch.equal(obs[0], obs[4])
        p, g = obs[:, :2], obs[:, 2:]
        assert (torch.linalg.vector_norm(g - p, dim=1) >= 0.5).all() and obs.abs().max() <= 1
    assert not torch.equal(obs, make_env(fake_cfg(group_size=4), torch.arange(8), 1).reset())


def test_fixed_reset_state_ids():
    env = make_env(fake_cfg(use_fixed_reset_state_ids=True), torch.arange(4), 1)
    assert torch.equal(env.reset(), env.reset())


def test_auto_reset_true_vs_false():
    zero = torch.zeros(3, 1, 2)
    second_episode = make_env(fake_cfg(), torch.arange(3), 1)
    second_episode.reset()
    second_obs = second_episode.reset()  # the reset state with counter 1

    env = make_env(fake_cfg(max_episode_steps=5), torch.arange(3), 1)
    first_obs = env.reset()
    for _ in range(4):
        obs, r, term, trunc, stats = env.chunk_step(zero)
        assert torch.equal(obs, first_obs) and not trunc.any() and len(stats["return"]) == 0
    obs, r, term, trunc, stats = env.chunk_step(zero)
    assert trunc.all() and not term.any() and torch.equal(obs, second_obs)
    assert stats["episode_len"].tolist() == [5.0] * 3 and stats["success_once"].tolist() == [0.0] * 3

    env = make_env(fake_cfg(max_episode_steps=5, auto_reset=False), torch.arange(3), 1)
    first_obs = env.reset()
    push = torch.full((3, 1, 2), 0.3)  # moves, so rewards are non-zero until the episode ends
    for _ in range(4):
        env.chunk_step(push)
    final_obs, r, term, trunc, stats = env.chunk_step(push)
    assert trunc.all() and len(stats["return"]) == 3 and not torch.equal(final_obs, first_obs)
    for _ in range(5):  # finished sub-envs stay finished: no reward, no done, same obs, no new episodes
        obs, r, term, trunc, stats = env.chunk_step(push)
        assert torch.equal(obs, final_obs) and (r == 0).all() and not (term | trunc).any()
        assert len(stats["return"]) == 0
    assert torch.equal(env.reset(), second_obs)
    assert (env.chunk_step(push)[1] != 0).any()


def test_episode_stats_on_success():
    env = make_env(fake_cfg(max_episode_steps=50, auto_reset=False), torch.arange(4), 1)
    obs, total, done_at = env.reset(), torch.zeros(4), torch.full((4,), -1)
    for t in range(20):
        p, g = obs[:, :2], obs[:, 2:]
        actions = ((g - p) / STEP_SIZE).clamp(-1, 1)[:, None]  # [B, C=1, A]
        obs, r, term, trunc, stats = env.chunk_step(actions)
        total += torch.where(done_at < 0, r[:, 0], 0.0)
        if term.any():
            assert (r[term] >= 1.0).all() and (stats["success_once"] == 1).all() and not trunc.any()
            assert torch.allclose(stats["return"].sort().values, total[term[:, 0]].sort().values)
            assert (stats["episode_len"] == t + 1).all()
        done_at = torch.where(term[:, 0] & (done_at < 0), t, done_at)
    assert (done_at > 0).all()


def test_episode_stats_on_truncation():
    env = make_env(gym_cfg("Pendulum-v1", max_episode_steps=6), torch.arange(2), 2)
    env.reset()
    results = [env.chunk_step(torch.zeros(2, 2, 1)) for _ in range(3)]
    assert results[2][3][:, 1].all() and not results[1][3].any()
    stats = results[2][4]
    assert stats["episode_len"].tolist() == [6.0, 6.0] and stats["success_once"].tolist() == [0.0, 0.0]
    assert torch.allclose(stats["return"], sum(r[1].sum(1) for r in results))


def test_chunk_masking():
    """C=3, episodes of 4 steps: step 4 ends at column 0 of chunk 2; the new episode's 2 steps there are masked."""
    cfg = fake_cfg(max_episode_steps=4, init_params=InitParams(goal_radius=0.0))
    ref = make_env(cfg, torch.arange(4), 3)
    ref.reset()
    second_obs = ref.reset()
    env = make_env(cfg, torch.arange(4), 3)
    env.reset()
    push = torch.full((4, 3, 2), 0.1)
    _, r1, _, trunc1, stats1 = env.chunk_step(push)
    obs, r2, term2, trunc2, stats2 = env.chunk_step(push)
    assert not trunc1.any() and len(stats1["return"]) == 0 and (r1 != 0).any()
    assert trunc2[:, 0].all() and not trunc2[:, 1:].any() and not term2.any() and (r2[:, 1:] == 0).all()
    assert stats2["episode_len"].tolist() == [4.0] * 4
    expected = second_obs.clone()
    for _ in range(2):
        expected[:, :2] = (expected[:, :2] + STEP_SIZE * push[:, 0]).clamp(-1, 1)
    assert torch.equal(obs, expected)  # the masked actions went to the new episode
    _, r3, _, trunc3, _ = env.chunk_step(push)
    assert trunc3[:, 1].all() and not trunc3[:, [0, 2]].any() and (r3[:, 2] == 0).all()


def test_gym_chunk_masking():
    env = make_env(gym_cfg("CartPole-v1"), torch.arange(4), 3)
    env.reset()
    ended = 0
    for _ in range(20):  # always pushing left topples the pole within ~10 steps
        _, r, term, trunc, stats = env.chunk_step(torch.zeros(4, 3, dtype=torch.int64))
        done = term | trunc
        assert (done.sum(1) <= 1).all()
        after_done = done.to(torch.int64).cumsum(1) - done.to(torch.int64) > 0
        assert (r[after_done] == 0).all() and (r[~after_done] == 1).all()
        assert len(stats["return"]) == int(done.sum()) and (stats["success_once"] == 0).all()
        ended += int(done.sum())
    assert ended >= 8


@pytest.mark.parametrize("cfg", [fake_cfg(step_latency_s=0.01), gym_cfg("CartPole-v1", step_latency_s=0.01)])
def test_latency(cfg, monkeypatch):
    env = make_env(cfg, torch.arange(2), 3)
    env.reset()
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)  # the sleeps themselves, not the clock
    env.chunk_step(fixed_actions(env, 0))
    assert slept == [0.01] * 3  # once per sub-step of the chunk, for all the env's sub-envs at once


@pytest.mark.parametrize("cfg", [fake_cfg(max_episode_steps=7), fake_cfg(max_episode_steps=7, auto_reset=False),
                                 gym_cfg("CartPole-v1", max_episode_steps=25), gym_cfg("Pendulum-v1",
                                                                                        max_episode_steps=9)])
def test_get_set_state_continues_bitwise(cfg):
    env = make_env(cfg, torch.arange(4, 8), 2)
    rollout([env], 10)
    buf = io.BytesIO()
    torch.save(env.get_state(), buf)  # the state must survive a checkpoint file, read with weights_only
    expected = rollout([env], 20, start=10, reset=False)
    resumed = make_env(cfg, torch.arange(4, 8), 2)
    resumed.set_state(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert_same(rollout([resumed], 20, start=10, reset=False), expected)
    with pytest.raises(ValueError, match="other env ids"):
        make_env(cfg, torch.arange(4), 2).set_state(env.get_state())


@pytest.mark.parametrize("cfg", [gym_cfg("CartPole-v1"), gym_cfg("Pendulum-v1")])
def test_gym_output_dtypes_and_no_aliasing(cfg):
    """The contract's dtypes, and returned tensors are copies: editing them does not change the env."""
    env = make_env(cfg, torch.arange(3), 2)
    obs0 = env.reset()
    obs, r, term, trunc, stats = env.chunk_step(fixed_actions(env, 0))
    assert (obs0.dtype, obs.dtype, r.dtype, term.dtype, trunc.dtype) == (torch.float32,) * 3 + (torch.bool,) * 2
    assert all(v.dtype == torch.float32 for v in stats.values())
    saved = obs.clone()
    obs0.add_(1.0), obs.add_(1.0)
    assert torch.equal(env.get_state()["obs"], saved)
