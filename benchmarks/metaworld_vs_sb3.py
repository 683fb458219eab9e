"""MetaWorld: held-out eval success against wall time and env steps, ours vs SB3's PPO, on the same task and budget.

    python -m benchmarks.metaworld_vs_sb3 --max-epochs 100 --val-check-interval 10   # reach-v3, 3 seeds, 205k steps
    python -m benchmarks.metaworld_vs_sb3 --config configs/metaworld_push.yaml --seeds 0 1 2 --no-sb3
    python -m benchmarks.metaworld_vs_sb3 --config configs/metaworld_push.yaml --task drawer-close-v3 --no-sb3
    python -m benchmarks.metaworld_vs_sb3 --quick                            # smoke run: a few steps of each

`--task` runs the config's recipe with only the task name changed (env.train and env.eval task_suite_name).

Ours: `rlinf_mini.train.main` with the config (its seeds replaced per run), in this process (its workers are spawned
processes). A thread stamps each metrics.jsonl line as it appears, so "wall s" counts from the call to `main` (worker
start-up and every evaluation included) to the eval line that first reaches the target.

SB3: `PPO("MlpPolicy")` with a 256x256 net for the policy and the value (the size of ours) and VecNormalize on
observations and returns (what SB3 users run on MetaWorld: without it PPO stays near 0.2 on reach-v3), every other
hyperparameter at SB3's default, 8 sub-envs in a DummyVecEnv, after ours (never at the same time). Its wall clock
starts before the env construction. Both sides see the same task, the same episode length (the config's
env.train.max_episode_steps), the same env-step budget (the config's runner.max_epochs x env steps per epoch) and the
same evaluation: every `val_check_interval` epochs' worth of env steps, one deterministic episode on each of the
config's env.eval.total_num_envs held-out sub-envs (MT1's layouts for env.eval.seed, sub-env e seeded seed + e, as
ours does), success = MetaWorld's info["success"] at any step of the episode; SB3's evaluation normalises
observations with the training statistics, frozen. Evaluation time counts on both sides.

If stable-baselines3 is not installed, its rows say so and ours still runs (`pip install stable-baselines3`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.cartpole_vs_sb3 import _stamp_lines

TARGET = 0.9

# --------------------------------------------------------------------------------------------------------------------
# Ours


def run_ours(config: str, seed: int, overrides: list[str]) -> dict:
    from rlinf_mini.train import main

    with tempfile.TemporaryDirectory(prefix="bench_metaworld_") as log_path:
        argv = ["--config", config, "--runner.logger.log_path", log_path, "--runner.logger.experiment_name", "run",
                "--runner.no-progress-bar", "--actor.seed", str(1234 + seed), "--env.train.seed", str(seed), *overrides]
        stamps: list[tuple[float, dict]] = []
        stop = threading.Event()
        t0 = time.monotonic()
        watcher = threading.Thread(target=_stamp_lines, args=(Path(log_path) / "run" / "metrics.jsonl", t0, stamps,
                                                               stop), daemon=True)
        watcher.start()
        rc = main(argv)
        total_s = time.monotonic() - t0
        stop.set()
        watcher.join()
    if rc != 0:
        raise RuntimeError(f"rlinf_mini.train.main({' '.join(argv)}) returned {rc}")
    curve = [(int(r.get("env/steps", 0)), round(t, 1), r["eval/success_once"]) for t, r in stamps
             if "eval/success_once" in r]
    evals = [r for _, r in stamps if "eval/success_once" in r]
    last = evals[-1] if evals else {}
    per_task = {k.split("/")[-1]: v for k, v in last.items() if k.startswith("eval/success_once/")}
    return _summary(curve, total_s) | ({"final_success_per_task": per_task} if per_task else {})


def _summary(curve: list[tuple[int, float, float]], total_s: float) -> dict:
    """curve: (env steps, wall s, eval success) per evaluation -> the figures of the table."""
    hit = next((c for c in curve if c[2] >= TARGET), None)
    return {"env_steps_to_target": hit[0] if hit else None, "wall_s_to_target": hit[1] if hit else None,
            "final_success": curve[-1][2] if curve else None,
            "best_success": max(c[2] for c in curve) if curve else None,
            "env_steps_total": curve[-1][0] if curve else 0, "wall_s_total": round(total_s, 1), "curve": curve}


# --------------------------------------------------------------------------------------------------------------------
# stable-baselines3


def run_sb3(task: str, seed: int, episode_steps: int, budget: int, eval_every: int, eval_envs: int,
            eval_seed: int) -> dict:
    try:
        import stable_baselines3
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize
    except ImportError:
        return {"skipped": "stable-baselines3 is not installed (pip install stable-baselines3)"}
    import gymnasium
    import metaworld  # noqa: F401  (registers Meta-World/MT1)
    import numpy as np

    def make(layout_seed: int, rng_seed: int):
        def thunk():
            env = gymnasium.make("Meta-World/MT1", env_name=task, seed=layout_seed, max_episode_steps=episode_steps,
                                 disable_env_checker=True)
            env.unwrapped.seed(rng_seed)
            return env
        return thunk

    t0 = time.monotonic()
    train_env = VecNormalize(VecMonitor(DummyVecEnv([make(seed, seed + i) for i in range(8)])), gamma=0.99)
    eval_env = DummyVecEnv([make(eval_seed, eval_seed + e) for e in range(eval_envs)])

    def evaluate(model) -> float:
        """One deterministic episode per eval sub-env; success at any step. DummyVecEnv auto-resets a finished
        sub-env, so each sub-env's first episode is the one counted (all end together at the time limit)."""
        obs = eval_env.reset()
        success = np.zeros(eval_envs, dtype=bool)
        for _ in range(episode_steps):
            action, _ = model.predict(train_env.normalize_obs(obs), deterministic=True)
            obs, _, _, infos = eval_env.step(action)
            success |= np.array([bool(info.get("success", 0.0)) for info in infos])
        return float(success.mean())

    curve: list[tuple[int, float, float]] = []

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every < train_env.num_envs:
                curve.append((self.num_timesteps, round(time.monotonic() - t0, 1), evaluate(self.model)))
            return True

    model = PPO("MlpPolicy", train_env, seed=seed, verbose=0,
                policy_kwargs={"net_arch": {"pi": [256, 256], "vf": [256, 256]}})
    curve.append((0, round(time.monotonic() - t0, 1), evaluate(model)))
    model.learn(total_timesteps=budget, callback=Evaluate())
    if curve[-1][0] < model.num_timesteps:
        curve.append((model.num_timesteps, round(time.monotonic() - t0, 1), evaluate(model)))
    out = _summary(curve, time.monotonic() - t0)
    out["version"] = stable_baselines3.__version__
    return out


# --------------------------------------------------------------------------------------------------------------------
# Table and entry


def _fmt(x, spec: str) -> str:
    return "not reached" if x is None else format(x, spec)


def _spread(values: list) -> str:
    vals = [v for v in values if v is not None]
    if len(vals) < len(values) or not vals:
        return f"{len(vals)}/{len(values)} reached"
    return f"{statistics.mean(vals):.3g} ± {statistics.pstdev(vals):.2g}" if len(vals) > 1 else f"{vals[0]:.3g}"


def print_table(task: str, runs: dict[str, list[dict]]) -> None:
    print(f"\nMetaWorld {task}: held-out eval success >= {TARGET:g}")
    print(f"{'':6} {'seed':>4} {'env steps to target':>20} {'wall s to target':>17} {'final success':>14} "
          f"{'best':>6} {'wall s total':>13}")
    for name, results in runs.items():
        for r in results:
            if "skipped" in r:
                print(f"{name:6} skipped: {r['skipped']}")
                continue
            print(f"{name:6} {r['seed']:>4} {_fmt(r['env_steps_to_target'], ',.0f'):>20} "
                  f"{_fmt(r['wall_s_to_target'], '.1f'):>17} {_fmt(r['final_success'], '.2f'):>14} "
                  f"{_fmt(r['best_success'], '.2f'):>6} {r['wall_s_total']:>13.1f}")
            for task, value in r.get("final_success_per_task", {}).items():  # a multi-task suite (MT10)
                print(f"{'':6} {'':>4}   {task:<26} final success {value:.2f}")
        done = [r for r in results if "skipped" not in r]
        if len(done) > 1:
            print(f"{name:6} {'all':>4} {_spread([r['env_steps_to_target'] for r in done]):>20} "
                  f"{_spread([r['wall_s_to_target'] for r in done]):>17} "
                  f"{_spread([r['final_success'] for r in done]):>14}")


def _ratio(runs: dict[str, list[dict]]) -> float | None:
    """Mean over seeds of ours / SB3 wall time to the target (None unless both reached it on every seed)."""
    ours, sb3 = runs.get("ours", []), runs.get("sb3", [])
    pairs = [(a["wall_s_to_target"], b.get("wall_s_to_target")) for a, b in zip(ours, sb3, strict=False)]
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    return statistics.mean(a / b for a, b in pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_vs_sb3", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/metaworld_reach.yaml", help="our config file")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="env.train.seed of each run; "
                        "actor.seed is 1234 + it; SB3's seed is it")
    parser.add_argument("--task", default=None, help="a MetaWorld task (e.g. drawer-close-v3) in place of the "
                        "config's env.train / env.eval task_suite_name: the same recipe, only the task changed")
    parser.add_argument("--no-sb3", action="store_true", help="ours only (the learning figure over seeds)")
    parser.add_argument("--max-epochs", type=int, default=None, help="the budget in PPO steps of ours (default: the "
                        "config's runner.max_epochs); SB3 gets the same number of env steps")
    parser.add_argument("--val-check-interval", type=int, default=None, help="evaluate every this many PPO steps' "
                        "worth of env steps, both sides (default: the config's runner.val_check_interval)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 steps of ours, 4,096 SB3 steps")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    from rlinf_mini.config import load_config

    task_keys = ["--env.train.task_suite_name", args.task, "--env.eval.task_suite_name", args.task] if args.task else []
    cfg = load_config(["--config", args.config, *task_keys])
    train, ev = cfg.env.train, cfg.env.eval
    epochs = 2 if args.quick else args.max_epochs or cfg.runner.max_epochs
    overrides = task_keys + ["--runner.max_epochs", str(epochs)]
    interval = 1 if args.quick else args.val_check_interval or cfg.runner.val_check_interval
    overrides += ["--runner.val_check_interval", str(interval)]
    per_epoch = train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch
    budget = epochs * per_epoch
    runs: dict[str, list[dict]] = {"ours": []}
    for seed in args.seeds:
        runs["ours"].append({"seed": seed, **run_ours(args.config, seed, overrides)})
    if not args.no_sb3:
        runs["sb3"] = [{"seed": seed, **run_sb3(train.task_suite_name, seed, train.max_episode_steps,
                                                 4_096 if args.quick else budget, interval * per_epoch,
                                                 ev.total_num_envs, ev.seed)} for seed in args.seeds]
    print_table(train.task_suite_name, runs)
    ratio = _ratio(runs)
    if not args.no_sb3:
        print(f"ours / SB3 wall time to {TARGET:g}: " + ("not measured (a side did not reach it)" if ratio is None
                                                           else f"{ratio:.2f}"))
    if args.out:
        import torch

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report = {"task": train.task_suite_name, "config": args.config, "target": TARGET, "quick": args.quick,
                  "env_step_budget": budget, "eval_every_env_steps": interval * per_epoch,
                  "eval_episodes": ev.total_num_envs, "date": time.strftime("%Y-%m-%d"), "commit": commit,
                  "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                              "torch": torch.__version__, "load_average_at_end": os.getloadavg()},
                  "ours_over_sb3_wall_to_target": ratio, "runs": runs}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the guard matters: our workers are spawned processes that re-import the main module
    sys.exit(main())
