#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI), before a device call: downloads what the GPU machine
# lacks to run DeepSpeed's rows of bench_gpu_offload.py into .whl/ (ignored by git; name it in
# the device call's `carry`). gpu_check.sh installs them there into a private folder.
#   DeepSpeed 0.19.8 (its sdist: pip builds it there with the torch it has, DS_BUILD_OPS=0)
#   and its pure-Python needs that the GPU image does not have.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >>.git/info/exclude; }
mkdir -p .whl
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl hjson pydantic==2.13.4 pydantic_core==2.46.4 \
  annotated-types typing-inspection
ls .whl
