"""env_type: metaworld (rlinf_mini/envs/metaworld.py) on MetaWorld 3 itself: RLinf's suites and single tasks, a
sub-env's episodes set by (seed, its id) whatever the split, success logged as RLinf logs it, bad names refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("metaworld", reason="metaworld is not installed (pip install -e '.[metaworld]')")

from rlinf_mini.config import EnvSplitConfig, InitParams  # noqa: E402
from rlinf_mini.envs import get_env_spec, make_env  # noqa: E402
from rlinf_mini.envs.base import EnvError  # noqa: E402
from rlinf_mini.envs.metaworld_tasks import TASK_DESCRIPTIONS, suite_task_names  # noqa: E402


def cfg(**kw) -> EnvSplitConfig:
    base = {"env_type": "metaworld", "task_suite_name": "reach-v3", "max_episode_steps": 20, "auto_reset": True,
            "use_dense_reward": True, "use_rel_reward": False, "seed": 7}
    return EnvSplitConfig(**(base | kw))


def actions_for(env_ids: torch.Tensor, step: int) -> torch.Tensor:
    """The same action for a sub-env id at a step, whichever env holds it: [B, 1, 4] in [-1, 1]."""
    gen = [torch.Generator().manual_seed(int(e) * 1000 + step) for e in env_ids]
    return torch.stack([torch.rand(1, 4, generator=g) * 2 - 1 for g in gen])


def rollout(env_ids: list[int], steps: int, **kw):
    env = make_env(cfg(**kw), torch.tensor(env_ids), 1)
    try:
        obs = [env.reset()]
        rewards = []
        for t in range(steps):
            o, r, *_ = env.chunk_step(actions_for(env.env_ids, t))
            obs.append(o)
            rewards.append(r)
        return torch.stack(obs, 1), torch.stack(rewards, 1)  # [B, T+1, 39], [B, T, 1]
    finally:
        env.close()


def test_state_observations_and_the_task_description_as_instruction():
    spec = get_env_spec(cfg(), "env.train")
    assert (spec.obs_dim, spec.action_dim, spec.discrete) == (39, 4, False)
    env = make_env(cfg(task_suite_name="metaworld_50", group_size=2), torch.arange(4), 1)
    try:
        assert env.tasks == [list(TASK_DESCRIPTIONS)[0]] * 2 + [list(TASK_DESCRIPTIONS)[1]] * 2  # a group shares
        assert env.task_descriptions[0] == TASK_DESCRIPTIONS[env.tasks[0]]
        assert env.reset().shape == (4, 39)
    finally:
        env.close()
    assert len(suite_task_names("metaworld_50")) == 50
    assert len(suite_task_names("metaworld_45_ind")) == 45 and len(suite_task_names("metaworld_45_ood")) == 5


def test_a_sub_envs_episodes_depend_on_its_id_not_on_the_split():
    whole_obs, whole_r = rollout([0, 1, 2, 3], 25)  # 25 steps: past max_episode_steps 20, through an auto-reset
    for part in ([0, 1], [2, 3]):
        obs, r = rollout(part, 25)
        assert torch.equal(obs, whole_obs[part]) and torch.equal(r, whole_r[part])
    assert not torch.equal(whole_obs[0], whole_obs[1])  # different ids, different episodes


def test_a_sub_env_is_what_gymnasium_make_builds_step_for_step():
    """The env makes MT1's reset layouts once per process; a sub-env must still be gymnasium.make's MT1 env: the
    oracle is a plain loop on gymnasium.make("Meta-World/MT1") with our seeding, settle steps and auto-reset."""
    import gymnasium
    import numpy as np

    from rlinf_mini.envs.metaworld import SETTLE_STEPS

    c = cfg(task_suite_name="push-v3", max_episode_steps=6)
    ids = torch.tensor([0, 3])
    ours, ours_rewards = rollout(ids.tolist(), 9, task_suite_name="push-v3", max_episode_steps=6)  # [2, 10, 39]
    for b, e in enumerate(ids.tolist()):
        env = gymnasium.make("Meta-World/MT1", env_name="push-v3", seed=c.seed, disable_env_checker=True)
        env.unwrapped.max_path_length = c.max_episode_steps + SETTLE_STEPS

        def reset(first: bool):
            if first:
                env.unwrapped.seed(c.seed + e)
            obs, _ = env.reset()
            for _ in range(SETTLE_STEPS):
                obs, *_ = env.step(np.zeros(4, dtype=np.float32))
            return obs

        plain, plain_rewards = [reset(True)], []
        for t in range(9):
            obs, reward, *_ = env.step(actions_for(torch.tensor([e]), t)[0, 0].numpy())
            plain.append(reset(False) if (t + 1) % c.max_episode_steps == 0 else obs)  # auto-reset after step 6
            plain_rewards.append(reward)
        env.close()
        assert torch.allclose(ours[b], torch.tensor(np.stack(plain), dtype=torch.float32)), e
        assert torch.allclose(ours_rewards[b].flatten(), torch.tensor(plain_rewards, dtype=torch.float32)), e
    assert not torch.equal(ours[0], ours[1])


@pytest.mark.filterwarnings("ignore:Constant\\(s\\) may be too high")  # the scripted policy's own warning
@pytest.mark.parametrize("task", ["push-v3", "pick-place-v3"])
def test_touching_object_is_metaworlds_answer_at_every_step_of_a_scripted_episode(task):
    """The env binds a faster touching_object (MuJoCo's contact arrays, not a Python loop); the oracle is MetaWorld's
    own method on the same state, over an episode of MetaWorld's scripted policy (which grips the object)."""
    import numpy as np
    from metaworld import policies

    from rlinf_mini.envs.metaworld import _make_one

    env = _make_one(cfg(task_suite_name=task, max_episode_steps=150), task, "env.train")
    sawyer = env.unwrapped
    assert sawyer.touching_object.__func__ is not type(sawyer).touching_object  # the bound replacement
    policy = {"push-v3": policies.SawyerPushV3Policy, "pick-place-v3": policies.SawyerPickPlaceV3Policy}[task]()
    sawyer.seed(3)
    obs, _ = env.reset()
    seen = set()
    for _ in range(120):
        obj = sawyer._get_id_main_object()
        ours = sawyer.touching_object(obj)
        assert ours == type(sawyer).touching_object(sawyer, obj)
        seen.add(ours)
        obs, *_ = env.step(np.clip(policy.get_action(obs), -1, 1).astype(np.float32))
    env.close()
    assert seen == {True, False}  # the pads touched the object in some steps and not in others


def test_episodes_end_at_max_episode_steps_with_rlinfs_success_stats():
    env = make_env(cfg(max_episode_steps=5), torch.arange(2), 1)
    try:
        env.reset()
        ends = []
        for t in range(5):
            *_, trunc, stats = env.chunk_step(actions_for(env.env_ids, t))
            ends.append((bool(trunc.any()), sorted(stats)))
    finally:
        env.close()
    assert [e for e, _ in ends] == [False] * 4 + [True]
    assert ends[-1][1] == ["episode_len", "return", "success_at_end", "success_once"]


def test_an_unknown_task_is_one_line_naming_the_key():
    with pytest.raises(EnvError, match=r"env.train.task_suite_name: unknown MetaWorld suite or task 'psh-v3'"):
        get_env_spec(cfg(task_suite_name="psh-v3"), "env.train")


def test_a_non_finite_simulation_step_ends_only_that_episode(capsys):
    """Sub-env 1's physics returns NaN on its third step: that episode terminates with reward 0 and the sub-env is
    reset; sub-env 0 steps on exactly as in a run without the fault."""
    ref_obs, ref_r = rollout([0, 1], 3)
    env = make_env(cfg(ignore_terminations=True), torch.tensor([0, 1]), 1)
    try:
        obs0 = env.reset()
        inner = env.envs[1]
        real_step, calls = inner.step, []

        def faulty(action):
            obs, reward, term, trunc, info = real_step(action)
            calls.append(1)
            return (obs * float("nan"), reward, term, trunc, info) if len(calls) == 3 else \
                (obs, reward, term, trunc, info)

        inner.step = faulty
        out = [env.chunk_step(actions_for(env.env_ids, t)) for t in range(3)]
    finally:
        env.close()
    obs, rewards, terms, truncs, stats = out[2]
    assert torch.isfinite(obs).all() and torch.equal(obs[0], ref_obs[0, 3]) and rewards[1, 0] == 0.0
    assert terms[:, 0].tolist() == [False, True] and not truncs.any()
    assert stats["episode_len"].tolist() == [3.0] and env.num_nonfinite == 1
    assert torch.equal(obs0, ref_obs[:, 0])
    assert "sub-env 1: non-finite observation or reward at episode step 3" in capsys.readouterr().err


def test_tutorial_08_runs_on_metaworld(tmp_path):
    """tests/test_tutorials.py runs every tutorial in the README's venv (the fake env stands in there); here, with
    the extra, tutorial 08's MetaWorld cells and asserts run too."""
    from test_tutorials import ROOT, run_tutorial

    result, _ = run_tutorial(ROOT / "tutorials" / "08_your_own_env.py", tmp_path / "out")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "worked example: configs/metaworld_reach.yaml (metaworld, reach-v3)" in result.stdout
    assert "'success_at_end': [1.0, 1.0, 1.0, 1.0]" in result.stdout


def test_mt10_one_hot_is_the_tasks_index_and_episode_stats_are_kept_per_task():
    from rlinf_mini.envs.base import per_task_eval_sums
    from rlinf_mini.envs.metaworld_tasks import MT10

    assert get_env_spec(cfg(task_suite_name="MT10", use_one_hot=True), "env.train").obs_dim == 39 + 10
    env = make_env(cfg(task_suite_name="MT10", use_one_hot=True, max_episode_steps=3), torch.arange(12), 1)
    try:
        obs = env.reset()
        assert obs.shape == (12, 49) and env.tasks == [MT10[e % 10] for e in range(12)]
        assert obs[:, 39:].argmax(1).tolist() == [e % 10 for e in range(12)] and obs[:, 39:].sum().item() == 12
        for t in range(3):  # every episode ends at step 3
            obs, _, _, truncs, stats = env.chunk_step(actions_for(env.env_ids, t))
        assert truncs.all() and torch.equal(obs[:, 39:], torch.eye(10)[[e % 10 for e in range(12)]])
        for task in MT10:  # the per-task lists hold the episodes of that task, in sub-env order
            rows = [b for b, name in enumerate(env.tasks) if name == task]
            assert stats[f"success_once/{task}"].tolist() == stats["success_once"][rows].tolist()
        stats["success_once/reach-v3"] = torch.tensor([1.0, 0.0])  # as if sub-env 0 of two had succeeded
        per_task = per_task_eval_sums(env.tasks, stats)
        assert per_task["eval/success_once/reach-v3_sum"] == 1.0 and per_task["eval/num_envs/reach-v3"] == 2.0
        assert per_task["eval/num_envs/window-close-v3"] == 1.0 and len(per_task) == 20
    finally:
        env.close()
    single = make_env(cfg(), torch.arange(2), 1)  # one task: no per-task keys, no one-hot
    try:
        single.reset()
        assert single.reset().shape == (2, 39) and not per_task_eval_sums(single.tasks, {})
    finally:
        single.close()
    with pytest.raises(EnvError, match=r"^env.train.use_one_hot: .*'state'"):
        get_env_spec(cfg(use_one_hot=True, init_params=InitParams(obs_mode="rgb")), "env.train")


def test_render_shadows_false_turns_off_every_lights_shadow_and_only_that():
    def frames(shadows: bool):
        params = InitParams(obs_mode="rgb", camera_heights=16, camera_widths=16, render_shadows=shadows)
        env = make_env(cfg(init_params=params), torch.arange(2), 1)
        try:
            model = env.envs[0].unwrapped.model
            casts = model.light_castshadow.copy()
            return env.reset()["images"], casts
        finally:
            env.close()

    (lit, casts_on), (flat, casts_off) = frames(True), frames(False)
    assert casts_on.any() and not casts_off.any()  # the default keeps MetaWorld's (and RLinf's) shadows
    assert lit.shape == flat.shape == (2, 3, 16, 16) and lit.dtype == flat.dtype == torch.uint8
    assert not torch.equal(lit, flat)  # the same scene, drawn without shadows
    assert (lit.float() - flat.float()).abs().mean() < 32  # ... and nothing else: the view and the objects stay


def test_the_tiny_vla_config_reads_pixels_and_the_instruction_and_trains(tmp_path):
    """configs/metaworld_reach_vla.yaml, shrunk by key=value only to 2 sub-envs x 10 env steps (2 chunks of 5): the
    tiny VLA is built for its 64x64 frames and the 4-dim hand state, trains 2 steps and is evaluated."""
    import json
    from pathlib import Path

    from rlinf_mini.config import load_config
    from rlinf_mini.train import RunPlan, build_and_run

    config = str(Path(__file__).resolve().parents[1] / "configs" / "metaworld_reach_vla.yaml")
    small = [f"runner.logger.log_path={tmp_path / 'results'}", f"actor.model.model_path={tmp_path / 'tiny_vla'}",
             "runner.logger.logger_backends=[]", "runner.progress_bar=false", "runner.max_epochs=2",
             "runner.val_check_interval=2", "env.train.total_num_envs=2", "env.train.max_steps_per_rollout_epoch=10",
             "env.eval.total_num_envs=2", "env.eval.max_steps_per_rollout_epoch=10", "env.eval.max_episode_steps=10",
             "actor.global_batch_size=4", "actor.micro_batch_size=2"]
    cfg = load_config(["--config", config, *small])
    assert cfg.actor.model.model_type == "tiny_vla" and not cfg.env.train.init_params.render_shadows
    spec = get_env_spec(cfg.env.train, "env.train")
    assert (spec.image_shape, spec.obs_dim, spec.action_dim) == ((3, 64, 64), 4, 4)
    history = build_and_run(cfg, RunPlan(cfg, config))
    assert [h["step"] for h in history if "train/actor/policy_loss" in h] == [1, 2]
    assert [(h["step"], h["eval/num_episodes"]) for h in history if "eval/num_episodes" in h] == [(0, 2.0), (2, 2.0)]
    made = json.loads((tmp_path / "tiny_vla" / "config.json").read_text())  # the model the run made for its env
    assert (made["image_size"], made["patch_size"], made["state_dim"], made["action_dim"],
            made["num_action_chunks"]) == (64, 8, 4, 4, 5)
