#!/usr/bin/env bash
# The GPU figures (benchmarks/gpu.py): weight sync and channel with CUDA tensors vs device copy bandwidth, and the
# runner with the policy on the GPU. <= 8 minutes on one GPU; exits 0 with a message when there is no GPU.
#   bash benchmarks/gpu.sh [--quick] [--out results/benchmarks.json]
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 python -m benchmarks --device cuda "$@"
