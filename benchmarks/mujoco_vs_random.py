"""MuJoCo InvertedPendulum-v5 (configs/embodied_mujoco.yaml): the trained policy's eval return vs a uniformly random
policy's, on the same eval episodes.

    MUJOCO_GL=egl python -m benchmarks.mujoco_vs_random               # trains (a few minutes on 2 cores)
    MUJOCO_GL=egl python -m benchmarks.mujoco_vs_random --quick       # 10 steps: a smoke run
    python -m benchmarks.mujoco_vs_random --out results/bench_mujoco.json

Ours: `rlinf_mini.train.main` with the config, in this process, into a temporary folder; "trained" is the last
eval/return in metrics.jsonl (greedy actions, env.eval's seeds, one episode per eval sub-env). Random: actions drawn
uniformly from the action space on the same eval envs (GymnasiumVectorEnv with env.eval's config), averaged over the
same number of episodes. Needs `pip install -e ".[mujoco]"`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIG = "configs/embodied_mujoco.yaml"


def random_policy_return(eval_cfg, seed: int = 0) -> float:
    from rlinf_mini.envs import make_env

    env = make_env(eval_cfg, torch.arange(eval_cfg.total_num_envs), 1, key="env.eval")
    env.reset()
    space = env.envs[0].action_space
    gen = torch.Generator().manual_seed(seed)
    returns = []
    for _ in range(eval_cfg.max_steps_per_rollout_epoch):
        u = torch.rand(env.num_envs, 1, space.shape[0], generator=gen)
        actions = torch.as_tensor(space.low) + u * torch.as_tensor(space.high - space.low)
        _, _, _, _, stats = env.chunk_step(actions)
        returns += stats["return"].tolist()
    env.close()
    return sum(returns) / max(len(returns), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mujoco_vs_random", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 training steps")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import mujoco  # noqa: F401
    except ImportError:
        print("mujoco is not installed: pip install -e '.[mujoco]'", file=sys.stderr)
        return 2

    from rlinf_mini.config import load_config
    from rlinf_mini.train import main as train_main

    tmp = Path(tempfile.mkdtemp(prefix="bench_mujoco_"))
    extra = ["--runner.max-epochs", "10", "--runner.val-check-interval", "5"] if args.quick else []
    start = time.monotonic()
    rc = train_main(["--config", CONFIG, "--runner.logger.log-path", str(tmp), "--runner.no-progress-bar", *extra])
    wall = time.monotonic() - start
    if rc != 0:
        print(f"training failed with exit code {rc}", file=sys.stderr)
        return 1
    run_dir = tmp / "embodied_mujoco"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/return"]) for r in rows if "eval/return" in r]
    cfg = load_config(["--config", CONFIG])
    report = {"config": CONFIG, "train_wall_s": round(wall, 1), "eval_return_curve": evals,
              "trained_eval_return": evals[-1][1], "untrained_eval_return": evals[0][1],
              "random_policy_return": random_policy_return(cfg.env.eval), "run_dir": str(run_dir)}
    print(f"\n{'policy':<28}{'eval return (mean/episode)':>28}")
    print(f"{'random (uniform actions)':<28}{report['random_policy_return']:>28.2f}")
    print(f"{'untrained (step 0, greedy)':<28}{report['untrained_eval_return']:>28.2f}")
    print(f"{'trained (last eval)':<28}{report['trained_eval_return']:>28.2f}")
    print(f"\ntraining wall time: {report['train_wall_s']} s; curve: "
          + " ".join(f"{s}:{v:.1f}" for s, v in evals) + f"\nvideos and learning_curve.png in {run_dir}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
