"""The default reasoning run (configs/math.yaml) from a fresh start: the data and the warm-started tiny GPT-2 are made
first, then GRPO trains; held-out greedy exact match before and after, the wall time, the learning curve; and the
control: the same run with the rewards permuted within each batch.

    python -m benchmarks.reasoning_default_run                          # both runs (~2 x 2-5 min on 2 cores)
    python -m benchmarks.reasoning_default_run --no-control --out results/bench_reasoning.json

Each run is `python -m rlinf_mini.train --config configs/math.yaml` in a subprocess, into a new temporary folder that
holds its data and model folder too, so it starts like a fresh clone; wall seconds from start to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = "configs/math.yaml"


def train(folder: Path, *extra: str) -> dict:
    """One run from nothing into `folder`; returns wall time and the eval curve."""
    argv = [sys.executable, "-m", "rlinf_mini.train", "--config", CONFIG, "--runner.logger.log-path", str(folder),
            "--actor.model.model-path", str(folder / "tiny_lm_math"),
            "--data.train-data-paths", str(folder / "data/arithmetic_train.jsonl"),
            "--data.val-data-paths", str(folder / "data/arithmetic_val.jsonl"), *extra]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"training failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(ln) for ln in (folder / "math/metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], round(r["eval/accuracy"], 4)) for r in rows if "eval/accuracy" in r]
    return {"wall_s": round(wall, 1), "eval_accuracy_curve": curve, "start": curve[0][1], "final": curve[-1][1],
            "best": max(a for _, a in curve), "learning_curve_png": str(folder / "math/learning_curve.png")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reasoning_default_run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument("--no-control", action="store_true", help="skip the permuted-reward control run")
    parser.add_argument("--keep", default="", help="copy the run's learning_curve.png here")
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as f:
        report: dict = {"config": CONFIG, "loadavg_before": f.read().split()[:3]}
    tmp = Path(tempfile.mkdtemp(prefix="bench_reasoning_"))
    try:
        report["run"] = train(tmp / "run")
        if args.keep:
            Path(args.keep).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(report["run"]["learning_curve_png"], args.keep)
        if not args.no_control:
            report["control_permuted_rewards"] = train(tmp / "control", "--reward.permute-rewards")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open("/proc/loadavg") as f:
        report["loadavg_after"] = f.read().split()[:3]
    for name in ("run", "control_permuted_rewards"):
        if name in report:
            r = report[name]
            print(f"{name:<26} eval/accuracy {r['start']:.3f} -> {r['final']:.3f} (best {r['best']:.3f}), "
                  f"wall {r['wall_s']} s")
    print(f"load average before / after: {report['loadavg_before']} / {report['loadavg_after']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
