"""Runs a Trainer script (argv[1:]) under the real DeepSpeed on a machine without a GPU, for
make.py: Accelerate brings up DeepSpeed only for an accelerator backend and would take every
rank for a world of one, so the same hook zero's launcher installs (zero/compat/
accelerate_cpu.py) gives it gloo. Nothing else of zero runs: `deepspeed` is DeepSpeed's."""
import runpy
import sys

from zero.compat.accelerate_cpu import watch_for_accelerate

watch_for_accelerate()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
