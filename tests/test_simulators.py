"""Real simulators: MuJoCo through the gymnasium adapter (skipped when mujoco is missing), ManiSkill3 (skipped, with
the reason, where it is missing or has no render device), and the slow learning check: MuJoCo beats the random
policy."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from rlinf_mini.config import EnvSplitConfig, InitParams, VideoConfig, load_config
from rlinf_mini.envs import EnvError, get_env_spec, make_env

HAS_MUJOCO = importlib.util.find_spec("mujoco") is not None
HAS_MANISKILL = importlib.util.find_spec("mani_skill") is not None
os.environ.setdefault("MUJOCO_GL", "egl")


def test_simulator_configs_load():
    for name in ("embodied_mujoco", "embodied_maniskill"):
        cfg = load_config(["--config", f"configs/{name}.yaml"])
        assert cfg.env.eval.video_cfg.save_video


@pytest.mark.skipif(not HAS_MUJOCO, reason="mujoco not installed (pip install -e '.[mujoco]')")
def test_mujoco_reacher_steps_and_renders_video_frames(tmp_path):
    from PIL import Image

    from rlinf_mini.envs.video import EvalVideoRecorder

    cfg = EnvSplitConfig(env_type="gymnasium", init_params=InitParams(id="Reacher-v5"), max_episode_steps=5,
                         auto_reset=False, video_cfg=VideoConfig(save_video=True, num_videos=1))
    spec = get_env_spec(cfg)
    assert (spec.obs_dim, spec.action_dim, spec.discrete) == (10, 2, False)
    env = make_env(cfg, torch.arange(2), 1)
    obs = env.reset()
    rec = EvalVideoRecorder(cfg.video_cfg, env, obs)
    for _ in range(5):
        obs, r, term, trunc, stats = env.chunk_step(torch.zeros(2, 1, 2))
        rec.add(env, obs, r, term)
        assert (r < 0).all()  # Reacher's reward is minus the distance (and control cost)
    assert trunc.all() and len(stats["return"]) == 2
    frames = env.render()
    assert frames.dtype == torch.uint8 and frames.shape[:2] == (2, 3) and frames.float().std() > 0
    assert Image.open(rec.save(tmp_path, "r")[0]).size[0] == 256  # 480 x 480 renders scaled down
    gif = Image.open(rec.save(tmp_path, "r")[0])
    assert gif.n_frames == 6  # reset + 5 steps (the last one ends the episode)
    env.close()


def test_maniskill_env_or_skip_with_reason():
    if not HAS_MANISKILL:
        pytest.skip("mani_skill not installed (pip install -e '.[maniskill]'; needs a render device)")
    cfg = EnvSplitConfig(env_type="maniskill", init_params=InitParams(id="PickCube-v1"), max_episode_steps=5)
    try:
        env = make_env(cfg, torch.arange(2), 1)
    except EnvError as e:  # typically: no Vulkan / EGL device, or Mesa older than 24.3
        pytest.skip(f"ManiSkill3 cannot create its env here: {e}")
    obs = env.reset()
    assert obs.shape == (2, env.spec.obs_dim)
    obs, r, term, trunc, _ = env.chunk_step(torch.zeros(2, 1, env.spec.action_dim))
    assert r.shape == (2, 1)
    env.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_default_vla_run_learns_and_follows_the_words(tmp_path):
    """configs/embodied.yaml: eval success from chance to >= 0.8; with the instructions swapped on the same episodes,
    success on the asked block falls to the random policy's level or below."""
    import json

    from benchmarks.vla_default_run import main

    out = tmp_path / "bench.json"
    assert main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    curve = report["eval_success_curve"]
    assert curve[0][1] < 0.35 and curve[-1][1] >= 0.8
    assert report["trained"]["success_asked"] >= 0.8
    assert report["trained"]["success_swapped"] <= report["random_policy"]["success_asked"]
    assert report["trained"]["reached_named_block_swapped"] >= 0.6  # it goes where the (swapped) words say


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not HAS_MUJOCO, reason="mujoco not installed (pip install -e '.[mujoco]')")
def test_mujoco_reacher_learns(tmp_path):
    import json

    from benchmarks.mujoco_vs_random import main

    out = tmp_path / "bench.json"
    assert main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["trained_eval_return"] > report["random_policy_return"] + 15
    assert report["trained_eval_return"] > report["untrained_eval_return"]
