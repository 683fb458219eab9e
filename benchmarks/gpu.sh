#!/usr/bin/env bash
# The first-GPU check, one prepared script, <= 8 minutes on one GPU (each step has its own limit and the script
# stops starting steps after 450 s). Steps: devices and /dev/shm probe; the tests marked `gpu`; a one-actor smoke run;
# the default config (tiny VLA, two actor ranks sharing the GPU -> gloo) on 1 GPU with its step time, in fp32 and
# bf16; the GPU benchmarks (weight sync by CUDA IPC and by pinned host copy / device-to-device copy, pinned vs
# pageable, the channel with CUDA tensors). Without a GPU it says so after the probe and exits 0.
#
#   bash benchmarks/gpu.sh                   # logs to $OUT if set, else results/gpu/
#
# On a GPU machine without network: `bash benchmarks/gpu_wheels.sh` where pip works (it `pip download`s the wheels
# rlinf_mini needs beyond torch into .whl/, ignored by git), copy the checkout over, and this script installs
# whatever it finds in .whl/ before it starts.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
SUMMARY="$OUT/summary.md"
export PYTHONUNBUFFERED=1 MUJOCO_GL=egl
PY=${PYTHON:-python3}
START=$(date +%s)
BUDGET=450
: >"$LOG"
printf '| step | exit | seconds |\n|---|---|---|\n' >"$SUMMARY"

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"

step() {  # step NAME LIMIT_S COMMAND...: run with a limit (cut to the budget left), log it, add a summary row
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 20)); then
    echo "== $name: skipped, the 8-minute budget is spent" | tee -a "$LOG"
    echo "| $name | skipped | 0 |" >>"$SUMMARY"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit} s)" | tee -a "$LOG"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$LOG"
  echo "| $name | $rc | $(($(date +%s) - t0)) |" >>"$SUMMARY"
}

step_time() {  # mean time/step of a run's metrics.jsonl, skipping the first (warm-up) step
  "$PY" - "$1" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")]
t = [r["time/step"] for r in rows if "time/step" in r][1:]
print(f"{sys.argv[1]}: time/step {sum(t) / max(len(t), 1):.3f} s over {len(t)} step(s) after the first")
PYEOF
}

# --- 1 devices and /dev/shm --------------------------------------------------------------------------------------
step probe 60 bash -c "nvidia-smi -L; df -h /dev/shm; $PY - <<'PYEOF'
import os, torch
from rlinf_mini.scheduler import devices, shm
n = torch.cuda.device_count()
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'GPUs', n,
      [torch.cuda.get_device_name(i) for i in range(n)])
print('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES'), '-> visible', devices.visible_gpus(os.environ, n))
print('/dev/shm free', shm.free_bytes() / 2**30, 'GiB')
if n:
    from stages.sync_gpu import gpu_id, pin, unpin
    seg = shm.SharedSegment.create(64 << 20, tag='probe')
    ok = pin(seg)
    print('GPU 0 id', gpu_id(torch.device('cuda:0')), '| cudaHostRegister on a /dev/shm segment:', ok)
    if ok:
        unpin(seg)
    seg.close()
PYEOF"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no CUDA GPU visible: nothing else to run" | tee -a "$LOG"
  exit 0
fi

# --- 2 the tests marked gpu ----------------------------------------------------------------------------------------
step gpu_tests 120 env RLINF_MINI_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_gpu.py

# --- 3 one actor rank (configs/embodied_disaggregated.yaml: every component on GPU 0 of 1) --------------------------
RUNS=$(mktemp -d /tmp/rlinf_mini_gpu_runs.XXXXXX)  # its own run folders and model folder, not the checkout's results/
COMMON=(--runner.val-check-interval -1 --runner.no-val-before-train --runner.no-progress-bar
        --runner.logger.log-path "$RUNS")
step smoke_explain 60 "$PY" -m rlinf_mini.train --config configs/embodied_disaggregated.yaml --runner.max-epochs 3 \
  "${COMMON[@]}" --runner.logger.experiment-name smoke --explain
step smoke_one_actor_run 90 "$PY" -m rlinf_mini.train --config configs/embodied_disaggregated.yaml \
  --runner.max-epochs 3 "${COMMON[@]}" --runner.logger.experiment-name smoke

# --- 4 the default config on 1 GPU (two actor ranks share it: gloo), VLA step time, fp32 then bf16 -----------------
step default_vla_fp32 120 "$PY" -m rlinf_mini.train --config configs/embodied.yaml --runner.max-epochs 4 \
  "${COMMON[@]}" --runner.logger.experiment-name vla_fp32 --actor.model.model-path "$RUNS/tiny_vla"
step_time "$RUNS/vla_fp32"
step default_vla_bf16 100 "$PY" -m rlinf_mini.train --config configs/embodied.yaml --runner.max-epochs 4 \
  "${COMMON[@]}" --runner.logger.experiment-name vla_bf16 --actor.model.precision bf16 --rollout.model.precision bf16 \
  --actor.model.model-path "$RUNS/tiny_vla"
step_time "$RUNS/vla_bf16"

# --- 5 weight sync / device copy, pinned vs pageable, channel ------------------------------------------------------
step benchmarks 150 "$PY" -m benchmarks --device cuda --quick --out "$OUT/benchmarks.json"

echo "total $(($(date +%s) - START)) s" | tee -a "$LOG"
cat "$SUMMARY"
