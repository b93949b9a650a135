"""zero: a ZeRO / sharded-optimizer memory engine for PyTorch.

    import zero
    engine, optimizer, _, scheduler = zero.initialize(model=model, config="ds_config.json")
    loss = engine(batch); engine.backward(loss); engine.step()

`zero._C` is the compiled core (partition planner, memory accounting, collectives, the
sharded optimizer step); the Python package holds config, hooks, the launcher and reports.
"""
import torch as _torch  # noqa: F401  (loads libtorch, which zero._C links against)

from . import clean_exit as _clean_exit  # noqa: F401  (first, so its exit handler runs last)

from .api import add_config_arguments, init_distributed, initialize
from .init import Init
from .stage3 import (GatheredParameters, gather_unit, register_external_parameter,
                     set_z3_leaf_modules, unregister_external_parameter)

__version__ = "0.1.0"
__all__ = ["initialize", "init_distributed", "add_config_arguments", "Init", "GatheredParameters",
           "register_external_parameter", "unregister_external_parameter", "gather_unit",
           "set_z3_leaf_modules"]
