#!/usr/bin/env bash
# Sets up (idempotent) and runs every test: the Catch2 core tests through ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ctest (C++ core) =="
ctest --test-dir build/cmake --output-on-failure -j2
echo "== pytest =="
python3 -m pytest -q --durations=25 "$@"  # the slowest tests, to keep CI under its 25 minutes
