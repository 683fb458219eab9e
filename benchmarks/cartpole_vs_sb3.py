"""CartPole-v1: env steps and seconds until the mean return of the last 20 episodes reaches 475, ours vs SB3's PPO.

    python -m benchmarks.cartpole_vs_sb3                                  # full run (about 2 minutes on 2 cores)
    python -m benchmarks.cartpole_vs_sb3 --quick                          # smoke run (< 60 s): small step caps
    python -m benchmarks.cartpole_vs_sb3 --out results/bench_cartpole.json --seed 1

Ours: `rlinf_mini.train.main` with configs/cartpole.yaml, in this process (its workers are spawned processes), logging
into a temporary folder; the metric is `env/return_last20` in metrics.jsonl, and `env/steps` counts env steps. A
thread stamps each metrics line as it appears, so "wall s" counts from the call to `main` (worker start-up included)
to the line that first reaches the target.

Reference: stable-baselines3 `PPO("MlpPolicy", "CartPole-v1")` with every hyperparameter at its default, on the
same machine, after ours (never at the same time). A callback keeps the last 20 episode returns from the Monitor
infos (SB3's own `ep_info_buffer` keeps 100) and stops training at the target. Its wall clock starts before the PPO
constructor, so env and model construction are included on both sides. The mean is taken over the episodes seen so
far when fewer than 20 have ended, as ours does.

If stable-baselines3 is not installed, its row says so and ours still runs (`pip install stable-baselines3`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

TARGET = 475.0
WINDOW = 20

# --------------------------------------------------------------------------------------------------------------------
# Ours


def _stamp_lines(path: Path, t0: float, stamps: list[tuple[float, dict]], stop: threading.Event) -> None:
    """Poll metrics.jsonl and record (seconds since t0, row) for each complete line when it first appears."""
    seen = 0
    while True:
        done = stop.is_set()  # read once more after the stop signal, so no line is missed
        if path.is_file():
            complete = path.read_text().split("\n")[:-1]  # a line without its newline is still being written
            now = time.monotonic() - t0
            for line in complete[seen:]:
                stamps.append((now, json.loads(line)))
            seen = len(complete)
        if done:
            return
        time.sleep(0.02)


def run_ours(config: str, seed: int, max_epochs: int | None) -> dict:
    from rlinf_mini.train import main

    with tempfile.TemporaryDirectory(prefix="bench_cartpole_") as log_path:
        argv = ["--config", config, "--runner.logger.log_path", log_path, "--runner.logger.experiment_name", "run",
                "--runner.no-progress-bar", "--runner.log_interval", "10",
                "--actor.seed", str(seed), "--env.train.seed", str(seed)]
        if max_epochs is not None:  # a smoke run: fewer steps and no evaluation
            argv += ["--runner.max_epochs", str(max_epochs), "--runner.val_check_interval", "-1"]
        stamps: list[tuple[float, dict]] = []
        stop = threading.Event()
        t0 = time.monotonic()
        metrics_file = Path(log_path) / "run" / "metrics.jsonl"
        watcher = threading.Thread(target=_stamp_lines, args=(metrics_file, t0, stamps, stop), daemon=True)
        watcher.start()
        rc = main(argv)
        total_s = time.monotonic() - t0
        stop.set()
        watcher.join()
    if rc != 0:
        raise RuntimeError(f"rlinf_mini.train.main({' '.join(argv)}) returned {rc}")
    rows = [(t, r) for t, r in stamps if "env/return_last20" in r]  # training steps (the step-0 eval line has none)
    hit = next(((t, r) for t, r in rows if r["env/return_last20"] >= TARGET), None)
    first_t = rows[0][0] - rows[0][1]["time/step"] if rows else float("nan")  # when the first step started
    return {
        "env_steps_to_target": hit[1]["env/steps"] if hit else None,
        "wall_s_to_target": hit[0] if hit else None,
        "train_s_to_target": (sum(r["time/step"] + r.get("time/eval", 0.0) for t, r in rows if t <= hit[0])
                              if hit else None),  # the sum of the runner's step timers: no start-up
        "startup_s": first_t,
        "final_return_last20": rows[-1][1]["env/return_last20"] if rows else None,
        "env_steps_total": rows[-1][1]["env/steps"] if rows else 0,
        "wall_s_total": total_s,
        "curve": [(r["env/steps"], round(r["env/return_last20"], 1)) for _, r in rows],
    }


# --------------------------------------------------------------------------------------------------------------------
# stable-baselines3


def run_sb3(seed: int, max_env_steps: int) -> dict:
    try:
        import stable_baselines3
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        return {"skipped": "stable-baselines3 is not installed (pip install stable-baselines3)"}

    class StopAtTarget(BaseCallback):
        """Mean of the last WINDOW episode returns (from the Monitor wrapper's info['episode']); stop at TARGET."""

        def __init__(self, t0: float):
            super().__init__()
            self.t0 = t0
            self.returns: collections.deque = collections.deque(maxlen=WINDOW)
            self.hit: tuple[int, float] | None = None
            self.curve: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if self.returns and self.num_timesteps % 1024 == 0:
                self.curve.append((self.num_timesteps, round(self.last20(), 1)))
            if self.returns and self.last20() >= TARGET:
                self.hit = (self.num_timesteps, time.monotonic() - self.t0)
                return False  # stops model.learn()
            return True

        def last20(self) -> float:
            return sum(self.returns) / len(self.returns)

    t0 = time.monotonic()
    model = PPO("MlpPolicy", "CartPole-v1", seed=seed, verbose=0)  # every hyperparameter at SB3's default
    callback = StopAtTarget(t0)
    model.learn(total_timesteps=max_env_steps, callback=callback)
    total_s = time.monotonic() - t0
    return {
        "env_steps_to_target": callback.hit[0] if callback.hit else None,
        "wall_s_to_target": callback.hit[1] if callback.hit else None,
        "final_return_last20": callback.last20() if callback.returns else None,
        "env_steps_total": model.num_timesteps,
        "wall_s_total": total_s,
        "version": stable_baselines3.__version__,
        "curve": callback.curve,
    }


# --------------------------------------------------------------------------------------------------------------------
# Table and entry


def _fmt(x, spec: str) -> str:
    return "not reached" if x is None else format(x, spec)


def print_table(results: dict[str, dict]) -> None:
    print(f"\nCartPole-v1, target: mean return of the last {WINDOW} episodes >= {TARGET:g}")
    print(f"{'':6} {'env steps to target':>20} {'wall s to target':>17} {'final last-20 return':>21}")
    for name, r in results.items():
        if "skipped" in r:
            print(f"{name:6} skipped: {r['skipped']}")
            continue
        print(f"{name:6} {_fmt(r['env_steps_to_target'], ',.0f'):>20} {_fmt(r['wall_s_to_target'], '.1f'):>17} "
              f"{_fmt(r['final_return_last20'], '.1f'):>21}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cartpole_vs_sb3", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 training steps of ours, 4,096 SB3 steps")
    parser.add_argument("--config", default="configs/cartpole.yaml", help="our config file")
    parser.add_argument("--seed", type=int, default=1, help="--actor.seed and --env.train.seed for ours; SB3's seed")
    parser.add_argument("--sb3-max-steps", type=int, default=200_000, help="SB3 step cap (full run)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    ours = run_ours(args.config, args.seed, max_epochs=5 if args.quick else None)
    sb3 = run_sb3(args.seed, max_env_steps=4_096 if args.quick else args.sb3_max_steps)
    results = {"ours": ours, "sb3": sb3}
    print_table(results)
    if args.out:
        import torch

        report = {"target": TARGET, "window": WINDOW, "quick": args.quick, "seed": args.seed, "config": args.config,
                  "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                              "torch": torch.__version__},
                  "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the guard matters: our workers are spawned processes that re-import the main module
    sys.exit(main())
