"""Why push-v3 has a trap for PPO from scratch: the shaped reward of scripted behaviours, and what the running
observation normaliser does to the puck's dims when the puck is first pushed.

    python -m benchmarks.metaworld_push_probe                                  # under a minute on 2 cores
    python -m benchmarks.metaworld_push_probe --out benchmarks/metaworld_push_probe.json

Part 1, the reward: MetaWorld's scripted push policy (`SawyerPushV3Policy`: above the puck, down onto it, gripper
effort 0.6, then to the goal) against the same with the gripper effort fixed, and a policy that goes down to the puck
and stays there ("hover"), through rlinf_mini's env (configs/metaworld_push.yaml's env.train: 150-step episodes,
success does not end them), the return and success of `--episodes` episodes each.
Part 2, the normaliser: the running mean and variance (utils/running_stats.py, as `actor.model.normalize_obs` keeps
them) of the observations of `--episodes` episodes of random actions (std 0.61, the MLP's initial exploration), then
the largest |normalised value| per observation dim over the scripted policy's episodes: the dims of the puck that the
random actions never moved (its height, its quaternion) jump to the clip (10) the first time the puck is pushed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def episode(env, policy, grip: float | None, hover: bool, rng: np.random.Generator | None) -> tuple[list, float, bool]:
    """One episode of sub-env 0: (observations [151, 39], return, success at any step)."""
    import torch

    obs = env.reset()[0].numpy()
    seen, ret, success = [obs], 0.0, False
    for _ in range(env.cfg.max_episode_steps):
        if rng is not None:  # random actions, the MLP's initial std
            action = np.clip(rng.normal(0.0, np.exp(-0.5), 4), -1, 1)
        else:
            action = policy.get_action(obs)
            if hover:  # go down onto the puck (as the scripted policy does) and stay there
                hand, puck = obs[:3], obs[4:7]
                above = np.linalg.norm(hand[:2] - puck[:2]) > 0.02
                action[:3] = np.clip(10 * (puck + [0, 0, 0.2 if above else 0.0] - hand), -1, 1)
            if grip is not None:
                action[3] = grip
        obs_t, reward, term, trunc, stats = env.chunk_step(torch.tensor(action, dtype=torch.float32).view(1, 1, 4))
        ret += float(reward[0, 0])
        if len(stats["success_once"]):
            success = bool(stats["success_once"][0])
        obs = obs_t[0].numpy()
        seen.append(obs)
        if term[0, 0] or trunc[0, 0]:
            break
    return seen, ret, success


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_push_probe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    import torch
    from metaworld.policies.sawyer_push_v3_policy import SawyerPushV3Policy

    from rlinf_mini.config import load_config
    from rlinf_mini.envs import make_env

    cfg = load_config(["--config", "configs/metaworld_push.yaml"]).env.train
    cfg.normalize_reward = False  # raw shaped rewards (the env worker, not the env, normalises them anyway)
    policy = SawyerPushV3Policy()
    variants = [("scripted (effort 0.6 at the puck)", None, False), ("scripted, effort -1 (open)", -1.0, False),
                ("scripted, effort 0", 0.0, False), ("scripted, effort +1 (closed)", 1.0, False),
                ("hover at the puck, effort 0.6", None, True), ("hover at the puck, effort +1", 1.0, True)]
    rows = []
    env = make_env(cfg, torch.arange(1), 1)
    try:
        for name, grip, hover in variants:
            runs = [episode(env, policy, grip, hover, None) for _ in range(args.episodes)]
            rows.append({"behaviour": name, "returns": [round(r[1], 1) for r in runs],
                         "success": [r[2] for r in runs]})
        rng = np.random.default_rng(0)
        random_obs = np.concatenate([episode(env, policy, None, False, rng)[0] for _ in range(args.episodes)])
        scripted_obs = np.concatenate([episode(env, policy, None, False, None)[0] for _ in range(args.episodes)])
    finally:
        env.close()
    mean, var = random_obs.mean(0), random_obs.var(0)
    z = np.clip((scripted_obs - mean) / np.sqrt(var + 1e-8), -10, 10)
    max_z = np.abs(z).max(0)
    names = {0: "hand x", 1: "hand y", 2: "hand z", 3: "gripper", 4: "puck x", 5: "puck y", 6: "puck z",
             7: "puck quat 1", 8: "puck quat 2", 9: "puck quat 3", 10: "puck quat 4"}
    print(f"push-v3, {args.episodes} episodes of 150 steps each (returns are MetaWorld's raw shaped reward)")
    print(f"{'behaviour':36} {'mean return':>12} {'success':>8}")
    for r in rows:
        print(f"{r['behaviour']:36} {np.mean(r['returns']):>12.0f} {np.mean(r['success']):>8.2f}")
    print("\nlargest |normalised obs| on the scripted episodes, statistics from random actions (clip 10):")
    for d, name in names.items():
        print(f"  dim {d:2} {name:12} std under random actions {np.sqrt(var[d]):.4f}  max |z| {max_z[d]:.1f}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                  "episodes": args.episodes, "rewards": rows,
                  "normaliser": {names[d]: {"random_std": float(np.sqrt(var[d])), "max_abs_z": float(max_z[d])}
                                 for d in names},
                  "load_average": [round(x, 1) for x in os.getloadavg()]}
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
