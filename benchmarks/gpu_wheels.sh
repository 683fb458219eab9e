#!/usr/bin/env bash
# Download the wheels benchmarks/gpu.sh needs on a GPU machine without network (one whose image has torch but not
# rlinf_mini's pure-Python dependencies; Python 3.12 here, change --python-version for yours). Run where pip works:
#   bash benchmarks/gpu_wheels.sh        # -> .whl/ (ignored by git); copy it over with the checkout
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl \
  tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 gymnasium==1.4.0 farama-notifications==0.0.6
ls -la .whl
