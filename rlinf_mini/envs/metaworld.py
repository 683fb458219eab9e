"""MetaWorldVectorEnv: MetaWorld v3 tasks (RLinf's suites or one task) behind the chunk_step contract, on the CPU.

    pip install -e ".[metaworld]"       # metaworld 3.1.1, mujoco 3.x; images render headless with MUJOCO_GL=egl
    python -m rlinf_mini.train --config configs/metaworld_push.yaml

Sub-env with global id e runs task `names[(e // group_size) % len(names)]` of cfg.task_suite_name (its description
is the instruction) and is seeded with `seed + e // group_size` on its first reset (every reset with
use_fixed_reset_state_ids), so its episodes depend only on (seed, e), not on the split over stages or ranks; MuJoCo
is deterministic on one machine, so the trajectories are too. A MetaWorld reset state is one of the task's 50 goal /
object layouts, drawn from the sub-env's RNG. After each reset, 15 zero-action steps let the objects settle (RLinf's
RESET_STEP); they do not count towards max_episode_steps.
Reward: reward_coef * success (RLinf) or reward_coef * MetaWorld's shaped reward (use_dense_reward), as a change
since the last step with use_rel_reward. Success (`info["success"]`) ends the episode unless ignore_terminations.
A step whose simulation returns a NaN/inf observation or reward ends its episode as a termination with reward 0
(nothing to bootstrap from), the sub-env is reset, and one line on stderr says so: one sub-env's blow-up never stops
a run.
episode_stats add `success_at_end` (success on the episode's last step) to `success_once` (success at any step),
and with several tasks `success_once/<task>` (the episodes of that task alone).
obs: the 39-dim state [B, 39] (init_params.obs_mode 'state'; [B, 39 + tasks] with use_one_hot), or the dict
`images` uint8 [B, 3, H, W] (camera 2, flipped as RLinf does), `task_descriptions`, `states` [B, 4] (hand position,
gripper) for 'rgb'.
Differences from RLinf: a sub-env keeps its task (RLinf redraws a task per reset and rebuilds the env), and the B
envs step in one process. get_state/set_state keep the RNGs and our bookkeeping, not the physics: resume is not exact.
RLinf counterpart: `rlinf/envs/metaworld/metaworld_env.py::MetaWorldEnv`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
import types

import numpy as np
import torch

from rlinf_mini.config import EnvSplitConfig
from rlinf_mini.envs.base import EnvError, EnvSpec, pack_final_obs
from rlinf_mini.envs.metaworld_tasks import SUITES, TASK_DESCRIPTIONS, suite_task_names

SETTLE_STEPS = 15
"""Zero-action steps after every reset (RLinf's MetaWorldEnv.RESET_STEP)."""
STATE_DIM = 39
RGB_STATE_DIM = 4  # obs[:4]: hand xyz and gripper opening, RLinf's `state` next to the image


def task_names(cfg: EnvSplitConfig, key: str) -> list[str]:
    names = suite_task_names(cfg.task_suite_name)
    if names is None:
        raise EnvError(f"{key}.task_suite_name: unknown MetaWorld suite or task {cfg.task_suite_name!r} "
                       f"(suites: {', '.join(SUITES)}; or a task such as 'push-v3')")
    return names


def require_metaworld(key: str) -> None:
    """The missing extra as one line naming the key, before any worker starts (find_spec imports nothing)."""
    try:
        found = importlib.util.find_spec("metaworld") is not None
    except ValueError:  # sys.modules["metaworld"] is None: blocked, as absent
        found = False
    if not found:
        raise EnvError(f"{key}.env_type: 'metaworld' needs metaworld (pip install -e '.[metaworld]'): "
                       "No module named 'metaworld'")


def metaworld_env_spec(cfg: EnvSplitConfig, key: str) -> EnvSpec:
    require_metaworld(key)
    names = task_names(cfg, key)
    if cfg.init_params.obs_mode == "rgb":
        if cfg.use_one_hot:
            raise EnvError(f"{key}.use_one_hot: the one-hot is appended to the state (init_params.obs_mode 'state'); "
                           "with 'rgb' the task description is the VLA's instruction")
        shape = (3, cfg.init_params.camera_heights, cfg.init_params.camera_widths)
        return EnvSpec(obs_dim=RGB_STATE_DIM, action_dim=4, discrete=False, image_shape=shape)
    return EnvSpec(obs_dim=STATE_DIM + (len(names) if cfg.use_one_hot else 0), action_dim=4, discrete=False)


def _touching_object(self, object_geom_id: int) -> bool:
    """MetaWorld's SawyerXYZEnv.touching_object (both finger pads press on the object), bound to each sub-env in
    place of the original: the same answer from MuJoCo's contact arrays instead of a Python loop over every contact
    (a wrapper object each): a push-v3 step 1.01 -> 0.57 ms (benchmarks/metaworld_env_cost.json; push, pick-place and
    the other tasks with an object ask it every step). Sums the forces in the original's order, from a Python 0."""
    contact = self.data.contact
    geom1, geom2 = contact.geom1, contact.geom2  # [ncon]
    on_object = (geom1 == object_geom_id) | (geom2 == object_geom_id)
    forces = []
    for pad in ("leftpad_geom", "rightpad_geom"):
        pad_id = self.data.geom(pad).id
        rows = contact.efc_address[on_object & ((geom1 == pad_id) | (geom2 == pad_id))]
        forces.append(sum(self.data.efc_force[rows].tolist()))
    return 0 < forces[0] and 0 < forces[1]


@functools.cache
def _mt1(task: str, seed: int):
    """MetaWorld's MT1 benchmark of one task: its 50 reset layouts (drawn with `seed`, the global RNG restored)."""
    import metaworld
    return metaworld.MT1(task, seed=seed)


def _make_one(cfg: EnvSplitConfig, task: str, key: str):
    rgb = cfg.init_params.obs_mode == "rgb"
    if rgb or cfg.video_cfg.save_video:
        os.environ.setdefault("MUJOCO_GL", "egl")  # read when the first renderer is made: headless by default
    try:
        import gymnasium
        import metaworld
    except ImportError as e:
        raise EnvError(f"{key}.env_type: 'metaworld' needs metaworld (pip install -e '.[metaworld]'): {e}") from None
    render = {}
    if rgb or cfg.video_cfg.save_video:
        render = {"render_mode": "rgb_array", "camera_id": 2, "width": cfg.init_params.camera_widths,
                  "height": cfg.init_params.camera_heights}
    # what gymnasium.make("Meta-World/MT1", env_name=task, seed=cfg.seed) builds (metaworld.make_mt_envs), with the
    # task's 50 reset layouts made once per process rather than once per sub-env: making them resets a fresh env 50
    # times, most of what one gymnasium.make costs (26 sub-envs: 19.8 s -> 4.3 s, benchmarks/metaworld_env_cost.json)
    benchmark = _mt1(task, cfg.seed)
    env = metaworld._init_each_env(env_cls=benchmark.train_classes[task], tasks=benchmark.train_tasks, seed=cfg.seed,
                                   num_tasks=1, **render)
    env = gymnasium.wrappers.OrderEnforcing(env)  # what gymnasium.make adds on top
    env.unwrapped.touching_object = types.MethodType(_touching_object, env.unwrapped)
    # MetaWorld raises past max_path_length; our own counter truncates at max_episode_steps
    env.unwrapped.max_path_length = cfg.max_episode_steps + SETTLE_STEPS
    if render:
        env.unwrapped.model.cam_pos[2] = [0.75, 0.075, 0.7]  # RLinf's camera placement (its SFT data's view)
        if not cfg.init_params.render_shadows:  # a shadow costs each light an extra pass over the scene
            env.unwrapped.model.light_castshadow[:] = 0
    return env


class MetaWorldVectorEnv:
    def __init__(self, cfg: EnvSplitConfig, env_ids: torch.Tensor, num_action_chunks: int, key: str = "env.train"):
        self.cfg = cfg
        self.env_ids = env_ids.to(torch.int64).clone()  # [B] global sub-env ids
        self.num_envs = B = len(self.env_ids)
        self.num_action_chunks = num_action_chunks
        self.spec = metaworld_env_spec(cfg, key)
        self.rgb = cfg.init_params.obs_mode == "rgb"
        names = task_names(cfg, key)
        self._seed_ids = (self.env_ids // cfg.group_size).tolist()
        self.tasks = [names[g % len(names)] for g in self._seed_ids]
        self.one_hot = None  # [B, tasks] with use_one_hot: row b is 1 at sub-env b's task index in the suite
        if cfg.use_one_hot:
            self.one_hot = torch.zeros(B, len(names))
            self.one_hot[torch.arange(B), torch.tensor([names.index(t) for t in self.tasks])] = 1.0
        # several tasks: episode stats also per task ("success_once/<task>"), for per-task success in the logs
        self.per_task = len(set(self.tasks)) > 1
        self.task_descriptions = [TASK_DESCRIPTIONS[t] for t in self.tasks]
        self.envs = [_make_one(cfg, t, key) for t in self.tasks]
        self.state = np.zeros((B, STATE_DIM), dtype=np.float32)  # [B, 39] latest state of every sub-env
        self.elapsed = [0] * B
        self.episode_return = [0.0] * B
        self.prev_reward = [0.0] * B  # the last step's reward before use_rel_reward's difference
        self.success_once = [False] * B
        self.num_resets = [0] * B
        self.finished = [False] * B  # auto_reset False: done until the next reset()
        self.obs_empty = torch.empty  # the env worker may set its channel's allocator (frames drawn in shared memory)
        self.final_obs_of = "none"  # the contract's final_obs (rlinf_mini/envs/__init__.py), set by the env worker
        self.final_obs = None
        self.num_nonfinite = 0  # steps whose simulation returned NaN/inf (each ended its episode)

    def _reset_one(self, b: int) -> None:
        env = self.envs[b]
        if self.num_resets[b] == 0 or self.cfg.use_fixed_reset_state_ids:
            # MetaWorld's reset(seed=...) ignores the seed: its task choice draws from the unwrapped env's RNG
            env.unwrapped.seed(self.cfg.seed + self._seed_ids[b])
        obs, _ = env.reset()
        zero = np.zeros(4, dtype=np.float32)
        for _ in range(SETTLE_STEPS):
            obs, *_ = env.step(zero)
        self.state[b] = obs
        self.elapsed[b] = 0
        self.episode_return[b] = 0.0
        self.prev_reward[b] = 0.0
        self.success_once[b] = False
        self.num_resets[b] += 1
        self.finished[b] = False

    def _obs(self):
        state = torch.from_numpy(self.state.copy())  # a copy: self.state keeps changing on the next call
        if not self.rgb:
            return state if self.one_hot is None else torch.cat([state, self.one_hot], dim=1)  # [B, 39 + tasks]
        images = self.obs_empty((self.num_envs, *self.spec.image_shape), dtype=torch.uint8)
        for b, env in enumerate(self.envs):
            frame = env.render()[::-1, ::-1]  # [H, W, 3], turned as RLinf turns it
            images[b] = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)
        return {"images": images, "task_descriptions": list(self.task_descriptions),
                "states": state[:, :RGB_STATE_DIM].clone()}

    def _report_nonfinite(self, b: int) -> None:
        """One line on stderr per event: a sub-env whose simulation returned NaN/inf (its episode ends there)."""
        self.num_nonfinite += 1
        print(f"MetaWorld {self.tasks[b]} sub-env {int(self.env_ids[b])}: non-finite observation or reward at "
              f"episode step {self.elapsed[b] + 1}; the episode ends there and the sub-env is reset "
              f"({self.num_nonfinite} so far in this env)", file=sys.stderr, flush=True)

    def _obs_row(self, b: int):
        """Sub-env b's observation now (one row of _obs()): for the final observation of an episode."""
        state = torch.from_numpy(self.state[b].copy())
        if not self.rgb:
            return state if self.one_hot is None else torch.cat([state, self.one_hot[b]])
        frame = np.ascontiguousarray(self.envs[b].render()[::-1, ::-1])
        return {"images": torch.from_numpy(frame).permute(2, 0, 1), "task_descriptions": self.task_descriptions[b],
                "states": state[:RGB_STATE_DIM]}

    def reset(self):
        """Start a new episode in every sub-env (a new reset round)."""
        for b in range(self.num_envs):
            self._reset_one(b)
        return self._obs()

    def _step_reward(self, b: int, dense: float, success: bool) -> float:
        """RLinf's _calc_step_reward for one sub-env: reward_coef * (success or shaped reward), maybe differenced."""
        reward = self.cfg.reward_coef * (dense if self.cfg.use_dense_reward else float(success))
        diff = reward - self.prev_reward[b]
        self.prev_reward[b] = reward
        return diff if self.cfg.use_rel_reward else reward

    def chunk_step(self, actions: torch.Tensor):
        """actions [B, C, 4] -> (obs, rewards [B, C], terminations [B, C], truncations [B, C], episode_stats);
        the rules are in rlinf_mini/envs/__init__.py."""
        B, C = self.num_envs, self.num_action_chunks
        if tuple(actions.shape) != (B, C, 4):
            raise ValueError(f"MetaWorldVectorEnv.chunk_step: actions must be [{B}, {C}, 4], got {list(actions.shape)}")
        env_actions = np.clip(actions.detach().cpu().numpy().astype(np.float32), -1.0, 1.0)
        rewards = np.zeros((B, C), dtype=np.float32)
        terminations = np.zeros((B, C), dtype=bool)
        truncations = np.zeros((B, C), dtype=bool)
        ended_in_chunk = [False] * B
        stats: dict[str, list[float]] = {"return": [], "episode_len": [], "success_once": [], "success_at_end": []}
        finals: dict[int, object] = {}  # sub-env -> the final obs of its episode that ended (one row)
        for c in range(C):
            if self.cfg.step_latency_s > 0:
                time.sleep(self.cfg.step_latency_s)
            for b in range(B):
                if self.finished[b]:
                    continue
                obs, dense, _, _, info = self.envs[b].step(env_actions[b, c])
                broken = not (np.isfinite(obs).all() and np.isfinite(dense))
                if broken:  # the physics blew up: end the episode there (no reward, nothing to bootstrap), reset
                    self._report_nonfinite(b)
                    obs, dense, info = self.state[b], 0.0, {"success": 0.0}
                success = bool(info["success"])
                reward = self._step_reward(b, float(dense), success)
                self.state[b] = obs
                self.elapsed[b] += 1
                self.episode_return[b] += reward
                self.success_once[b] |= success
                terminated = broken or (success and not self.cfg.ignore_terminations)
                truncated = not terminated and self.elapsed[b] >= self.cfg.max_episode_steps
                if not ended_in_chunk[b]:
                    rewards[b, c] = reward
                    terminations[b, c] = terminated
                    truncations[b, c] = truncated
                if terminated or truncated:
                    keep = {"truncations": truncated, "dones": True}.get(self.final_obs_of, False)
                    if keep and self.cfg.auto_reset and not ended_in_chunk[b]:
                        finals[b] = self._obs_row(b)
                    ended_in_chunk[b] = True
                    stats["return"].append(self.episode_return[b])
                    stats["episode_len"].append(float(self.elapsed[b]))
                    stats["success_once"].append(float(self.success_once[b]))
                    stats["success_at_end"].append(float(success))
                    if self.per_task:
                        stats.setdefault(f"success_once/{self.tasks[b]}", []).append(float(self.success_once[b]))
                    if self.cfg.auto_reset:
                        self._reset_one(b)
                    else:
                        self.finished[b] = True
        episode_stats = {k: torch.tensor(v, dtype=torch.float32) for k, v in stats.items()}
        rewards, terminations, truncations = map(torch.from_numpy, (rewards, terminations, truncations))
        obs = self._obs()
        self.final_obs = pack_final_obs(obs, finals, B)
        return obs, rewards, terminations, truncations, episode_stats

    def render(self) -> torch.Tensor:
        """uint8 [B, 3, H, W] frames for eval videos (needs video_cfg.save_video or obs_mode 'rgb')."""
        frames = np.stack([env.render()[::-1, ::-1] for env in self.envs])  # [B, H, W, 3]
        return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()

    def get_state(self) -> dict:
        return {
            "env_ids": self.env_ids.clone(), "state": torch.from_numpy(self.state.copy()),
            "elapsed": torch.tensor(self.elapsed, dtype=torch.int64),
            "episode_return": torch.tensor(self.episode_return, dtype=torch.float64),
            "prev_reward": torch.tensor(self.prev_reward, dtype=torch.float64),
            "success_once": torch.tensor(self.success_once, dtype=torch.bool),
            "num_resets": torch.tensor(self.num_resets, dtype=torch.int64),
            "finished": torch.tensor(self.finished, dtype=torch.bool),
            "rng_states": [env.unwrapped.np_random.bit_generator.state for env in self.envs],
        }

    def set_state(self, state: dict) -> None:
        if not torch.equal(state["env_ids"], self.env_ids):
            raise ValueError("MetaWorldVectorEnv.set_state: the state was saved for other env ids")
        for b, env in enumerate(self.envs):
            if self.num_resets[b] == 0:
                env.reset()  # gymnasium's OrderEnforcing wrapper refuses step() before a reset()
            env.unwrapped.np_random.bit_generator.state = state["rng_states"][b]
        self.state = state["state"].numpy().astype(np.float32, copy=True)
        for name in ("elapsed", "episode_return", "prev_reward", "success_once", "num_resets", "finished"):
            setattr(self, name, state[name].tolist())

    def close(self) -> None:
        for env in self.envs:
            env.close()
