"""The embodied sections of the schema: env.train / env.eval (RLinf's `env:` block), as tyro dataclasses."""

# (No `from __future__ import annotations` here: tyro reads these annotations at every parse with flags, and string
# annotations would be compiled again at each one; docs/performance.md has the cost.)

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class InitParams:
    id: str = "FakeReach-v0"
    """Environment id: 'FakeReach-v0' for the fake env, or any gymnasium id (e.g. 'CartPole-v1')."""
    dim: int = 2
    """rlinf_mini, fake env: dimension of the reach space (obs = [position, goal], action in R^dim)."""
    goal_radius: float = 0.15
    """rlinf_mini, fake env: the episode succeeds when the position is this close to the goal."""
    grid_size: int = 5
    """rlinf_mini, PixelReach-v0: the grid is grid_size x grid_size cells."""
    cell_pixels: int = 4
    """rlinf_mini, PixelReach-v0: each cell is cell_pixels x cell_pixels pixels (image side = grid_size * this)."""
    obs_mode: Literal["state", "rgb"] = "state"
    """rlinf_mini, env_type metaworld: 'state' (39-dim vector) or 'rgb' (RLinf's obs dict, tiny VLA)."""
    camera_heights: int = 480
    """env_type metaworld, obs_mode rgb: camera image height in pixels."""
    camera_widths: int = 480
    """env_type metaworld, obs_mode rgb: camera image width in pixels."""
    render_shadows: bool = True
    """rlinf_mini, env_type metaworld (obs_mode rgb, eval videos): false turns MuJoCo's shadows off (every light's
    castshadow), which are most of a frame's cost on a software renderer (Mesa's llvmpipe behind EGL:
    docs/metaworld.md); the frames then differ from the view RLinf's SFT data saw (no shadows)."""
    make_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)
    """env_type gymnasium: gymnasium.make's keyword arguments (in YAML: init_params' other keys)."""


@dataclass
class VideoConfig:
    save_video: bool = False
    """Write, at each evaluation, a gif per recorded eval sub-env (the instruction and the outcome drawn on it)."""
    info_on_video: bool = True
    """Draw the instruction (or env id), the return so far and success on the frames."""
    video_base_dir: str = ""
    """Folder for the videos; '' = <log_path>/<experiment_name>/videos."""
    num_videos: int = 4
    """rlinf_mini: record this many sub-envs per env rank (the first ones of pipeline stage 0)."""


@dataclass
class EnvSplitConfig:
    env_type: Literal["fake", "gymnasium", "maniskill", "metaworld"] = "fake"
    """'fake' (CPU envs), 'gymnasium' (init_params.id), 'maniskill' or 'metaworld' (task_suite_name)."""
    task_suite_name: str = "metaworld_50"
    """env_type metaworld: 'metaworld_50', 'metaworld_45_ind', '_ood', 'MT10', or one task."""
    use_one_hot: bool = False
    """env_type metaworld, obs_mode state: append the task's one-hot to the 39-dim state."""
    use_rel_reward: bool = True
    """env_type metaworld: the reward is the change of the step reward since the last step (RLinf's math)."""
    reward_coef: float = 1.0
    """env_type metaworld: step reward = reward_coef * success (or * the dense reward)."""
    use_dense_reward: bool = False
    """rlinf_mini, env_type metaworld: MetaWorld's shaped reward, not RLinf's sparse success."""
    normalize_reward: bool = False
    """rlinf_mini, env.train: scale rewards by the running std of the return (SB3 VecNormalize)."""
    ignore_terminations: bool = False
    """env_type metaworld: success does not end the episode; episodes run to max_episode_steps (RLinf's key)."""
    total_num_envs: int = 16
    """Sub-envs across all env ranks and pipeline stages."""
    auto_reset: bool = True
    """Reset a sub-env as soon as its episode ends (otherwise it stays done until the next rollout epoch)."""
    seed: int = 0
    """Seed of the env's reset states."""
    group_size: int = 1
    """Consecutive sub-envs that share one reset state (GRPO groups)."""
    use_fixed_reset_state_ids: bool = False
    """Draw the same reset states at every reset round (use for eval, to compare steps on the same episodes)."""
    max_steps_per_rollout_epoch: int = 32
    """Env steps per rollout epoch (a multiple of actor.model.num_action_chunks)."""
    max_episode_steps: int = 32
    """Truncate episodes after this many env steps."""
    rollout_epoch: int = 1
    """Rollout epochs per training step; their trajectories are concatenated along the env axis."""
    step_latency_s: float = 0.0
    """rlinf_mini: sleep this long per env step, to emulate a slow simulator (RLinf's InsertDelay wrapper)."""
    init_params: InitParams = field(default_factory=InitParams)
    """Parameters for constructing the env."""
    video_cfg: VideoConfig = field(default_factory=VideoConfig)
    """Eval videos (read for env.eval only)."""


@dataclass
class EnvConfig:
    group_name: str = "EnvGroup"
    """Worker group name."""
    train: EnvSplitConfig = field(default_factory=EnvSplitConfig)
    """Envs used to collect training rollouts."""
    eval: EnvSplitConfig = field(
        default_factory=lambda: EnvSplitConfig(auto_reset=False, seed=10_000, use_fixed_reset_state_ids=True)
    )
    """Envs used for evaluation (one episode per sub-env, deterministic actions)."""

