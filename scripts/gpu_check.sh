#!/usr/bin/env bash
# zero on a machine with an NVIDIA GPU, in one go:
#   1. build  the CUDA extension in place, against the torch and CUDA installed there
#             (installs nothing, fetches nothing; the core's Catch2 tests are not built);
#   2. tests  the CUDA tests (tests/test_cuda_*.py: NCCL, stages 0-3 on the GPU, offload,
#             the memory report against torch.cuda's allocator);
#   3. bench  benchmarks/bench_gpu_offload.py: ZeRO-Offload on one GPU against the same model
#             without offload and FSDP2 with CPU offload;
#   4. largest  the largest GPT that trains with parameters and optimizer offloaded.
# Results (JSON + Markdown naming the GPU, driver, torch and date) go to
# benchmarks/results/gpu/ (or $ZERO_GPU_RESULTS); gpu_check.md there says what each step did.
# On a machine without a GPU it says so in one line and exits 0.
#
#   bash scripts/gpu_check.sh                        # everything
#   GPU_CHECK_STEPS="build tests" bash scripts/gpu_check.sh
#   ZERO_COMMIT=<sha>  names the commit measured where the checkout has no .git
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${ZERO_GPU_RESULTS:-benchmarks/results/gpu}
STEPS=${GPU_CHECK_STEPS:-build tests bench largest}

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
  echo "gpu_check: no CUDA GPU here (torch.cuda.is_available() is not True for $PYTHON); nothing to check"
  exit 0
fi

mkdir -p "$RESULTS"
LOG="$RESULTS/gpu_check.log"
SUMMARY="$RESULTS/gpu_check.md"
: >"$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ZERO_COMMIT=${ZERO_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

{
  echo "# scripts/gpu_check.sh"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $ZERO_COMMIT"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
  echo "- $("$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0] + ", torch", torch.__version__ + ", CUDA", torch.version.cuda + ", NCCL", torch.cuda.nccl.version())')"
  echo "- host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB memory"
  echo
  echo "| step | result | seconds |"
  echo "| --- | --- | --- |"
} >"$SUMMARY"

failed=0
step() {  # step NAME COMMAND...: runs it, logs it, adds a row to the summary
  local name=$1; shift
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "== gpu_check: $name: $*" | tee -a "$LOG"
  local start=$SECONDS
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  local result="passed"
  if [ "$rc" -ne 0 ]; then result="FAILED (exit $rc)"; failed=1; fi
  echo "| $name | $result | $((SECONDS - start)) |" >>"$SUMMARY"
  echo "== gpu_check: $name: $result in $((SECONDS - start)) s" | tee -a "$LOG"
  return "$rc"
}

build() {
  local capability
  capability=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  ZERO_CMAKE_BUILD_DIR="$PWD/build/gpu-cmake" ZERO_BUILD_TESTS=0 \
    TORCH_CUDA_ARCH_LIST="$capability" MAX_JOBS="$(nproc)" \
    "$PYTHON" setup.py -q build_ext --inplace &&
    "$PYTHON" -c 'import zero._C as C; assert C.cuda_build, "the extension was built without CUDA"; print("zero._C is a CUDA build")'
}

tests() {
  local parallel=()  # the GPU machine has cores to spare: four test processes when xdist is there
  if "$PYTHON" -c 'import xdist' >/dev/null 2>&1; then parallel=(-n 4); fi
  "$PYTHON" -m pytest -p no:cacheprovider -q -rA "${parallel[@]}" tests/test_cuda_collectives.py \
    tests/test_cuda_engine.py 2>&1 | tee "$RESULTS/cuda_tests.txt"
  return "${PIPESTATUS[0]}"
}

if step build build; then
  step tests tests
  step bench "$PYTHON" benchmarks/bench_gpu_offload.py --out "$RESULTS"
  step largest "$PYTHON" benchmarks/bench_gpu_offload.py --largest --out "$RESULTS"
fi
echo "gpu_check: summary in $SUMMARY"
cat "$SUMMARY"
exit "$failed"
