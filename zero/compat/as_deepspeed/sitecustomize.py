"""Runs at the start of every process started by zero's launcher while zero stands in for
`deepspeed` (this folder is first on their PYTHONPATH). It only registers, with the standard
library alone, a hook that adapts Accelerate on a machine without a GPU when Accelerate is
imported (zero/compat/deepspeed_alias.py), then runs the sitecustomize this one hides."""
import importlib.machinery
import os
import sys

from zero.compat.deepspeed_alias import watch_for_accelerate  # stdlib-only module

watch_for_accelerate()

_here = os.path.dirname(os.path.abspath(__file__))
_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
