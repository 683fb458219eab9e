"""The env contract: `EnvSpec` (what the policy is built for), `EnvError` (an env the config cannot build) and
`TorchChunkEnv` (the chunk-step rules of the package docstring, written once for tensor-state envs). Every module in
`envs/` imports these from here, never from the package face (`rlinf_mini/envs/__init__.py`, which imports them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EnvSpec:
    obs_dim: int
    """Size of the flat float observation."""
    action_dim: int
    """Box: its dimension; Discrete: the number of choices."""
    discrete: bool
    """True for a Discrete action space (actions are int64 indices)."""
    image_shape: tuple[int, ...] = ()
    """(3, H, W) for envs whose obs dict has `images` (PixelReach-v0); () for flat state vectors."""


class EnvError(ValueError):
    """An env that cannot be built from the config: one line naming the key, e.g. 'env.train.init_params.id: ...'."""


FINAL_OBS_OF = ("none", "truncations", "dones")
"""What a VectorEnv's `final_obs_of` may ask for (the env worker sets it from algorithm.bootstrap_type)."""


def final_obs_batch(obs, finals: dict[int, object]):
    """The obs batch (a tensor [B, ...] or a dict of them and lists of strings) with row b replaced by `finals[b]`,
    the final observation of the episode sub-env b just ended (same structure, one row). Returns a new batch."""
    if isinstance(obs, dict):
        return {name: final_obs_batch(v, {b: f[name] for b, f in finals.items()}) for name, v in obs.items()}
    out = list(obs) if isinstance(obs, list) else obs.clone()
    for b, row in finals.items():
        out[b] = row
    return out


def pack_final_obs(obs, finals: dict[int, object], num_envs: int):
    """What a VectorEnv's `final_obs` holds after chunk_step: None when no episode ended (the way asked) in the chunk,
    else (ended [B] bool, final_obs_batch(obs, finals))."""
    if not finals:
        return None
    ended = torch.zeros(num_envs, dtype=torch.bool)
    ended[list(finals)] = True
    return ended, final_obs_batch(obs, finals)


class TorchChunkEnv:
    """The chunk rules above, written once for the envs whose whole state is torch tensors (FakeReach, PixelReach).

    A subclass has `cfg`, `num_envs`, `num_action_chunks` and the tensors `elapsed` [B] int64, `episode_return` [B],
    `finished` [B] bool, and defines `_check_actions(actions)`, `_obs()`, `_reset_where(mask [B])` and
    `_substep(actions_c, live) -> (reward [B] float32, success [B] bool)`: one sub-step of the live sub-envs.
    """

    final_obs_of = "none"
    """Which ended episodes keep their final observation in `final_obs` (FINAL_OBS_OF; set by the env worker)."""
    final_obs = None
    """After chunk_step: None, or (ended [B] bool, obs batch whose `ended` rows hold the final observation of the
    episode that ended and was auto-reset in the chunk); the rollout's value of it bootstraps a truncated episode."""

    def chunk_step(self, actions: torch.Tensor):
        """Execute C actions open loop -> (obs, rewards [B, C], terminations [B, C], truncations [B, C],
        episode_stats); see the module docstring for the masking and auto-reset rules."""
        self._check_actions(actions)
        B, C = self.num_envs, self.num_action_chunks
        rewards = torch.zeros(B, C)
        terminations = torch.zeros(B, C, dtype=torch.bool)
        truncations = torch.zeros(B, C, dtype=torch.bool)
        ended_in_chunk = torch.zeros(B, dtype=torch.bool)  # later sub-steps of these rows are masked
        stats: dict[str, list[torch.Tensor]] = {"return": [], "episode_len": [], "success_once": []}
        finals: dict[int, object] = {}  # sub-env -> the final obs of its episode that ended (one row)
        for c in range(C):
            if self.cfg.step_latency_s > 0:
                time.sleep(self.cfg.step_latency_s)
            live = ~self.finished  # [B]; always all True with auto_reset
            reward, success = self._substep(actions[:, c], live)
            self.elapsed = self.elapsed + live.to(torch.int64)
            self.episode_return = self.episode_return + reward
            truncated = live & ~success & (self.elapsed >= self.cfg.max_episode_steps)
            done = success | truncated

            shown = ~ended_in_chunk
            rewards[:, c] = torch.where(shown, reward, 0.0)
            terminations[:, c] = success & shown
            truncations[:, c] = truncated & shown
            ended_in_chunk |= done
            if done.any():
                stats["return"].append(self.episode_return[done])
                stats["episode_len"].append(self.elapsed[done].to(torch.float32))
                stats["success_once"].append(success[done].to(torch.float32))
                if self.cfg.auto_reset:
                    keep = {"truncations": truncated, "dones": done}.get(self.final_obs_of)
                    keep = None if keep is None else keep & shown  # only the chunk's first episode end is shown
                    if keep is not None and keep.any():  # its obs, before the reset overwrites it
                        last = self._obs()
                        for b in keep.nonzero().flatten().tolist():
                            finals[b] = ({k: v[b] for k, v in last.items()} if isinstance(last, dict)
                                         else last[b])
                    self._reset_where(done)
                else:
                    self.finished = self.finished | done
        episode_stats = {k: torch.cat(v) if v else torch.zeros(0) for k, v in stats.items()}
        obs = self._obs()
        self.final_obs = pack_final_obs(obs, finals, B)
        return obs, rewards, terminations, truncations, episode_stats


def per_task_eval_sums(tasks: list[str], stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """tasks: each eval sub-env's task (MetaWorld's suites); with several, each task's success sum (from the
    episode stats' `success_once/<task>`) and sub-env count, for the runner to sum over ranks and divide
    ("eval/success_once/<task>"; an unfinished episode counts as a failure, as in the overall mean)."""
    if len(set(tasks)) < 2:
        return {}
    out = {}
    for task in dict.fromkeys(tasks):
        out[f"eval/success_once/{task}_sum"] = stats.get(f"success_once/{task}", torch.zeros(0)).sum().item()
        out[f"eval/num_envs/{task}"] = float(tasks.count(task))
    return out
