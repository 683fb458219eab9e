"""Vectorized environments: the contract the env worker (stages/rollout.py) steps, and the two envs that meet it.

    spec = get_env_spec(cfg.env.train)                                  # EnvSpec(obs_dim, action_dim, discrete)
    env = make_env(cfg.env.train, env_ids=torch.arange(8, 16), num_action_chunks=C)
    obs = env.reset()                                                   # [B, obs_dim]
    obs, rewards, terminations, truncations, episode_stats = env.chunk_step(actions)

Every VectorEnv (FakeReachEnv in fake_reach.py, GymnasiumVectorEnv in gym_adapter.py, MetaWorldVectorEnv in
metaworld.py) has `spec`, `num_envs`, and:

- `reset() -> obs`: starts a new episode in every sub-env (a new "reset round"). obs is a float32 tensor [B, obs_dim]
  (FakeReach, gymnasium) or, for image + language envs (PixelReach), a dict like RLinf's: `images` uint8 [B, 3, H, W],
  `task_descriptions` (B strings), `states` float32 [B, obs_dim].
- `chunk_step(actions)`: actions [B, C, A] float32 (Box) or [B, C] int64 (Discrete), executed open loop for C sub-steps.
  Returns obs [B, obs_dim], rewards [B, C] float32, terminations [B, C] bool, truncations [B, C] bool, and
  episode_stats {"return", "episode_len", "success_once"} (MetaWorld adds "success_at_end"): one float32 entry per
  episode that ended during the call (possibly none). A truncation is reported only when the episode did not
  terminate on that sub-step.
  Once a sub-env's episode ends inside a chunk, its later rewards and dones in that chunk read 0 / False:
  - auto_reset True: the sub-env is reset at once and the chunk's remaining actions go to the new episode (they count
    towards its length, return and time limit, but their rewards are masked for this chunk step); the returned obs is
    the new episode's latest obs.
  - auto_reset False: the sub-env stays finished until the next reset(): reward 0, no termination or truncation, and
    its obs stays the final obs.
- `final_obs_of` ('none', 'truncations' or 'dones'; set by the env worker from algorithm.bootstrap_type) and
  `final_obs`: after each chunk_step, None, or (ended [B] bool, an obs batch whose `ended` rows hold the final
  observation of the episode that ended that way in the chunk and was auto-reset; the other rows are the returned
  obs). The rollout's value of it bootstraps the episode's last reward (stages/rollout.py); ManiSkill keeps none.
- `get_state() -> dict` / `set_state(dict)`: everything needed to continue bitwise after a resume.
- `close()`.
- If cfg.step_latency_s > 0, each sub-step sleeps that long (emulating a slow simulator; RLinf's InsertDelay wrapper).
FakeReach and PixelReach write only their sub-step; the chunk loop with these rules is `TorchChunkEnv` in base.py.

RLinf counterpart: `rlinf/envs/__init__.py::get_env_cls` and `ManiskillEnv.chunk_step` (rlinf-map.md, section 9).
Optional: `render() -> uint8 [B, 3, H, W]` frames for eval videos (rlinf_mini/envs/video.py); `obs_empty(shape,
dtype)`, where an env that draws images allocates each frame (PixelReach): the env worker sets it to its rollout
channel's `empty`, so that the frame is drawn in shared memory and put without a copy.
Left out: offloading and `ignore_terminations` (MetaWorld has it).
RLinf's ManiSkill env finishes a chunk in the ended episode and resets after it; we reset at once, as stated above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvError, EnvSpec, TorchChunkEnv

__all__ = ["EnvError", "EnvSpec", "TorchChunkEnv", "get_env_spec", "make_env", "FAKE_IDS"]

if TYPE_CHECKING:
    from rlinf_mini.envs.fake_reach import FakeReachEnv
    from rlinf_mini.envs.gym_adapter import GymnasiumVectorEnv
    from rlinf_mini.envs.pixel_reach import PixelReachEnv

FAKE_REACH_ID = "FakeReach-v0"
PIXEL_REACH_ID = "PixelReach-v0"
FAKE_IDS = (FAKE_REACH_ID, PIXEL_REACH_ID)


def _check_fake_id(cfg: EnvSplitConfig, key: str) -> None:
    if cfg.init_params.id not in FAKE_IDS:
        known = ", ".join(map(repr, FAKE_IDS))
        raise EnvError(f"{key}.init_params.id: unknown fake env id {cfg.init_params.id!r} (known: {known})")


def get_env_spec(cfg: EnvSplitConfig, key: str = "env.train") -> EnvSpec:
    """The obs/action sizes of the env that `cfg` describes (for gymnasium, builds one env and closes it)."""
    if cfg.env_type == "fake":
        _check_fake_id(cfg, key)
        if cfg.init_params.id == PIXEL_REACH_ID:
            from rlinf_mini.envs.pixel_reach import pixel_reach_spec

            return pixel_reach_spec(cfg)
        return EnvSpec(obs_dim=2 * cfg.init_params.dim, action_dim=cfg.init_params.dim, discrete=False)
    if cfg.env_type == "maniskill":
        from rlinf_mini.envs.maniskill import maniskill_env_spec

        return maniskill_env_spec(cfg, key)
    if cfg.env_type == "metaworld":
        from rlinf_mini.envs.metaworld import metaworld_env_spec

        return metaworld_env_spec(cfg, key)
    # Imported here: the fake env needs no gymnasium, and the env modules import EnvSpec from this file.
    from rlinf_mini.envs.gym_adapter import gym_env_spec

    return gym_env_spec(cfg, key)


def make_env(cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int,
             key: str = "env.train") -> FakeReachEnv | PixelReachEnv | GymnasiumVectorEnv:
    """The vector env for global sub-env ids `env_ids` [B] (e.g. torch.arange(8, 16) for the second of two stages).

    `key` ('env.train' or 'env.eval') only names the config section in error messages.
    """
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64).reshape(-1)
    if cfg.env_type == "fake":
        _check_fake_id(cfg, key)
        if cfg.init_params.id == PIXEL_REACH_ID:
            from rlinf_mini.envs.pixel_reach import PixelReachEnv

            return PixelReachEnv(cfg, env_ids, num_action_chunks)
        from rlinf_mini.envs.fake_reach import FakeReachEnv

        return FakeReachEnv(cfg, env_ids, num_action_chunks)
    if cfg.env_type == "gymnasium":
        from rlinf_mini.envs.gym_adapter import GymnasiumVectorEnv

        return GymnasiumVectorEnv(cfg, env_ids, num_action_chunks, key)
    if cfg.env_type == "maniskill":
        from rlinf_mini.envs.maniskill import ManiSkillVectorEnv

        return ManiSkillVectorEnv(cfg, env_ids, num_action_chunks, key)
    if cfg.env_type == "metaworld":
        from rlinf_mini.envs.metaworld import MetaWorldVectorEnv

        return MetaWorldVectorEnv(cfg, env_ids, num_action_chunks, key)
    raise EnvError(f"{key}.env_type: unknown env type {cfg.env_type!r} "
                   "(known: 'fake', 'gymnasium', 'maniskill', 'metaworld')")
