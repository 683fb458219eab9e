"""What a MetaWorld camera frame costs on this machine, and where: one chunk step of MetaWorldVectorEnv from the state
(no rendering), from camera frames with MuJoCo's shadows (RLinf's view), and without them
(`init_params.render_shadows: false`), side by side.

    python -m benchmarks.metaworld_render                                   # about a minute on 2 cores
    python -m benchmarks.metaworld_render --out benchmarks/metaworld_render.json

Each row: the median over `--reps` chunk steps of `--envs` sub-envs (after 3 warm-up steps), per sub-env step. The env
keeps one renderer per sub-env for its whole life (gymnasium's MujocoRenderer makes it on the first frame), so the
figure is the render itself: `first_frame_s` is the one-time cost of making the GL context and the renderer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def step_cost(obs_mode: str, shadows: bool, side: int, num_envs: int, reps: int) -> dict:
    """Seconds of one chunk step per sub-env (median over `reps`), and of the first observation (with the renderers)."""
    import torch

    from rlinf_mini.config import EnvSplitConfig, InitParams
    from rlinf_mini.envs import make_env

    params = InitParams(obs_mode=obs_mode, camera_heights=side, camera_widths=side, render_shadows=shadows)
    cfg = EnvSplitConfig(env_type="metaworld", task_suite_name="reach-v3", max_episode_steps=150, auto_reset=True,
                         use_dense_reward=True, use_rel_reward=False, seed=0, init_params=params)
    env = make_env(cfg, torch.arange(num_envs), 1)
    try:
        t = time.perf_counter()
        env.reset()
        first = time.perf_counter() - t
        gen = torch.Generator().manual_seed(0)
        times = []
        for i in range(reps + 3):
            actions = torch.rand(num_envs, 1, 4, generator=gen) * 2 - 1
            t = time.perf_counter()
            env.chunk_step(actions)
            if i >= 3:
                times.append((time.perf_counter() - t) / num_envs)
    finally:
        env.close()
    return {"obs_mode": obs_mode, "render_shadows": shadows, "side": side, "per_env_step_s": statistics.median(times),
            "first_frame_s": first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_render", description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=40, help="frame side in pixels (the ported VLA configs': 40)")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    load_before = os.getloadavg()[0]
    rows = [step_cost("state", True, args.side, args.envs, args.reps),
            step_cost("rgb", True, args.side, args.envs, args.reps),
            step_cost("rgb", False, args.side, args.envs, args.reps)]
    state = rows[0]["per_env_step_s"]
    print(f"MetaWorld reach-v3, {args.envs} sub-envs, {args.side}x{args.side} frames, MUJOCO_GL="
          f"{os.environ['MUJOCO_GL']}, median of {args.reps} chunk steps (load {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f})")
    print(f"{'observation':28} {'ms per sub-env step':>20} {'vs state':>9}")
    for r in rows:
        name = "state" if r["obs_mode"] == "state" else f"rgb, shadows {'on' if r['render_shadows'] else 'off'}"
        print(f"{name:28} {r['per_env_step_s'] * 1e3:>20.1f} {r['per_env_step_s'] / state:>9.1f}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                  "cpus": len(os.sched_getaffinity(0)), "mujoco_gl": os.environ["MUJOCO_GL"],
                  "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)], "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
