#!/usr/bin/env bash
# Sets up (idempotent) and runs the main job on this machine: a GPT trained by 2 processes
# with ZeRO stage 2 (bf16, fp32 master) from configs/stage2_bf16.json, ending with each rank's memory report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
exec zero --num_procs 2 examples/train_gpt.py --deepspeed_config configs/stage2_bf16.json "$@"
