"""Soak: 1,000 training steps of a fast fake-env MLP run, watching for leaks.

    python -m benchmarks.soak                      # ~3-5 min on 2 cores; prints a table, writes soak.json
    python -m benchmarks.soak --steps 200 --out /tmp/soak.json

The run is `python -m rlinf_mini.train` in a subprocess (placement env 0 / rollout 1 / actor 0-1: 4 workers, an eval
every 100 steps, a checkpoint every 250). While it runs, this script follows metrics.jsonl and, when the logged step
passes each of the sample points, reads /proc for the driver and every worker: resident memory (VmRSS), open file
descriptors, and the bytes of the run's /dev/shm segments (rlmini_<driver pid>_*). Flat is the goal: figures at step
1,000 should match those at step 100 (allocator noise aside); growth per 100 steps is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z" and b"spawn_main" in cmd:
                out.append(int(entry.name))
    return sorted(out)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sample(driver: int, step: int) -> dict:
    procs = {"driver": driver} | {f"worker{i}": p for i, p in enumerate(children(driver))}
    shm = [p for p in Path("/dev/shm").glob(f"rlmini_{driver}*")]
    return {
        "step": step,
        "rss_mb": {name: round(rss_mb(pid), 1) for name, pid in procs.items()},
        "fds": {name: len(os.listdir(f"/proc/{pid}/fd")) for name, pid in procs.items()},
        "shm_segments": len(shm),
        "shm_mb": round(sum(p.stat().st_size for p in shm) / 2**20, 3),
        "time_s": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "soak.json"))
    args = parser.parse_args()
    points = sorted({10, 100, args.steps // 2, args.steps})

    tmp = Path(tempfile.mkdtemp(prefix="rlmini_soak_"))
    cfg = yaml.safe_load((ROOT / "configs" / "embodied_mlp.yaml").read_text())
    cfg["runner"] |= {"max_epochs": args.steps + 20, "val_check_interval": 100, "save_interval": 250,
                      "progress_bar": False, "log_interval": 100,
                      "logger": {"log_path": str(tmp), "experiment_name": "soak", "logger_backends": ["tensorboard"]}}
    cfg["env"]["train"] |= {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8}
    cfg["env"]["eval"] |= {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8}
    cfg["actor"] |= {"global_batch_size": 64, "micro_batch_size": 32}
    cfg["algorithm"]["update_epoch"] = 2
    path = tmp / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    metrics = tmp / "soak" / "metrics.jsonl"

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlinf_mini.train", "--config", str(path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    try:
        while points and proc.poll() is None:
            step = 0
            if metrics.exists():
                lines = metrics.read_text().splitlines()
                step = json.loads(lines[-1])["step"] if lines else 0
            if step >= points[0]:
                s = sample(proc.pid, step)
                s["time_s"] = round(time.monotonic() - start, 1)
                samples.append(s)
                print(f"step {step}: rss {s['rss_mb']} fds {s['fds']} shm {s['shm_segments']} segs "
                      f"{s['shm_mb']} MB", file=sys.stderr, flush=True)
                points = [p for p in points if p > step]
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    left = list(Path("/dev/shm").glob(f"rlmini_{proc.pid}*"))

    names = list(samples[0]["rss_mb"])
    print(f"\n{'step':>6} {'time s':>7} " + " ".join(f"{n + ' MB':>11}" for n in names)
          + " " + " ".join(f"{n + ' fds':>11}" for n in names) + f" {'shm segs':>8} {'shm MB':>7}")
    for s in samples:
        print(f"{s['step']:>6} {s['time_s']:>7} " + " ".join(f"{s['rss_mb'].get(n, float('nan')):>11}" for n in names)
              + " " + " ".join(f"{s['fds'].get(n, -1):>11}" for n in names)
              + f" {s['shm_segments']:>8} {s['shm_mb']:>7}")
    first = next(s for s in samples if s["step"] >= 100)
    last = samples[-1]
    growth = {n: round((last["rss_mb"][n] - first["rss_mb"][n]) / max(1, last["step"] - first["step"]) * 100, 2)
              for n in names if n in last["rss_mb"]}
    print(f"RSS growth per 100 steps between step {first['step']} and {last['step']} (MB): {growth}")
    print(f"after the run: {len(left)} /dev/shm segments left; driver exit code {proc.returncode}")
    result = {"samples": samples, "rss_growth_mb_per_100_steps": growth, "shm_left_after_exit": len(left),
              "steps": args.steps, "config": cfg}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    if proc.returncode not in (0, -15, 143):
        print(err[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
