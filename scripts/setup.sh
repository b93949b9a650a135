#!/usr/bin/env bash
# Idempotent set-up on a fresh machine of this kind (Debian, root, PyPI reachable):
# system packages, Python packages, then the build. A second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in catch2 ccache cmake ninja-build g++ liburing-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PIP="python3 -m pip install --disable-pip-version-check -q -c requirements/constraints.txt"
if ! python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (the CPU wheel on this machine)"
  $PIP torch==2.13.0
fi
if ! python3 -c "import pybind11, pytest, pytest_timeout, ninja, numpy, matplotlib" 2>/dev/null; then
  echo "setup: installing Python packages from requirements/dev.txt"
  $PIP -r requirements/dev.txt
fi

# ccache's compiler wrappers first on PATH: the extension build and CMake both hit the cache.
export PATH="/usr/lib/ccache:$PATH"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
echo "setup: building the core (CMake) and zero._C"
python3 setup.py -q build_ext --inplace > build.log 2>&1 || { tail -n 60 build.log; exit 1; }

# Console scripts (`zero`, `zero-mem`) without rebuilding: an editable install of this
# checkout (redone when the scripts are missing or point at another checkout).
installed_at=$(python3 -m pip show zero 2>/dev/null | sed -n 's/^Editable project location: //p')
if ! command -v zero >/dev/null || ! command -v zero-mem >/dev/null || [ "$installed_at" != "$PWD" ]; then
  ZERO_SKIP_EXT=1 python3 -m pip install --disable-pip-version-check -q --no-deps \
    --no-build-isolation -e . >/dev/null
fi
echo "setup: done"
