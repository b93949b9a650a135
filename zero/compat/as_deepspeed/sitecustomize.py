"""Runs at the start of every process started by zero's launcher while zero stands in for
`deepspeed` (this folder is on their PYTHONPATH, after zero/launcher/rank_startup/). It
registers, with the standard library alone (zero/compat/accelerate_cpu.py, loaded by path so
that the `zero` package and torch are not imported here), a hook that adapts Accelerate on a
machine without a GPU when Accelerate is imported; then it runs the sitecustomize this one
hides."""
import os
import runpy

_HERE = os.path.dirname(os.path.abspath(__file__))
_COMPAT = os.path.dirname(_HERE)
_startup = runpy.run_path(os.path.join(os.path.dirname(_COMPAT), "site_startup.py"))
_startup["load"]("_zero_accelerate_cpu",
                 os.path.join(_COMPAT, "accelerate_cpu.py")).watch_for_accelerate()
_startup["run_hidden_sitecustomize"](_HERE)
