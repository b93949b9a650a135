#!/usr/bin/env bash
# zero on a machine with an NVIDIA GPU, in one go:
#   1. build  the CUDA extension in place, against the torch and CUDA installed there
#             (installs nothing, fetches nothing; the core's Catch2 tests are not built),
#             then zero's environment report (zero/env_report.py: the build checked against
#             this torch and libstdc++, three training steps on the CPU and on the GPU);
#   2. tests  the CUDA tests (tests/test_cuda_*.py: NCCL, stages 0-3 on the GPU, offload,
#             the memory report against torch.cuda's allocator, zero-mem's offload
#             estimate against the engine, the HF Trainer);
#   3. bench  benchmarks/bench_gpu_offload.py: ZeRO-Offload on one GPU against the same model
#             without offload and FSDP2 with CPU offload;
#   4. largest  the largest GPT that trains without offload and with it, each configuration
#               chosen by zero's tuner for this GPU and host (benchmarks/gpu_largest.py). Not
#               in the default steps since 2026-12-01: measured on the H200 (8.3B without
#               offload, 10B with the whole optimizer on the host: the host's 125 GiB, not
#               the GPU, is the limit there), it took the bench's time; ask for it with
#               GPU_CHECK_STEPS. The tuner's partial offload (2026-12-01) plans 15B there,
#               and 16.6B (2x) with the parameters on NVMe (GPU_NVME_PATH).
# Results (JSON + Markdown naming the GPU, driver, torch and date) go to
# benchmarks/results/gpu/ (or $ZERO_GPU_RESULTS); gpu_check.md there says what each step did.
# On a machine without a GPU it says so in one line and exits 0.
#
#   bash scripts/gpu_check.sh                        # build, tests, bench
#   GPU_CHECK_STEPS="build tests" bash scripts/gpu_check.sh
#   GPU_CHECK_STEPS="build tests bench largest" bash scripts/gpu_check.sh   # everything
#   ZERO_COMMIT=<sha>  names the commit measured where the checkout has no .git
#   GPU_CHECK_ARCHIVE=<file.tar.gz>  the results folder packed into one file at the end
#                      (on a lent machine: ZERO_GPU_RESULTS=/tmp/gpu GPU_CHECK_ARCHIVE=$OUT/gpu.tar.gz)
#   .whl/ (from scripts/gpu_wheels.sh, carried)  DeepSpeed and its needs, installed into
#                      build/gpu-site so the bench's deepspeed rows run
#   GPU_TEST_WORKERS   pytest-xdist processes for the CUDA tests (default 8: the 73 tests took
#                      52 s on an H200 with 16 cores, 2026-11-30)
#   GPU_TESTS_FIRST    a regex of CUDA test ids to run before all others; after them come
#                      the tests no committed run has seen pass (scripts/lib/gpu_test_order.py)
#   GPU_NVME_PATH      the largest step's swap-file directory (default /var/tmp/zero-nvme): the
#                      tuner may put parameters or optimizer state there, within its free space
#   BENCH_ARGS / LARGEST_ARGS  more arguments for the bench / largest steps
#                      (e.g. BENCH_ARGS="--configs zero2,zero2-offload --timeout 120")
#   GPU_CHECK_BUDGET   seconds for the whole script (default 540: one call of a lent machine
#                      is at most 600 s, and a session's device time, machine start included,
#                      is 15 minutes). The tests get half of what the build leaves (240 s
#                      at most), the bench half of the rest, the largest-model sweep what
#                      remains (scripts/lib/gpu_budget.sh); a step cut by its share says so in
#                      the summary. BENCH_BUDGET / LARGEST_BUDGET fix a step's share instead.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${ZERO_GPU_RESULTS:-benchmarks/results/gpu}
STEPS=${GPU_CHECK_STEPS:-build tests bench}
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET:-540}))
# shellcheck source=lib/gpu_budget.sh
source scripts/lib/gpu_budget.sh  # wants, share

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
  if [ "$rc" -eq 124 ]; then result="CUT at its share of the budget (GPU_CHECK_BUDGET)"; failed=1
  elif [ "$rc" -ne 0 ]; then result="FAILED (exit $rc)"; failed=1; fi
  echo "| $name | $result | $((SECONDS - start)) |" >>"$SUMMARY"
  echo "== gpu_check: $name: $result in $((SECONDS - start)) s" | tee -a "$LOG"
  return "$rc"
}

# The C++ compiler: $ZERO_CXX when set, else the system's g++. Not whatever g++ is first on PATH:
# on the GPU machine that is /opt/gcc/bin/g++, a wrapper that links libstdc++ statically, and
# an extension carrying its own libstdc++ beside the process's crashes in its first
# std::ostringstream (seen 2026-11-25: every collective segfaulted in Communicator::describe).
# The image exports CXX=/opt/gcc/bin/g++ itself (seen 2026-11-28: every zero process segfaulted
# again), so an inherited CXX is not trusted: ZERO_CXX names another compiler on purpose.
compiler() {
  if [ -n "${ZERO_CXX:-}" ]; then echo "$ZERO_CXX"; elif [ -x /usr/bin/g++ ]; then echo /usr/bin/g++; else echo g++; fi
}

build() {
  local capability cxx
  capability=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  cxx=$(compiler)
  echo "C++ compiler: $cxx ($("$cxx" --version | head -1))"
  rm -rf build/gpu-cmake
  CXX="$cxx" ZERO_CMAKE_BUILD_DIR="$PWD/build/gpu-cmake" ZERO_BUILD_TESTS=0 \
    TORCH_CUDA_ARCH_LIST="$capability" MAX_JOBS="$(nproc)" \
    "$PYTHON" setup.py -q build_ext --inplace || return 1
  "$PYTHON" -c 'import zero._C as C; assert C.cuda_build, "the extension was built without CUDA"; print("zero._C is a CUDA build")' || return 1
  # The environment report checks the build against this torch, that the extension uses the
  # process's libstdc++, and trains three steps on the CPU and on the GPU, each in a process
  # of its own: a build that crashes fails here in seconds, before the tests and benchmarks.
  "$PYTHON" -m zero.env_report | tee "$RESULTS/env_report.txt"
  return "${PIPESTATUS[0]}"
}

tests() {
  local parallel=()  # the GPU machine has cores to spare: GPU_TEST_WORKERS (8) test processes
  if "$PYTHON" -c 'import xdist' >/dev/null 2>&1; then parallel=(-n "${GPU_TEST_WORKERS:-8}"); fi
  local seconds; seconds=$(share tests)
  echo "tests: at most $seconds s"
  # What no committed run has seen pass goes first (GPU_TESTS_FIRST: a regex of ids before
  # even those), so a budget that cuts the run cuts what has passed before.
  local files=(tests/test_cuda_collectives.py tests/test_cuda_engine.py
               tests/test_cuda_estimate.py tests/test_cuda_hf.py)
  local ids=()
  mapfile -t ids < <("$PYTHON" scripts/lib/gpu_test_order.py --first "${GPU_TESTS_FIRST:-}" \
                       "${files[@]}")
  [ "${#ids[@]}" -gt 0 ] || ids=("${files[@]}")
  # -v names each result as it comes and tests/conftest.py writes each failure's traceback to
  # cuda_test_failures.txt when it happens: a run the budget cuts still says what failed and why.
  : >"$RESULTS/cuda_test_failures.txt"
  ZERO_TEST_FAILURES="$RESULTS/cuda_test_failures.txt" timeout -k 10 "$seconds" \
    "$PYTHON" -m pytest -p no:cacheprovider -v -rA "${parallel[@]}" \
    "${ids[@]}" 2>&1 | tee "$RESULTS/cuda_tests.txt"
  return "${PIPESTATUS[0]}"
}

# DeepSpeed for the bench's deepspeed rows, from wheels carried in .whl/ (no internet there).
deepspeed_from_wheels() {
  local site="$PWD/build/gpu-site"
  ls .whl/deepspeed-*.tar.gz >/dev/null 2>&1 || { echo "no .whl/deepspeed-*.tar.gz: DeepSpeed rows will say why"; return 0; }
  if ! PYTHONPATH="$site" "$PYTHON" -c 'import deepspeed' >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl &&
      (cd /tmp && DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --no-index --no-deps \
        --no-build-isolation --upgrade --target "$site" "$OLDPWD"/.whl/deepspeed-*.tar.gz) || return 1
  fi
  export PYTHONPATH="$PYTHONPATH:$site"
  PYTHONPATH="$site" "$PYTHON" -c 'import deepspeed; print("deepspeed", deepspeed.__version__, "from .whl")'
}
case " $STEPS " in *" bench "*|*" largest "*) deepspeed_from_wheels >>"$LOG" 2>&1 || echo "gpu_check: DeepSpeed from .whl failed (see $LOG)" ;; esac
export CXX="$(compiler)"  # DeepSpeed's JIT-built CPU Adam too

if step build build; then
  step tests tests
  # Each benchmark keeps its share (--budget stops a configuration still running at its end);
  # what a share cuts is in the benchmark's own report.
  step bench "$PYTHON" benchmarks/bench_gpu_offload.py --budget "$(share bench)" --out "$RESULTS" \
    ${BENCH_ARGS:-}
  step largest "$PYTHON" benchmarks/bench_gpu_offload.py --largest --budget "$(share largest)" \
    --nvme-path "${GPU_NVME_PATH:-/var/tmp/zero-nvme}" --out "$RESULTS" ${LARGEST_ARGS:-}
fi
echo "gpu_check: summary in $SUMMARY"
cat "$SUMMARY"
# One file for the whole results folder: a lent machine's call returns only so many files
# from its $OUT (2026-11-28: the largest-model sweep's per-size JSON crowded out its report).
if [ -n "${GPU_CHECK_ARCHIVE:-}" ]; then
  tar -czf "$GPU_CHECK_ARCHIVE" -C "$RESULTS" . && echo "gpu_check: results in $GPU_CHECK_ARCHIVE"
fi
exit "$failed"
