"""A vector env that says where it failed: an exception in reset() or chunk_step() is re-raised as EnvFailure naming
the env worker's group, rank and pipeline stage (and the global sub-env ids), with the original as its cause.

    env = GuardedEnv(make_env(cfg, env_ids, C), f"EnvGroup rank {rank} stage {k}")

Without it, a simulator crash reads "EnvGroup rank 0 raised in interact()" with a traceback deep inside the env; with
it, the first line already says which of the rank's stages (and so which sub-envs) broke and in which call.
"""

from __future__ import annotations

import torch


class EnvFailure(RuntimeError):
    """An env raised in reset() or chunk_step()."""


class GuardedEnv:
    """Forwards the VectorEnv contract (rlinf_mini/envs/__init__.py) to `env`, labelling its exceptions."""

    def __init__(self, env, where: str):
        self.env, self.where = env, where
        self.spec, self.num_envs, self.env_ids = env.spec, env.num_envs, env.env_ids
        self.cfg = getattr(env, "cfg", None)  # the eval video recorder labels its frames with cfg.init_params.id
        ids = env.env_ids
        self._ids = f"sub-envs {int(ids[0])}-{int(ids[-1])}" if len(ids) else "no sub-envs"

    @property
    def final_obs(self):
        """The contract's final_obs after chunk_step (None for an env that keeps none, e.g. ManiSkill's)."""
        return getattr(self.env, "final_obs", None)

    def keep_final_obs(self, of: str) -> None:
        """Ask the env to keep the final observations of the episodes that end by 'truncations' or 'dones'."""
        if hasattr(self.env, "final_obs_of"):
            self.env.final_obs_of = of

    def _fail(self, method: str, e: Exception) -> EnvFailure:
        return EnvFailure(f"{self.where} ({self._ids}): env {method}() raised {type(e).__name__}: {e}")

    def reset(self) -> torch.Tensor:
        try:
            return self.env.reset()
        except Exception as e:
            raise self._fail("reset", e) from e

    def chunk_step(self, actions: torch.Tensor):
        try:
            return self.env.chunk_step(actions)
        except Exception as e:
            raise self._fail("chunk_step", e) from e

    def render(self) -> torch.Tensor:
        """uint8 [B, 3, H, W] frames, for the eval videos of envs without image observations (gymnasium, ManiSkill)."""
        try:
            return self.env.render()
        except Exception as e:
            raise self._fail("render", e) from e

    def get_state(self) -> dict:
        return self.env.get_state()

    def set_state(self, state: dict) -> None:
        self.env.set_state(state)

    def close(self) -> None:
        self.env.close()
