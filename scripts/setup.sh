#!/usr/bin/env bash
# Idempotent set-up on a fresh machine of this kind (Debian, root, PyPI reachable):
# system packages, Python packages, the build, then the `zero` / `zero-mem` / `zero-report` commands.
# A second run checks what is there and only rebuilds what changed (seconds).
#
# Every step says what it does; a step that fails prints its command, the last lines of its
# output and what to do, then exits 1. The full output of each step is in build/setup-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
LOGS="build/setup-logs"
STEP_NAME="setup"
LOG_PREFIX=""
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh  # say, fail, run_step

# -- the interpreter ---------------------------------------------------------------------
command -v "$PYTHON" >/dev/null || fail "no '$PYTHON' on PATH" \
  "install Python 3.10+ (apt-get install python3 python3-venv python3-dev) or set PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail \
  "$("$PYTHON" --version 2>&1) is too old" "use Python 3.10 or newer (set PYTHON=/path/to/python3)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || fail "'$PYTHON -m pip' does not run" \
  "install pip for this interpreter (apt-get install python3-pip, or $PYTHON -m ensurepip)"

# -- system packages -----------------------------------------------------------------------
missing=()
for pkg in catch2 ccache cmake ninja-build g++ liburing-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  [ "$(id -u)" = 0 ] || fail "Debian packages missing: ${missing[*]}" \
    "run this script as root, or: sudo apt-get install -y ${missing[*]}"
  say "installing Debian packages: ${missing[*]} (about a minute)"
  run_step apt-update "check that Debian's package mirrors are reachable" apt-get update -qq
  run_step apt-install "install them by hand: apt-get install -y ${missing[*]}" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# -- Python packages -----------------------------------------------------------------------
PIP=("$PYTHON" -m pip install --disable-pip-version-check -c requirements/constraints.txt)
if ! "$PYTHON" scripts/check_requirements.py requirements/constraints.txt 2>/dev/null; then
  say "installing torch==2.13.0 (the CPU wheel on this machine; a few minutes)"
  run_step pip-torch "pip must find torch==2.13.0 (a CPU wheel); see requirements/constraints.txt" \
    "${PIP[@]}" torch==2.13.0
fi
if ! "$PYTHON" scripts/check_requirements.py requirements/dev.txt 2>/dev/null; then
  say "installing Python packages from requirements/dev.txt"
  run_step pip-dev "install them by hand: $PYTHON -m pip install -r requirements/dev.txt" \
    "${PIP[@]}" -r requirements/dev.txt
fi

# -- the build -------------------------------------------------------------------------------
# ccache's compiler wrappers first on PATH: the extension build and CMake both hit the cache.
# Paths under this checkout are hashed relative to it, so another clone of the same commit on
# this machine (CI's fresh clone) reuses the objects instead of recompiling for minutes.
export PATH="/usr/lib/ccache:$PATH"
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
say "building the core (CMake) and zero._C (about 3 minutes the first time, seconds after)"
run_step build "read the compiler error above; 'rm -rf build' forces a clean rebuild" \
  "$PYTHON" setup.py build_ext --inplace

# -- the commands --------------------------------------------------------------------------
# `zero`, `zero-mem` and `zero-report` come from an editable install of this checkout (no
# rebuild); it is redone when a command is missing or the install points at another checkout.
installed_at=$("$PYTHON" scripts/lib/editable_location.py 2>/dev/null || true)
if ! command -v zero >/dev/null || ! command -v zero-mem >/dev/null ||
   ! command -v zero-report >/dev/null || [ "$installed_at" != "$PWD" ]; then
  say "installing the zero, zero-mem and zero-report commands (editable install of $PWD)"
  run_step pip-editable "install by hand: ZERO_SKIP_EXT=1 $PYTHON -m pip install --no-deps --no-build-isolation -e ." \
    env ZERO_SKIP_EXT=1 "$PYTHON" -m pip install --disable-pip-version-check --no-deps \
    --no-build-isolation -e .
fi
command -v zero >/dev/null || fail "the 'zero' command is not on PATH after the install" \
  "add $("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') to PATH"
# zero._C imports, was built against this torch and its libstdc++, CPU Adam's kernel
# (zero-report adds a smoke test).
"$PYTHON" -m zero.env_report --no-smoke >"$LOGS/env_report.txt" 2>&1
report=$?
if [ "$report" -eq 1 ]; then
  sed 's/^/    /' "$LOGS/env_report.txt"
  fail "zero's environment report has a FAIL line (above)" "do what its -> line says"
elif [ "$report" -ne 0 ]; then  # killed by a signal: zero._C crashed as it loaded
  tail -n 20 "$LOGS/env_report.txt" | sed 's/^/    /'
  fail "zero's environment report stopped (exit $report): zero._C does not load" \
    "rm -rf build zero/_C*.so and run this script again"
fi
say "done"
