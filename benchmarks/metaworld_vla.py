"""The tiny VLA on MetaWorld reach-v3 from pixels (configs/metaworld_reach_vla.yaml): held-out success at each
evaluation, training success per step, the env steps and the wall time of one run.

    python -m benchmarks.metaworld_vla                                   # the config's budget, one seed
    python -m benchmarks.metaworld_vla --max-epochs 48 --out /tmp/vla_48.json      # a longer budget
    python -m benchmarks.metaworld_vla --summarize DIR                   # the row of a finished run's log_path

A run is `python -m rlinf_mini.train --config configs/metaworld_reach_vla.yaml` with TensorBoard, progress bar and
eval videos off, in a temporary folder (its model folder too). docs/metaworld.md ("The tiny VLA from pixels") reads
benchmarks/metaworld_vla.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlinf_mini.config import load_config

CONFIG = "configs/metaworld_reach_vla.yaml"


def argv_of(log_path: str, max_epochs: int | None) -> list[str]:
    budget = [f"runner.max_epochs={max_epochs}"] if max_epochs is not None else []
    return ["python", "-m", "rlinf_mini.train", "--config", CONFIG, f"runner.logger.log_path={log_path}",
            f"actor.model.model_path={log_path}/tiny_vla", "runner.logger.logger_backends=[]",
            "runner.progress_bar=false", "env.eval.video_cfg.save_video=false", *budget]


def budget_of(max_epochs: int | None) -> dict:
    """What the run costs in env steps: steps x sub-envs x env steps per rollout, and the eval episodes."""
    cfg = load_config(["--config", CONFIG])
    steps = max_epochs if max_epochs is not None else cfg.runner.max_epochs
    per_step = cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch * cfg.env.train.max_steps_per_rollout_epoch
    return {"steps": steps, "env_steps_per_step": per_step, "train_env_steps": steps * per_step,
            "eval_episodes": cfg.env.eval.total_num_envs,
            "image": [cfg.env.train.init_params.camera_heights, cfg.env.train.init_params.camera_widths],
            "num_action_chunks": cfg.actor.model.num_action_chunks}


def summarize(folder: Path) -> dict:
    """The curve from a run folder (`<log_path>/<experiment_name>/metrics.jsonl`)."""
    rows = [json.loads(line) for line in next(folder.glob("*/metrics.jsonl")).read_text().splitlines()]
    evals = [[r["step"], round(r["eval/success_once"], 3), round(r["eval/return"], 1)]
             for r in rows if "eval/success_once" in r]
    train = [[r["step"], round(r["env/success_once"], 3), round(r["env/return"], 1)] for r in rows
             if "env/success_once" in r and not math.isnan(r["env/success_once"])]
    return {"evals": evals, "train": train, "train_time_s": round(sum(r.get("time/step", 0.0) for r in rows), 1),
            "eval_time_s": round(sum(r.get("time/eval", 0.0) for r in rows), 1)}


def run(max_epochs: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="metaworld_vla_") as tmp:
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        code = subprocess.run([sys.executable, *argv_of(f"{tmp}/results", max_epochs)[1:]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MUJOCO_GL": "egl"}, timeout=3600).returncode
        row = summarize(Path(tmp) / "results")
    return {**row, "exit_code": code, "wall_s": round(time.monotonic() - start, 1),
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_vla", description=__doc__.splitlines()[0])
    parser.add_argument("--max-epochs", type=int, default=None, help="training steps (default: the config's)")
    parser.add_argument("--summarize", metavar="DIR", help="the row of a finished run (its runner.logger.log_path) "
                        "instead of running; wall time and load are then not known")
    parser.add_argument("--out", default="benchmarks/metaworld_vla.json", help="write the results as JSON here")
    args = parser.parse_args(argv)
    row = summarize(Path(args.summarize)) if args.summarize else run(args.max_epochs)
    budget = budget_of(args.max_epochs)
    print(f"{budget['train_env_steps']} env steps in {budget['steps']} steps; evals (step, success, return) "
          f"{row['evals']}; wall {row.get('wall_s')} s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(args.out).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
        "cpus": len(os.sched_getaffinity(0)), "config": CONFIG,
        "command": " ".join(argv_of("$TMP/results", args.max_epochs)), "budget": budget, **row}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
