"""GymnasiumVectorEnv: B gymnasium envs (any installed id with a 1-D Box obs) behind the chunk_step contract.

The B envs are stepped one by one in a Python loop: serial, but every line is visible. gymnasium's own vector envs are
not used because their autoreset semantics changed across versions (1.0 made "next-step" autoreset the default, where
the step after a done returns the reset obs and ignores the action), and the chunk contract in
rlinf_mini/envs/__init__.py needs its own masking anyway.

Seeding: the sub-env with global id e is seeded with `cfg.seed + e // cfg.group_size` on its first reset only; later
resets continue its RNG (with use_fixed_reset_state_ids, every reset reseeds, so eval sees the same episodes). With
group_size 1 that is `seed + e`; with a larger group_size a GRPO group shares its reset states, as in the fake env.
Either way a sub-env's trajectory depends only on (seed, e), never on how the ids are split over stages or ranks.

get_state/set_state save each env's RNG state (`env.unwrapped.np_random.bit_generator.state`), its physics state
`env.unwrapped.state` and the TimeLimit's step count. That resumes bitwise for envs whose whole dynamic state is
`unwrapped.state` (classic control: CartPole, Pendulum, Acrobot, MountainCar). Envs that keep state elsewhere
(Box2D, MuJoCo) get their RNG and our bookkeeping back, but not their physics: their resume is not exact.

success_once = float(info.get("is_success", False)) at the episode's last step; envs without that key report 0.
RLinf counterpart: the tianshou-style SubprocVectorEnv of its LIBERO/MetaWorld envs (`rlinf/envs/venv/venv.py`),
here in one process.
"""

from __future__ import annotations

import time

import gymnasium
import numpy as np
import torch
from gymnasium.wrappers import TimeLimit

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvError, EnvSpec, pack_final_obs


def _make_one(cfg: EnvSplitConfig, key: str) -> gymnasium.Env:
    env_id = cfg.init_params.id
    # frames for eval videos (MuJoCo envs render through MUJOCO_GL=egl without a display)
    render = {"render_mode": "rgb_array"} if cfg.video_cfg.save_video else {}
    try:
        return gymnasium.make(env_id, max_episode_steps=cfg.max_episode_steps, **cfg.init_params.make_kwargs, **render)
    except gymnasium.error.UnregisteredEnv:
        raise EnvError(f"{key}.init_params.id: unknown gymnasium id {env_id!r}") from None
    except TypeError as e:  # a constructor argument from init_params the env does not take
        raise EnvError(f"{key}.init_params: {env_id!r} does not take {cfg.init_params.make_kwargs}: "
                       f"{str(e).splitlines()[0]}") from None
    except (gymnasium.error.Error, ImportError) as e:  # malformed id, missing module or dependency (e.g. box2d)
        first_line = str(e).splitlines()[0]
        raise EnvError(f"{key}.init_params.id: cannot make gymnasium env {env_id!r}: {first_line}") from None


def _spec_of(env: gymnasium.Env, cfg: EnvSplitConfig, key: str) -> EnvSpec:
    obs_space, act_space = env.observation_space, env.action_space
    where = f"{key}.init_params.id: {cfg.init_params.id!r} has"
    if not (isinstance(obs_space, gymnasium.spaces.Box) and len(obs_space.shape) == 1):
        raise EnvError(f"{where} observation space {obs_space}; only a 1-D Box is supported")
    if isinstance(act_space, gymnasium.spaces.Discrete):
        return EnvSpec(obs_dim=obs_space.shape[0], action_dim=int(act_space.n), discrete=True)
    if isinstance(act_space, gymnasium.spaces.Box) and len(act_space.shape) == 1:
        return EnvSpec(obs_dim=obs_space.shape[0], action_dim=act_space.shape[0], discrete=False)
    raise EnvError(f"{where} action space {act_space}; only a 1-D Box or Discrete is supported")


def gym_env_spec(cfg: EnvSplitConfig, key: str) -> EnvSpec:
    env = _make_one(cfg, key)
    try:
        return _spec_of(env, cfg, key)
    finally:
        env.close()


def _time_limit(env: gymnasium.Env) -> TimeLimit:
    while not isinstance(env, TimeLimit):
        env = env.env
    return env


class GymnasiumVectorEnv:
    def __init__(self, cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int, key: str = "env.train"):
        self.cfg = cfg
        self.env_ids = env_ids.to(torch.int64).clone()  # [B] global sub-env ids
        self.num_envs = len(self.env_ids)
        self.num_action_chunks = num_action_chunks
        self.envs = [_make_one(cfg, key) for _ in range(self.num_envs)]
        self.spec = _spec_of(self.envs[0], cfg, key)
        # Per-env bookkeeping lives in numpy / Python lists, not torch: each index into a torch tensor is a dispatch,
        # which a per-env Python loop pays for every scalar. Tensors are built once per call.
        B = self.num_envs
        self._seed_ids = self.env_ids.tolist()
        self.obs = np.zeros((B, self.spec.obs_dim), dtype=np.float32)  # [B, obs_dim] latest obs of every sub-env
        self.elapsed = [0] * B  # steps taken in the current episode
        self.episode_return = [0.0] * B  # sum of the current episode's rewards (Python floats are float64)
        self.num_resets = [0] * B  # episodes started so far
        self.finished = [False] * B  # auto_reset False: done until the next reset()
        self.final_obs_of = "none"  # the contract's final_obs (rlinf_mini/envs/__init__.py), set by the env worker
        self.final_obs = None

    def _reset_one(self, b: int) -> None:
        first = self.num_resets[b] == 0 or self.cfg.use_fixed_reset_state_ids
        seed = self.cfg.seed + self._seed_ids[b] // self.cfg.group_size if first else None
        obs, _ = self.envs[b].reset(seed=seed)
        self.obs[b] = obs  # numpy casts to float32 with the same rounding as torch
        self.elapsed[b] = 0
        self.episode_return[b] = 0.0
        self.num_resets[b] += 1
        self.finished[b] = False

    def reset(self) -> torch.Tensor:
        """Start a new episode in every sub-env (a new reset round). Returns obs [B, obs_dim]."""
        for b in range(self.num_envs):
            self._reset_one(b)
        return torch.from_numpy(self.obs.copy())

    def _env_actions(self, actions: torch.Tensor):
        """All B*C actions in the form env.step takes, converted in one go: [B][C] ints, or [B, C, A] clipped."""
        actions = actions.detach().cpu()
        if self.spec.discrete:
            return actions.to(torch.int64).tolist()  # int64 cast truncates like int(tensor) did
        space = self.envs[0].action_space
        return np.clip(actions.numpy().astype(space.dtype), space.low, space.high)

    def chunk_step(self, actions: torch.Tensor):
        """Execute C actions open loop. actions [B, C, A] (Box) or [B, C] (Discrete) -> (obs [B, obs_dim],
        rewards [B, C], terminations [B, C], truncations [B, C], episode_stats); rules: rlinf_mini/envs/__init__.py."""
        B, C = self.num_envs, self.num_action_chunks
        want = (B, C) if self.spec.discrete else (B, C, self.spec.action_dim)
        if tuple(actions.shape) != want:
            raise ValueError(f"GymnasiumVectorEnv.chunk_step: actions must be {list(want)}, got {list(actions.shape)}")
        env_actions = self._env_actions(actions)
        rewards = np.zeros((B, C), dtype=np.float32)
        terminations = np.zeros((B, C), dtype=bool)
        truncations = np.zeros((B, C), dtype=bool)
        ended_in_chunk = [False] * B  # later sub-steps of these rows are masked
        stats: dict[str, list[float]] = {"return": [], "episode_len": [], "success_once": []}
        finals: dict[int, torch.Tensor] = {}  # sub-env -> the final obs [obs_dim] of its episode that ended
        for c in range(C):
            if self.cfg.step_latency_s > 0:
                time.sleep(self.cfg.step_latency_s)
            for b in range(B):
                if self.finished[b]:
                    continue
                obs, reward, terminated, truncated, info = self.envs[b].step(env_actions[b][c])
                truncated = truncated and not terminated
                self.obs[b] = obs
                self.elapsed[b] += 1
                self.episode_return[b] += float(reward)
                if not ended_in_chunk[b]:
                    rewards[b, c] = float(reward)
                    terminations[b, c] = terminated
                    truncations[b, c] = truncated
                if terminated or truncated:
                    keep = {"truncations": truncated, "dones": True}.get(self.final_obs_of, False)
                    if keep and self.cfg.auto_reset and not ended_in_chunk[b]:
                        finals[b] = torch.from_numpy(self.obs[b].copy())
                    ended_in_chunk[b] = True
                    stats["return"].append(self.episode_return[b])
                    stats["episode_len"].append(float(self.elapsed[b]))
                    stats["success_once"].append(float(info.get("is_success", False)))
                    if self.cfg.auto_reset:
                        self._reset_one(b)
                    else:
                        self.finished[b] = True
        episode_stats = {k: torch.tensor(v, dtype=torch.float32) for k, v in stats.items()}
        obs = torch.from_numpy(self.obs.copy())  # a copy: self.obs keeps changing on the next call
        rewards, terminations, truncations = map(torch.from_numpy, (rewards, terminations, truncations))
        self.final_obs = pack_final_obs(obs, finals, B)
        return obs, rewards, terminations, truncations, episode_stats

    def get_state(self) -> dict:
        """Plain tensors, ints and strings (torch.load(weights_only=True) reads it back); limits in the module doc."""
        return {
            "env_ids": self.env_ids.clone(), "obs": torch.from_numpy(self.obs.copy()),
            "elapsed": torch.tensor(self.elapsed, dtype=torch.int64),
            "episode_return": torch.tensor(self.episode_return, dtype=torch.float64),
            "num_resets": torch.tensor(self.num_resets, dtype=torch.int64),
            "finished": torch.tensor(self.finished, dtype=torch.bool),
            "rng_states": [env.unwrapped.np_random.bit_generator.state for env in self.envs],
            "sim_states": [torch.as_tensor(np.array(env.unwrapped.state)) if hasattr(env.unwrapped, "state")
                           else None for env in self.envs],
        }

    def set_state(self, state: dict) -> None:
        if not torch.equal(state["env_ids"], self.env_ids):
            raise ValueError("GymnasiumVectorEnv.set_state: the state was saved for other env ids")
        for b, env in enumerate(self.envs):
            if self.num_resets[b] == 0:
                env.reset()  # gymnasium's OrderEnforcing wrapper refuses step() before a reset()
            env.unwrapped.np_random.bit_generator.state = state["rng_states"][b]
            if state["sim_states"][b] is not None:
                env.unwrapped.state = state["sim_states"][b].numpy().copy()
            _time_limit(env)._elapsed_steps = int(state["elapsed"][b])
        self.obs = state["obs"].numpy().astype(np.float32, copy=True)
        for key in ("elapsed", "episode_return", "num_resets", "finished"):
            setattr(self, key, state[key].tolist())

    def render(self) -> torch.Tensor:
        """uint8 [B, 3, H, W] frames (needs env.*.video_cfg.save_video, which makes the envs with render_mode
        'rgb_array')."""
        frames = np.stack([env.render() for env in self.envs])  # [B, H, W, 3]
        return torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()

    def close(self) -> None:
        for env in self.envs:
            env.close()
