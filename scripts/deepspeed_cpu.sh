#!/usr/bin/env bash
# The real DeepSpeed 0.19.8 on this CPU machine, for benchmarks/bench_deepspeed.py: a virtual
# environment build/ds-venv on top of the system Python (so it sees the system torch, and
# zero's editable install), DeepSpeed's small dependencies, then the deepspeed==0.19.8 sdist
# without its dependencies and without build isolation (it must build against the system
# torch and may never install another one), and finally DeepSpeed's CPU Adam op compiled once
# (JIT, ~1 minute; cached under ~/.cache/torch_extensions) so the first benchmark run does not
# pay for it.
#
# Idempotent: a second run checks what is there and changes nothing (seconds). Every step says
# what it does; a failing step prints its command, the last lines of its output (the full
# output is in build/setup-logs/deepspeed-*.log) and what to do, then exits 1.
#
#   scripts/deepspeed_cpu.sh                     # set up (or check) build/ds-venv
#   DS_VENV=/path/venv scripts/deepspeed_cpu.sh  # another place
#
# Then: build/ds-venv/bin/python benchmarks/bench_deepspeed.py --help
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${DS_VENV:-build/ds-venv}"
DS_VERSION="0.19.8"
SDIST=".whl/deepspeed-$DS_VERSION.tar.gz"
LOGS="build/setup-logs"
CONSTRAINTS="requirements/constraints.txt"
STEP_NAME="deepspeed_cpu"
LOG_PREFIX="deepspeed-"
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh  # say, fail, run_step

# -- the system Python and its torch -------------------------------------------------------
command -v "$PYTHON" >/dev/null || fail "no '$PYTHON' on PATH" "set PYTHON=/path/to/python3"
SYSTEM_TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null) || fail \
  "the system Python ($PYTHON) has no torch" "run scripts/setup.sh first (it installs torch==2.13.0)"
SYSTEM_TORCH_DIR=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
say "system Python $("$PYTHON" --version 2>&1 | cut -d' ' -f2), torch $SYSTEM_TORCH ($SYSTEM_TORCH_DIR)"
WANT_TORCH=$(sed -n 's/^torch==//p' "$CONSTRAINTS")
[ "${SYSTEM_TORCH%%+*}" = "$WANT_TORCH" ] || fail \
  "the system torch is $SYSTEM_TORCH, $CONSTRAINTS pins torch==$WANT_TORCH" "run scripts/setup.sh first"

# -- the virtual environment -----------------------------------------------------------------
VPY="$VENV/bin/python"
if [ -x "$VPY" ]; then
  say "virtual environment $VENV is there"
else
  say "creating $VENV (--system-site-packages: the system torch is used, never installed)"
  run_step venv "check that '$PYTHON -m venv' works (apt-get install python3-venv)" \
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
grep -q '^include-system-site-packages = true' "$VENV/pyvenv.cfg" || fail \
  "$VENV does not see the system site-packages (so not the system torch)" "rm -rf $VENV and run this again"

# torch must be the system one, before and after every install
check_torch() {
  local where
  where=$("$VPY" -c 'import os, torch; print(torch.__version__, os.path.dirname(torch.__file__))' \
          2>/dev/null) || fail "torch does not import in $VENV" "rm -rf $VENV and run this again"
  [ "$where" = "$SYSTEM_TORCH $SYSTEM_TORCH_DIR" ] || fail \
    "$VENV has another torch ($where), not the system's ($SYSTEM_TORCH $SYSTEM_TORCH_DIR)" \
    "rm -rf $VENV and run this again"
}
check_torch

PIP=("$VPY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS")

# -- DeepSpeed's dependencies (requirements/requirements.txt of the sdist, without torch) ------
# einops hjson msgpack ninja numpy packaging psutil py-cpuinfo pydantic tqdm; plus wheel for the
# sdist build. What the system Python already has is taken from there.
DEPS=(wheel einops hjson msgpack ninja numpy "packaging>=20.0" psutil py-cpuinfo "pydantic>=2.0.0" tqdm)
if "$VPY" - "${DEPS[@]}" <<'EOF' 2>/dev/null
import importlib.metadata, re, sys
for req in sys.argv[1:]:
    importlib.metadata.version(re.split(r"[<>=]", req)[0])
EOF
then
  say "DeepSpeed's dependencies are there"
else
  say "installing DeepSpeed's dependencies: ${DEPS[*]}"
  FIND=()
  [ -d .whl ] && FIND=(--find-links .whl)
  run_step deps "check that PyPI is reachable; then: ${PIP[*]} ${DEPS[*]}" \
    "${PIP[@]}" "${FIND[@]}" "${DEPS[@]}"
  check_torch
fi

# -- DeepSpeed itself --------------------------------------------------------------------------
installed=$("$VPY" -c 'import importlib.metadata as m; print(m.version("deepspeed"))' 2>/dev/null || true)
if [ "$installed" = "$DS_VERSION" ]; then
  say "deepspeed $DS_VERSION is installed"
else
  [ -n "$installed" ] && say "deepspeed $installed is installed; replacing it with $DS_VERSION"
  if [ -f "$SDIST" ]; then SOURCE="$SDIST"; else SOURCE="deepspeed==$DS_VERSION"; fi
  say "installing deepspeed $DS_VERSION from $SOURCE (--no-deps --no-build-isolation; no ops prebuilt, about a minute)"
  run_step install "check that PyPI is reachable; then: ${PIP[*]} --no-deps --no-build-isolation $SOURCE" \
    env DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "${PIP[@]}" --no-deps --no-build-isolation "$SOURCE"
  check_torch
fi

# -- it imports, as itself (not zero's `deepspeed` alias), on the CPU accelerator --------------
VENV_ABS=$(cd "$VENV" && pwd)
run_step import "rm -rf $VENV and run this again" env DS_ACCELERATOR=cpu "$VPY" -c "
import os, sys, deepspeed
from deepspeed.accelerator import get_accelerator
print(deepspeed.__version__, deepspeed.__file__, get_accelerator().device_name(),
      get_accelerator().communication_backend_name())
assert deepspeed.__version__ == '$DS_VERSION', deepspeed.__version__
assert os.path.realpath(deepspeed.__file__).startswith(os.path.realpath('$VENV_ABS')), deepspeed.__file__
assert get_accelerator().device_name() == 'cpu', get_accelerator().device_name()
"
say "imports: $(tail -n 1 "$LOGS/deepspeed-import.log")"

# -- DeepSpeed's CPU Adam ops, compiled once (JIT into ~/.cache/torch_extensions) -------------
# DeepSpeedCPUAdam (ZeRO-Offload), the CPU accelerator's FusedAdam (the "AdamW" of a config
# without offload) and the shared-memory comm op that init_distributed loads on CPU.
for op in CPUAdamBuilder FusedAdamBuilder ShareMemCommBuilder; do
  say "loading DeepSpeed's $op op (compiles it the first time, about a minute; cached after)"
  run_step "op-$op" "read the compiler error above (g++ and ninja are needed)" \
    env DS_ACCELERATOR=cpu "$VPY" -c "
from deepspeed.accelerator import get_accelerator
print(get_accelerator().create_op_builder('$op').load())
"
  say "$op: $(tail -n 1 "$LOGS/deepspeed-op-$op.log")"
done

# -- zero imports there too (the benchmark holds both engines in one process) ------------------
run_step zero-import "run scripts/setup.sh first (zero._C must be built in this checkout)" \
  env DS_ACCELERATOR=cpu PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VPY" -c "
import zero, zero._C, deepspeed
print('zero', zero.__file__, 'deepspeed', deepspeed.__version__)
"
say "zero and deepspeed import together in $VENV"
say "done: run the benchmark with $VPY benchmarks/bench_deepspeed.py"
