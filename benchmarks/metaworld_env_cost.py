"""MetaWorld's own costs that rlinf_mini/envs/metaworld.py cuts, each beside the plain way in one run.

    python -m benchmarks.metaworld_env_cost --out benchmarks/metaworld_env_cost.json

- Making sub-envs: `gymnasium.make("Meta-World/MT1", env_name=task, seed=0)` per sub-env (which makes the task's 50
  reset layouts each time) against the env's `_make_one` (the layouts once per process), for a rank's 26 eval sub-envs.
- A step: MetaWorld's `touching_object` (a Python loop over every MuJoCo contact) against the env's (the contact
  arrays), on push-v3 and pick-place-v3, the same random actions, beside the floor of MuJoCo's physics alone
  (`mj_step` frame_skip times); the rewards of both ways must be equal or the run stops.
Repetitions alternate the two ways; each figure is the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np


def make_s(n: int, ours: bool) -> float:
    import gymnasium

    from rlinf_mini.config import EnvSplitConfig
    from rlinf_mini.envs import metaworld as mw

    cfg = EnvSplitConfig(env_type="metaworld", task_suite_name="push-v3", seed=0)
    mw._mt1.cache_clear()  # a fresh process's start: the layouts not made yet
    start = time.perf_counter()
    envs = [mw._make_one(cfg, "push-v3", "env.eval") if ours else
            gymnasium.make("Meta-World/MT1", env_name="push-v3", seed=0, disable_env_checker=True) for _ in range(n)]
    seconds = time.perf_counter() - start
    for e in envs:
        e.close()
    return seconds


def one_env(task: str):
    """One sub-env of `task` as rlinf_mini's env makes it (150-step episodes)."""
    from rlinf_mini.config import EnvSplitConfig
    from rlinf_mini.envs import metaworld as mw

    return mw._make_one(EnvSplitConfig(env_type="metaworld", task_suite_name=task, seed=0, max_episode_steps=150),
                        task, "env.train")


def step_ms(task: str, ours: bool, steps: int) -> tuple[float, list[float]]:
    """ms per env.step over `steps` random actions (a reset every 150), and the rewards."""
    env = one_env(task)
    if not ours:  # MetaWorld's own method back
        env.unwrapped.touching_object = types.MethodType(type(env.unwrapped).touching_object, env.unwrapped)
    env.unwrapped.seed(0)
    env.reset()
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, 4)).astype(np.float32)
    rewards = []
    start = time.perf_counter()
    for i in range(steps):
        _, r, *_ = env.step(actions[i])
        rewards.append(float(r))
        if (i + 1) % 150 == 0:
            env.reset()
    seconds = time.perf_counter() - start
    env.close()
    return seconds / steps * 1e3, rewards


def physics_ms(task: str, steps: int) -> float:
    """The floor: MuJoCo's mj_step, frame_skip times per env step, on the task's model."""
    import mujoco

    env = one_env(task)
    env.reset()
    sawyer = env.unwrapped
    start = time.perf_counter()
    for _ in range(steps * sawyer.frame_skip):
        mujoco.mj_step(sawyer.model, sawyer.data)
    seconds = time.perf_counter() - start
    env.close()
    return seconds / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--envs", type=int, default=26, help="sub-envs made (a rank's share of 52 eval sub-envs)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    report: dict = {"make": {"ours": [], "gymnasium_make": []}, "step": {}}
    for _ in range(args.reps):
        report["make"]["ours"].append(make_s(args.envs, True))
        report["make"]["gymnasium_make"].append(make_s(args.envs, False))
    make = {k: statistics.median(v) for k, v in report["make"].items()}
    print(f"making {args.envs} push-v3 sub-envs: ours {make['ours']:.1f} s, gymnasium.make each "
          f"{make['gymnasium_make']:.1f} s ({make['gymnasium_make'] / make['ours']:.1f}x)")
    print(f"{'task':16} {'ours ms/step':>12} {'MetaWorld ms/step':>18} {'physics ms/step':>16} {'speedup':>8}")
    for task in ("push-v3", "pick-place-v3"):
        ours, theirs = [], []
        for _ in range(args.reps):
            ms, r_ours = step_ms(task, True, args.steps)
            ours.append(ms)
            ms, r_theirs = step_ms(task, False, args.steps)
            theirs.append(ms)
            if r_ours != r_theirs:
                raise SystemExit(f"{task}: the rewards differ between the two touching_object")
        floor = physics_ms(task, args.steps)
        row = {"ours_ms": statistics.median(ours), "metaworld_ms": statistics.median(theirs), "physics_ms": floor,
               "reps": {"ours": ours, "metaworld": theirs}}
        report["step"][task] = row
        print(f"{task:16} {row['ours_ms']:>12.2f} {row['metaworld_ms']:>18.2f} {floor:>16.2f} "
              f"{row['metaworld_ms'] / row['ours_ms']:>7.2f}x")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report |= {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                   "cpus": len(os.sched_getaffinity(0)),
                   "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)], "make_median_s": make}
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
