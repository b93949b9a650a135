"""zero: a ZeRO / sharded-optimizer memory engine for PyTorch.

`zero._C` is the compiled core (partition planner, memory accounting, collectives); the
Python package holds config, hooks, the launcher and reports.
"""
__version__ = "0.1.0"

import torch as _torch  # noqa: F401  (loads libtorch, which zero._C links against)
