"""ManiSkillVectorEnv: a ManiSkill3 task (what RLinf trains on most) behind the chunk_step contract, state observations.

    pip install -e ".[maniskill]"       # mani_skill 3; needs a render device (Vulkan / EGL; Mesa >= 24.3 on CPU)
    python -m rlinf_mini.train --config configs/embodied_maniskill.yaml

ManiSkill3 simulates all B sub-envs as one batched env (`gym.make(id, num_envs=B)`, torch tensors in and out) and
resets finished sub-envs itself through `ManiSkillVectorEnv(auto_reset=True)`; this wrapper adds what the contract in
rlinf_mini/envs/__init__.py needs on top: C open-loop sub-steps per chunk, rewards / dones masked after the first end
inside a chunk, `success_once` from `info["success"]`, and, with auto_reset False, finished sub-envs frozen until the
next reset(). Seeds: the batched env is seeded once with `cfg.seed + env_ids[0] // group_size`, so unlike the fake
envs a sub-env's episodes depend on how the ids are split over stages (ManiSkill draws for the whole batch).

Not exercised by the default tests (no render device on the CI machines): tests/test_maniskill.py skips, with the
reason, when mani_skill is missing or cannot create its env. get_state/set_state keep our bookkeeping only.
RLinf counterpart: `rlinf/envs/maniskill/maniskill_env.py::ManiskillEnv`.
"""

from __future__ import annotations

import time

import torch

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvError, EnvSpec


def _make(cfg: EnvSplitConfig, num_envs: int, key: str):
    try:
        import gymnasium
        import mani_skill.envs  # noqa: F401  (registers the ids)
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv
    except ImportError as e:
        raise EnvError(f"{key}.env_type: 'maniskill' needs mani_skill (pip install -e '.[maniskill]'): {e}") from None
    render = {"render_mode": "rgb_array"} if cfg.video_cfg.save_video else {}
    try:
        env = gymnasium.make(cfg.init_params.id, num_envs=num_envs, obs_mode="state", **render)
    except Exception as e:  # unknown id, no render device, ...
        raise EnvError(f"{key}.init_params.id: cannot make ManiSkill env {cfg.init_params.id!r}: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ManiSkillVectorEnv(env, num_envs, auto_reset=cfg.auto_reset, ignore_terminations=False)


def maniskill_env_spec(cfg: EnvSplitConfig, key: str) -> EnvSpec:
    env = _make(cfg, 1, key)
    try:
        return EnvSpec(obs_dim=env.single_observation_space.shape[-1], action_dim=env.single_action_space.shape[-1],
                       discrete=False)
    finally:
        env.close()


class ManiSkillVectorEnv:
    def __init__(self, cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int, key: str = "env.train"):
        self.cfg = cfg
        self.env_ids = env_ids.to(torch.int64).clone()
        self.num_envs = B = len(self.env_ids)
        self.num_action_chunks = num_action_chunks
        self.env = _make(cfg, B, key)
        self.spec = EnvSpec(obs_dim=self.env.single_observation_space.shape[-1],
                            action_dim=self.env.single_action_space.shape[-1], discrete=False)
        self.elapsed = torch.zeros(B, dtype=torch.int64)
        self.episode_return = torch.zeros(B)
        self.finished = torch.zeros(B, dtype=torch.bool)
        self.num_resets = 0
        self.obs = torch.zeros(B, self.spec.obs_dim)

    def reset(self) -> torch.Tensor:
        seed = None
        if self.num_resets == 0 or self.cfg.use_fixed_reset_state_ids:
            seed = self.cfg.seed + int(self.env_ids[0]) // self.cfg.group_size
        obs, _ = self.env.reset(seed=seed)
        self.num_resets += 1
        self.obs = obs.float().cpu().reshape(self.num_envs, -1)
        self.elapsed.zero_()
        self.episode_return.zero_()
        self.finished.zero_()
        return self.obs.clone()

    def render(self) -> torch.Tensor:
        frames = self.env.render()  # [B, H, W, 3] uint8 tensor
        return torch.as_tensor(frames).cpu().permute(0, 3, 1, 2).contiguous()

    def chunk_step(self, actions: torch.Tensor):
        B, C = self.num_envs, self.num_action_chunks
        if tuple(actions.shape) != (B, C, self.spec.action_dim):
            raise ValueError(f"ManiSkillVectorEnv.chunk_step: actions must be [{B}, {C}, {self.spec.action_dim}], "
                             f"got {list(actions.shape)}")
        rewards = torch.zeros(B, C)
        terminations = torch.zeros(B, C, dtype=torch.bool)
        truncations = torch.zeros(B, C, dtype=torch.bool)
        ended = torch.zeros(B, dtype=torch.bool)
        stats: dict[str, list[torch.Tensor]] = {"return": [], "episode_len": [], "success_once": []}
        for c in range(C):
            if self.cfg.step_latency_s > 0:
                time.sleep(self.cfg.step_latency_s)
            live = ~self.finished
            obs, reward, term, trunc, info = self.env.step(actions[:, c])
            reward = torch.as_tensor(reward).float().cpu().reshape(B) * live
            term = torch.as_tensor(term).cpu().reshape(B) & live
            trunc = torch.as_tensor(trunc).cpu().reshape(B) & live & ~term
            new_obs = obs.float().cpu().reshape(B, -1)
            self.obs = torch.where(live[:, None], new_obs, self.obs)
            self.elapsed += live.to(torch.int64)
            self.episode_return += reward
            shown = ~ended
            rewards[:, c] = reward * shown
            terminations[:, c] = term & shown
            truncations[:, c] = trunc & shown
            done = term | trunc
            ended |= done
            if done.any():
                success = torch.as_tensor(info.get("success", torch.zeros(B, dtype=torch.bool))).cpu().reshape(B)
                stats["return"].append(self.episode_return[done].clone())
                stats["episode_len"].append(self.elapsed[done].float())
                stats["success_once"].append(success[done].float())
                self.episode_return[done] = 0.0
                self.elapsed[done] = 0
                if not self.cfg.auto_reset:
                    self.finished |= done
        episode_stats = {k: torch.cat(v) if v else torch.zeros(0) for k, v in stats.items()}
        return self.obs.clone(), rewards, terminations, truncations, episode_stats

    def get_state(self) -> dict:
        return {"env_ids": self.env_ids.clone(), "elapsed": self.elapsed.clone(),
                "episode_return": self.episode_return.clone(), "finished": self.finished.clone()}

    def set_state(self, state: dict) -> None:
        for key in ("elapsed", "episode_return", "finished"):
            setattr(self, key, state[key].clone())

    def close(self) -> None:
        self.env.close()
