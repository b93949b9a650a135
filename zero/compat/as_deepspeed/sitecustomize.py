"""Runs at the start of every process started by zero's launcher while zero stands in for
`deepspeed` (this folder is first on their PYTHONPATH). It registers, with the standard
library alone (zero/compat/accelerate_cpu.py, loaded by path so that the `zero` package and
torch are not imported here), a hook that adapts Accelerate on a machine without a GPU when
Accelerate is imported; then it runs the sitecustomize this one hides."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "_zero_accelerate_cpu", os.path.join(os.path.dirname(_here), "accelerate_cpu.py"))
_hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hook)
_hook.watch_for_accelerate()

_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
