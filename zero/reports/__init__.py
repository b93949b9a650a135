"""Memory reports: estimate before training, tune a config to a budget, render what a run
measured.

    from zero.reports import estimate, tuner, render
    shapes = estimate.shapes_from_module(model)            # or shapes_from_factory / _from_count
    setup = estimate.Setup(world_size=8, precision="bf16", reduce_bucket_size=int(5e8))
    for option in estimate.estimate_all(shapes, setup):   # stages 0-3 x offload
        print(option.name, option.device_bytes, option.host_bytes, option.nvme_bytes)

The command line is `zero-mem` (`python -m zero.reports.cli`): `estimate`, `tune`, `report`.
See docs/MEMORY.md.
"""
# The submodules keep their names (zero.reports.estimate is the package, whose function
# estimate.estimate() gives one option); the common entry points are re-exported here.
from .estimate import (OPTIONS, Estimate, ModelShapes, Option, Setup, estimate_all, option_for,
                       shapes_from_count, shapes_from_factory, shapes_from_module)

__all__ = ["OPTIONS", "Estimate", "ModelShapes", "Option", "Setup", "estimate_all", "option_for",
           "shapes_from_count", "shapes_from_factory", "shapes_from_module"]
