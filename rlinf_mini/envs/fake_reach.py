"""FakeReach-v0: a vectorized torch "simulator" that a small MLP learns to solve with PPO in a few dozen updates.

Each sub-env has a position p and a goal g in [-1, 1]^dim; obs = concat(p, g), shape [B, 2*dim]. An action a in R^dim
is clipped to [-1, 1] and moves p by 0.2 * a (p stays in [-1, 1]^dim). Reward per step = (previous distance - new
distance) + 1.0 on success; success (|p - g| < goal_radius) terminates the episode, reaching max_episode_steps
truncates it.

Reset states come from `counter_uniform(seed, e // group_size, k, n)`, where e is the sub-env's global id and k its
reset count (always 0 with use_fixed_reset_state_ids). So a sub-env's episodes depend only on (seed, e): splitting the
same ids over 1 or 2 pipeline stages or ranks gives bitwise the same trajectories, and group_size consecutive sub-envs
(a GRPO group) start each reset round from the same state. The only state is a few tensors and the reset counts, so
get_state/set_state resume bitwise.

RLinf has no dummy simulator; this plays the role of a GPU-batched
ManiSkill env (`rlinf/envs/maniskill/maniskill_env.py::ManiskillEnv.chunk_step`), CPU only and with no rendering.
"""

from __future__ import annotations

import torch

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvSpec, TorchChunkEnv
from rlinf_mini.utils.seeding import counter_uniform

STEP_SIZE = 0.2
"""How far one action of norm 1 per coordinate moves the position."""
MIN_GOAL_DISTANCE = 0.5
"""Goals are drawn at least this far from the start."""
_GOAL_CANDIDATES = 16
"""Goal candidates drawn per reset; the first one far enough from the start is used (branch-free rejection)."""


class FakeReachEnv(TorchChunkEnv):
    def __init__(self, cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int):
        self.cfg = cfg
        self.env_ids = env_ids.to(torch.int64).clone()  # [B] global sub-env ids
        self.num_envs = len(self.env_ids)
        self.num_action_chunks = num_action_chunks
        self.dim = cfg.init_params.dim
        self.spec = EnvSpec(obs_dim=2 * self.dim, action_dim=self.dim, discrete=False)
        B, D = self.num_envs, self.dim
        self.pos = torch.zeros(B, D)  # [B, A]
        self.goal = torch.zeros(B, D)  # [B, A]
        self.elapsed = torch.zeros(B, dtype=torch.int64)  # steps taken in the current episode
        self.episode_return = torch.zeros(B)  # sum of the current episode's rewards (masked ones included)
        self.num_resets = torch.zeros(B, dtype=torch.int64)  # episodes started so far = the next reset's counter
        self.finished = torch.zeros(B, dtype=torch.bool)  # auto_reset False: done until the next reset()

    # ----------------------------------------------------------------------------------------------------------------

    def _obs(self) -> torch.Tensor:
        return torch.cat([self.pos, self.goal], dim=1)  # [B, 2*dim]

    def _draw_reset_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(start [B, dim], goal [B, dim]) for every sub-env's next episode."""
        B, D, K = self.num_envs, self.dim, _GOAL_CANDIDATES
        counter = torch.zeros_like(self.num_resets) if self.cfg.use_fixed_reset_state_ids else self.num_resets
        reset_ids = self.env_ids // self.cfg.group_size  # a GRPO group shares its reset states
        u = counter_uniform(self.cfg.seed, reset_ids, counter, (1 + K) * D) * 2 - 1  # [B, (1+K)*dim] in (-1, 1)
        start, candidates = u[:, :D], u[:, D:].reshape(B, K, D)
        far = torch.linalg.vector_norm(candidates - start[:, None], dim=-1) >= MIN_GOAL_DISTANCE  # [B, K]
        goal = candidates[torch.arange(B), far.to(torch.int64).argmax(dim=1)]  # argmax: the first far candidate
        # If no candidate is far enough (~1e-11 for dim 2), the opposite corner is at least 1 away.
        corner = torch.where(start >= 0, -1.0, 1.0)
        goal = torch.where(far.any(dim=1, keepdim=True), goal, corner)
        return start, goal

    def _reset_where(self, mask: torch.Tensor) -> None:
        start, goal = self._draw_reset_states()
        m = mask[:, None]
        self.pos = torch.where(m, start, self.pos)
        self.goal = torch.where(m, goal, self.goal)
        self.elapsed = torch.where(mask, 0, self.elapsed)
        self.episode_return = torch.where(mask, 0.0, self.episode_return)
        self.num_resets = self.num_resets + mask.to(torch.int64)
        self.finished = self.finished & ~mask

    def reset(self) -> torch.Tensor:
        """Start a new episode in every sub-env (a new reset round). Returns obs [B, 2*dim]."""
        self._reset_where(torch.ones(self.num_envs, dtype=torch.bool))
        return self._obs()

    # ----------------------------------------------------------------------------------------------------------------

    def _check_actions(self, actions: torch.Tensor) -> None:
        B, C = self.num_envs, self.num_action_chunks
        if tuple(actions.shape) != (B, C, self.dim):
            raise ValueError(f"FakeReachEnv.chunk_step: actions must be [B, C, A] = [{B}, {C}, {self.dim}], "
                             f"got {list(actions.shape)}")

    def _substep(self, actions_c: torch.Tensor, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """actions_c [B, A] moves the live sub-envs; (reward [B], success [B]). The chunk loop is TorchChunkEnv's."""
        a = actions_c.to(torch.float32).clamp(-1.0, 1.0)  # [B, A]
        prev_dist = torch.linalg.vector_norm(self.goal - self.pos, dim=1)
        self.pos = torch.where(live[:, None], (self.pos + STEP_SIZE * a).clamp(-1.0, 1.0), self.pos)
        dist = torch.linalg.vector_norm(self.goal - self.pos, dim=1)
        success = live & (dist < self.cfg.init_params.goal_radius)
        return torch.where(live, prev_dist - dist + success.to(torch.float32), 0.0), success

    # ----------------------------------------------------------------------------------------------------------------

    def get_state(self) -> dict:
        return {"env_ids": self.env_ids.clone(), "pos": self.pos.clone(), "goal": self.goal.clone(),
                "elapsed": self.elapsed.clone(), "episode_return": self.episode_return.clone(),
                "num_resets": self.num_resets.clone(), "finished": self.finished.clone()}

    def set_state(self, state: dict) -> None:
        if not torch.equal(state["env_ids"], self.env_ids):
            raise ValueError("FakeReachEnv.set_state: the state was saved for other env ids")
        for key in ("pos", "goal", "elapsed", "episode_return", "num_resets", "finished"):
            setattr(self, key, state[key].clone())

    def close(self) -> None:
        pass
