#!/usr/bin/env bash
# Sets up (idempotent) and runs every test: the Catch2 core tests through ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ctest (C++ core) =="
ctest --test-dir build/cmake --output-on-failure -j2
echo "== pytest =="
# Every test starts ranks and jobs that import zero and the tests' modules anew: let them reuse
# the bytecode (with PYTHONDONTWRITEBYTECODE set, as some images do, each one recompiles them).
unset PYTHONDONTWRITEBYTECODE
# One worker per core (-n auto), each test file on one worker (its module fixtures made once);
# --durations lists the slowest, for CI's 25 minutes.
PYTEST=(python3 -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=25)
if (($#)); then
  exec "${PYTEST[@]}" "$@"  # the tests named
fi
# The set-up's own tests uninstall zero and rebuild it in place: alone, before the rest.
status=0
python3 -m pytest -q tests/test_setup.py || status=$?
"${PYTEST[@]}" --ignore=tests/test_setup.py --junitxml=build/pytest-junit.xml || status=$?
python3 scripts/lib/test_times.py build/pytest-junit.xml --top 15 || true
exit "$status"
