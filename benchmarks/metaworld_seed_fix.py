"""The failing seeds of the MetaWorld recipe (push-v3 seed 1: success 0.00; reach-v3 seed 2: 0.44) under overrides
(one, or the relative reward with the observation floor), and the other seeds under the same overrides: held-out
success at each evaluation, the first step with training success, wall time, load.

    python -m benchmarks.metaworld_seed_fix                      # ~1 hour on 2 shared cores (runs one at a time)
    python -m benchmarks.metaworld_seed_fix --only push_s1_no_obs_norm --out benchmarks/metaworld_seed_fix.json
    python -m benchmarks.metaworld_seed_fix --summarize NAME=DIR ... --out ...   # rows from finished run folders

A run is `python -m rlinf_mini.train --config configs/<config>.yaml` with seed k set as benchmarks/healthy_runs.py
sets it (actor.seed 1234 + k, env.train.seed k), the case's overrides, and TensorBoard, progress bar and eval videos
off; everything it writes goes to a temporary folder. docs/metaworld.md ("Where a seed fails") reads the JSONs
(benchmarks/metaworld_seed_fix*.json).
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

CASES = {  # name: (config, seed, max_epochs, overrides)
    "push_s1_init_logstd_0": ("metaworld_push", 1, 100, ["actor.model.init_logstd=0.0"]),
    "push_s1_no_obs_norm": ("metaworld_push", 1, 100, ["actor.model.normalize_obs=false"]),
    "push_s1_no_obs_norm_full": ("metaworld_push", 1, 161, ["actor.model.normalize_obs=false",
                                                            "runner.val_check_interval=80"]),
    "reach_s2_no_obs_norm": ("metaworld_reach", 2, 41, ["actor.model.normalize_obs=false",
                                                        "runner.val_check_interval=40"]),
    "push_s1_obs_floor": ("metaworld_push", 1, 161, ["actor.model.obs_norm_min_std=0.02",
                                                     "runner.val_check_interval=80"]),
    "reach_s2_obs_floor": ("metaworld_reach", 2, 40, ["actor.model.obs_norm_min_std=0.02",
                                                      "runner.val_check_interval=40"]),
    # the seeds that pass with the config: does the override cost them anything?
    "push_s0_obs_floor": ("metaworld_push", 0, 161, ["actor.model.obs_norm_min_std=0.02",
                                                     "runner.val_check_interval=80"]),
    "push_s2_obs_floor": ("metaworld_push", 2, 161, ["actor.model.obs_norm_min_std=0.02",
                                                     "runner.val_check_interval=80"]),
    "reach_s0_no_obs_norm": ("metaworld_reach", 0, 40, ["actor.model.normalize_obs=false",
                                                        "runner.val_check_interval=40"]),
    "reach_s1_no_obs_norm": ("metaworld_reach", 1, 40, ["actor.model.normalize_obs=false",
                                                        "runner.val_check_interval=40"]),
    # more gradient steps per sample (SB3's default minibatch of 64: 320 optimizer steps per 2,048 samples against
    # the config's 80), the shaped reward as a change since the last step (RLinf's use_rel_reward: caging the puck and
    # staying there then earns nothing), and that with the observation floor
    "reach_s2_gbs64": ("metaworld_reach", 2, 40, ["actor.global_batch_size=64", "actor.micro_batch_size=32",
                                                  "runner.val_check_interval=40"]),
    "push_s1_gbs64": ("metaworld_push", 1, 161, ["actor.global_batch_size=64", "actor.micro_batch_size=32",
                                                 "runner.val_check_interval=40"]),
    "reach_s0_rel": ("metaworld_reach", 0, 40, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "reach_s1_rel": ("metaworld_reach", 1, 40, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "reach_s2_rel": ("metaworld_reach", 2, 40, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "push_s1_rel": ("metaworld_push", 1, 161, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "push_s2_rel": ("metaworld_push", 2, 161, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "push_s0_rel": ("metaworld_push", 0, 161, ["env.train.use_rel_reward=true", "runner.val_check_interval=40"]),
    "push_s1_rel_250": ("metaworld_push", 1, 250, ["env.train.use_rel_reward=true", "runner.val_check_interval=50"]),
    "push_s1_relfloor": ("metaworld_push", 1, 161, ["env.train.use_rel_reward=true",
                                                    "actor.model.obs_norm_min_std=0.02",
                                                    "runner.val_check_interval=40"]),
}
# an entropy bonus (the exploration the caging trap lacks) on top of the observation floor
CASES |= {f"push_s{k}_floor_ent": ("metaworld_push", k, 161, ["actor.model.obs_norm_min_std=0.02",
                                                              "algorithm.entropy_bonus=0.01",
                                                              "runner.val_check_interval=40"]) for k in (1, 2)}
# twice the sub-envs per PPO step (4,096 samples, 160 optimizer steps) over half the steps: the config's env steps
# (push 81 steps, reach 21), push also for 121 (495,616 env steps, about 1.5x the config's), and with the floor
ENVS32 = ["env.train.total_num_envs=32"]
for k in range(3):
    CASES[f"push_s{k}_envs32"] = ("metaworld_push", k, 81, ENVS32 + ["runner.val_check_interval=20"])
    CASES[f"push_s{k}_envs32_121"] = ("metaworld_push", k, 121, ENVS32 + ["runner.val_check_interval=20"])
    CASES[f"reach_s{k}_envs32"] = ("metaworld_reach", k, 21, ENVS32 + ["runner.val_check_interval=10"])
CASES["push_s1_floor_envs32"] = ("metaworld_push", 1, 81, ENVS32 + ["actor.model.obs_norm_min_std=0.02",
                                                                    "runner.val_check_interval=20"])


def argv_of(name: str, log_path: str) -> list[str]:
    config, seed, epochs, overrides = CASES[name]
    if config == "metaworld_push" and not any(o.startswith("env.train.total_num_envs=") for o in overrides):
        # these cases ran when configs/metaworld_push.yaml had 16 sub-envs (it now has 32): the recipe they measured
        overrides = ["env.train.total_num_envs=16", *overrides]
    return ["python", "-m", "rlinf_mini.train", "--config", f"configs/{config}.yaml",
            f"runner.logger.log_path={log_path}", "runner.logger.logger_backends=[]", "runner.progress_bar=false",
            f"actor.seed={1234 + seed}", f"env.train.seed={seed}", f"runner.max_epochs={epochs}",
            "env.eval.video_cfg.save_video=false", *overrides]


def summarize(name: str, folder: Path) -> dict:
    """One case's row from its run folder (`<log_path>/<experiment_name>/metrics.jsonl`)."""
    rows = [json.loads(line) for line in next(folder.glob("*/metrics.jsonl")).read_text().splitlines()]
    evals = [[r["step"], round(r["eval/success_once"], 3), round(r["eval/return"], 1)]
             for r in rows if "eval/success_once" in r]
    train = [(r["step"], r["env/success_once"]) for r in rows
             if "env/success_once" in r and not math.isnan(r["env/success_once"])]
    first = next((s for s, v in train if v > 0), None)
    return {"case": name, "command": " ".join(argv_of(name, "$TMP/results")), "evals": evals,
            "first_step_with_training_success": first, "last_training_success": train[-1][1] if train else None,
            "train_time_s": round(sum(r.get("time/step", 0.0) for r in rows), 1)}


def run(name: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"seed_fix_{name}_") as tmp:
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        code = subprocess.run([sys.executable, *argv_of(name, f"{tmp}/results")[1:]], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"},
                              timeout=3600).returncode
        row = summarize(name, Path(tmp) / "results")
    return {**row, "exit_code": code, "wall_s": round(time.monotonic() - start, 1),
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metaworld_seed_fix",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="run these cases")
    parser.add_argument("--summarize", nargs="+", metavar="NAME=DIR", help="rows from finished run folders (their "
                        "runner.logger.log_path) instead of running; wall time and load are then not known")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.summarize:
        rows = [summarize(n, Path(d)) for n, d in (item.split("=", 1) for item in args.summarize)]
    else:
        rows = [run(name) for name in (args.only or CASES)]
    for r in rows:
        print(f"{r['case']:28} evals (step, success, return) {r['evals']}  first training success at step "
              f"{r['first_step_with_training_success']}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                              "commit": commit, "cpus": len(os.sched_getaffinity(0)), "rows": rows},
                                             indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
