"""PixelReach-v0: a vectorized torch env with camera images and language instructions, for the tiny VLA.

A G x G grid (init_params.grid_size) holds a red block, a blue block and the agent, at three distinct random cells. Each
episode draws one instruction, "move to the red block" or "move to the blue block": the same image asks for different
actions depending on the words, so a policy that ignores them reaches the asked block in at most about half the
episodes. Observations are a dict, as in RLinf's ManiSkill/LIBERO envs:

    images             uint8 [B, 3, H, W], H = W = G * init_params.cell_pixels; blocks fill their cell, the agent is a
                       white square in the middle of its cell (so a block under the agent stays visible)
    task_descriptions  list of B strings
    states             float32 [B, 2], the agent's cell scaled to [-1, 1]

Actions are Box [-1, 1]^2: each coordinate is rounded to a move of -1, 0 or +1 cell (8 directions and "stay"; the
tiny VLA's 3 action bins map exactly onto these). Reward per step = 0.1 * (previous - new Chebyshev distance to the
asked block) + 1.0 on success; success (the agent on the asked block's cell) terminates the episode; reaching
max_episode_steps truncates it. Touching the other block does nothing.

Reset states and seeding follow FakeReach-v0 (fake_reach.py): the reset of sub-env e with reset count k comes from
`counter_uniform(seed, e // group_size, k, n)`, so trajectories do not depend on the split over stages or ranks, GRPO
groups share reset states, and get_state/set_state resume bitwise.
"""

from __future__ import annotations

import torch

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvSpec, TorchChunkEnv
from rlinf_mini.utils.seeding import counter_uniform

COLORS = ("red", "blue")
"""Block colours; instruction variant i asks for block i."""
RGB = {"red": (230, 40, 40), "blue": (40, 80, 230), "agent": (255, 255, 255)}
INSTRUCTION = "move to the {} block"
SHAPING = 0.1
"""Weight of the dense distance reward (the success bonus is 1)."""


def pixel_reach_spec(cfg: EnvSplitConfig) -> EnvSpec:
    side = cfg.init_params.grid_size * cfg.init_params.cell_pixels
    return EnvSpec(obs_dim=2, action_dim=2, discrete=False, image_shape=(3, side, side))


class PixelReachEnv(TorchChunkEnv):
    def __init__(self, cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int):
        self.cfg = cfg
        self.env_ids = env_ids.to(torch.int64).clone()  # [B] global sub-env ids
        self.num_envs = B = len(self.env_ids)
        self.num_action_chunks = num_action_chunks
        self.grid = cfg.init_params.grid_size
        self.cell = cfg.init_params.cell_pixels
        self.spec = pixel_reach_spec(cfg)
        self.agent = torch.zeros(B, 2, dtype=torch.int64)  # [B, (row, col)]
        self.blocks = torch.zeros(B, len(COLORS), 2, dtype=torch.int64)  # [B, colour, (row, col)]
        self.target = torch.zeros(B, dtype=torch.int64)  # [B] index into COLORS
        self.elapsed = torch.zeros(B, dtype=torch.int64)
        self.episode_return = torch.zeros(B)
        self.num_resets = torch.zeros(B, dtype=torch.int64)
        self.finished = torch.zeros(B, dtype=torch.bool)  # auto_reset False: done until the next reset()

    # ----------------------------------------------------------------------------------------------------------------

    def _target_cell(self) -> torch.Tensor:
        return self.blocks[torch.arange(self.num_envs), self.target]  # [B, 2]

    def _distance(self) -> torch.Tensor:
        return (self._target_cell() - self.agent).abs().max(dim=1).values  # Chebyshev distance [B]

    def task_descriptions(self) -> list[str]:
        return [INSTRUCTION.format(COLORS[t]) for t in self.target.tolist()]

    obs_empty = staticmethod(torch.empty)
    """(shape, dtype) -> the tensor a frame is drawn into; the env worker sets its rollout channel's `empty`, so that
    each frame is drawn in shared memory and put without a copy (Channel.empty)."""

    def render(self) -> torch.Tensor:
        """uint8 [B, 3, H, W]: black background, coloured blocks, the agent as a white square in its cell."""
        B, G, P = self.num_envs, self.grid, self.cell
        img = self.obs_empty((B, 3, G * P, G * P), dtype=torch.uint8).zero_()
        rows = torch.arange(B)
        for i, color in enumerate(COLORS):
            r, c = self.blocks[:, i, 0], self.blocks[:, i, 1]
            for dy in range(P):
                for dx in range(P):
                    img[rows, :, r * P + dy, c * P + dx] = torch.tensor(RGB[color], dtype=torch.uint8)
        lo, hi = P // 4, P - P // 4  # the agent's inner square
        for dy in range(lo, hi):
            for dx in range(lo, hi):
                img[rows, :, self.agent[:, 0] * P + dy, self.agent[:, 1] * P + dx] = 255
        return img

    def _obs(self) -> dict:
        states = self.agent.to(torch.float32) / max(self.grid - 1, 1) * 2 - 1  # [B, 2] in [-1, 1]
        return {"images": self.render(), "task_descriptions": self.task_descriptions(), "states": states}

    def _reset_where(self, mask: torch.Tensor) -> None:
        G = self.grid
        counter = torch.zeros_like(self.num_resets) if self.cfg.use_fixed_reset_state_ids else self.num_resets
        u = counter_uniform(self.cfg.seed, self.env_ids // self.cfg.group_size, counter, G * G + 1)  # [B, G*G+1]
        cells = u[:, : G * G].argsort(dim=1)[:, :3]  # three distinct cells: agent, red, blue
        rc = torch.stack([cells // G, cells % G], dim=-1)  # [B, 3, 2]
        target = (u[:, -1] * len(COLORS)).to(torch.int64).clamp(max=len(COLORS) - 1)
        self.agent = torch.where(mask[:, None], rc[:, 0], self.agent)
        self.blocks = torch.where(mask[:, None, None], rc[:, 1:], self.blocks)
        self.target = torch.where(mask, target, self.target)
        self.elapsed = torch.where(mask, 0, self.elapsed)
        self.episode_return = torch.where(mask, 0.0, self.episode_return)
        self.num_resets = self.num_resets + mask.to(torch.int64)
        self.finished = self.finished & ~mask

    def reset(self) -> dict:
        """Start a new episode in every sub-env (a new reset round). Returns the obs dict."""
        self._reset_where(torch.ones(self.num_envs, dtype=torch.bool))
        return self._obs()

    def _check_actions(self, actions: torch.Tensor) -> None:
        B, C = self.num_envs, self.num_action_chunks
        if tuple(actions.shape) != (B, C, 2):
            raise ValueError(f"PixelReachEnv.chunk_step: actions must be [B, C, 2] = [{B}, {C}, 2], "
                             f"got {list(actions.shape)}")

    def _substep(self, actions_c: torch.Tensor, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """actions_c [B, 2] moves the live agents; (reward [B], success [B]). The chunk loop is TorchChunkEnv's."""
        move = actions_c.to(torch.float32).clamp(-1.0, 1.0).round().to(torch.int64)  # [B, 2] in {-1, 0, 1}
        prev_dist = self._distance()
        self.agent = torch.where(live[:, None], (self.agent + move).clamp(0, self.grid - 1), self.agent)
        dist = self._distance()
        success = live & (dist == 0)
        return torch.where(live, SHAPING * (prev_dist - dist).to(torch.float32) + success.to(torch.float32), 0.0), \
            success

    # ----------------------------------------------------------------------------------------------------------------

    _STATE_KEYS = ("agent", "blocks", "target", "elapsed", "episode_return", "num_resets", "finished")

    def get_state(self) -> dict:
        return {"env_ids": self.env_ids.clone(), **{k: getattr(self, k).clone() for k in self._STATE_KEYS}}

    def set_state(self, state: dict) -> None:
        if not torch.equal(state["env_ids"], self.env_ids):
            raise ValueError("PixelReachEnv.set_state: the state was saved for other env ids")
        for key in self._STATE_KEYS:
            setattr(self, key, state[key].clone())

    def close(self) -> None:
        pass
