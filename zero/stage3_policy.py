"""DeepSpeed's two config rules for how stage 3 splits a model, the engine's and the
estimator's one copy of each:

  * which parameters stay whole (stage3_param_persistence_threshold and
    stage3_model_persistence_threshold): `kept_whole`;
  * which modules are one gather unit (stage3_module_granularity_threshold):
    `granularity_units`, given to zero's own unit policy (zero/stage3.py plan_units).
"""
from __future__ import annotations

import logging
from typing import Sequence

from torch import nn

from . import init as zero_init

logger = logging.getLogger("zero")

# DeepSpeed never makes a module of more than this many elements one unit by granularity
# (parameter_offload.py Z3_MAX_LEAF_SIZE): a huge unit holds too much gathered at once.
MAX_GRANULARITY_UNIT = 1_000_000_000
# Containers are never a unit of their own: their children run, not they (DeepSpeed's rule).
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def kept_whole(numels: Sequence[int], param_threshold: int, model_threshold: int) -> list[bool]:
    """DeepSpeed's mark_persistent_parameters: walking the parameters in model order, one of
    at most `param_threshold` elements stays whole on every rank, unless it would take the
    whole ones past `model_threshold` elements in all (then it is partitioned, and later
    small ones may still fit)."""
    whole, total = [], 0
    for numel in numels:
        keep = numel <= param_threshold and total + numel <= model_threshold
        total += numel if keep else 0
        whole.append(keep)
    return whole


def _granularity(module: nn.Module, into: dict[int, int | None]) -> tuple[int, int]:
    """(layers, elements) of `module`; records its granularity (elements per layer, None where
    DeepSpeed's is sys.maxsize: no parameters, a leaf, a container, or too large)."""
    if not any(True for _ in module.parameters()):
        into[id(module)] = None
        return 0, 0
    elements = sum(zero_init.full_numel(p) for p in module.parameters(recurse=False))
    children = list(module.children())
    if not children:  # a torch leaf: one layer
        into[id(module)] = None
        return 1, elements
    layers = 0
    for child in children:
        child_layers, child_elements = _granularity(child, into)
        layers, elements = layers + child_layers, elements + child_elements
    if isinstance(module, _CONTAINERS):
        into[id(module)] = None
        return layers, elements
    layers += 1
    into[id(module)] = elements // layers if elements <= MAX_GRANULARITY_UNIT else None
    return layers, elements


def granularity_units(model: nn.Module, threshold: int) -> list[nn.Module]:
    """DeepSpeed's stage3_module_granularity_threshold: a module's granularity is its
    elements over its layers (the torch leaves with parameters below it, and itself); from
    the root down, the first module on each path whose granularity is at most `threshold`
    becomes one gather unit (as with set_z3_leaf_modules), so a model of many small modules
    is gathered in fewer, larger pieces. Returns those modules for plan_units, marking
    nothing (none when no module is that fine: a warning names the finest)."""
    if threshold <= 0:
        return []
    granularity: dict[int, int | None] = {}
    _granularity(model, granularity)
    known = [(value, type(m).__name__) for m in model.modules()
             if (value := granularity.get(id(m))) is not None]
    if not known or min(known)[0] > threshold:
        finest = f"{min(known)[1]} at {min(known)[0]:,}" if known else "none"
        logger.warning("zero: stage3_module_granularity_threshold %s marks no module: the "
                       "finest granularity (elements per layer) is %s; raise the threshold "
                       "to at least that to gather such modules whole", threshold, finest)
        return []
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if not any(True for _ in module.parameters()):
            return
        value = granularity.get(id(module))
        if value is not None and value <= threshold:
            units.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return units
