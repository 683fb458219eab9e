#!/usr/bin/env bash
# Download the wheels benchmarks/gpu.sh needs on the device machine (Python 3.12, no network there): the packages
# rlinf_mini needs that its image lacks. Pure-Python wheels, ~1 MB together. Run where pip can reach the index:
#   bash benchmarks/gpu_wheels.sh        # -> .whl/ (ignored by git); then carry ".whl" in the device run
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl \
  tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 gymnasium==1.4.0 farama-notifications==0.0.6
ls -la .whl
