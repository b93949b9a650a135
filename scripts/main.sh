#!/usr/bin/env bash
# Sets up (idempotent) and runs the main job on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OMP_NUM_THREADS=1 python3 -m torch.distributed.run --nproc_per_node 2 --master_port "$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")" \
  examples/collectives_demo.py
