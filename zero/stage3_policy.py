"""DeepSpeed's config rules for how stage 3 splits a model, the engine's and the estimator's
one copy of each:

  * which parameters stay whole (stage3_param_persistence_threshold and
    stage3_model_persistence_threshold): `kept_whole`;
  * which modules are one gather unit besides zero's own unit policy (zero/stage3.py
    plan_units): stage3_module_granularity_threshold (`granularity_units`) and
    zero_optimization.leaf_module (`leaf_units`), together `UnitRules`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from torch import nn

from . import init as zero_init
from .config.schema import DEFAULT_LEAF_MODULE_CLASSES

logger = logging.getLogger("zero")

# DeepSpeed never makes a module of more than this many elements one unit by granularity
# (parameter_offload.py Z3_MAX_LEAF_SIZE): a huge unit holds too much gathered at once.
MAX_GRANULARITY_UNIT = 1_000_000_000
# Containers are never a unit of their own: their children run, not they (DeepSpeed's rule,
# by class name: torch.nn.modules.container.__all__; a subclass of Sequential may be a unit).
_CONTAINERS = frozenset({"Container", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
                         "ParameterDict"})


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
    if type(module).__name__ in _CONTAINERS:
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


def class_named(module: nn.Module, names) -> bool:
    """Whether `module`'s class is among `names`, as DeepSpeed names a class: plain, or as
    module.Qualname."""
    cls = type(module)
    return cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names


def leaf_units(model: nn.Module, classes: Sequence[str] = DEFAULT_LEAF_MODULE_CLASSES,
               names: Sequence[str] = (), suffixes: Sequence[str] = ()) -> list[nn.Module]:
    """DeepSpeed's zero_optimization.leaf_module (apply_zero_leaf_module_config): the modules
    whose class is in `classes` (by import path, module.Qualname, or by class name), whose
    name in model.named_modules() is in `names` or ends with one of `suffixes`; each becomes
    one gather unit inside the block holding it. A name the model lacks is a warning."""
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        logger.warning("zero: zero_optimization.leaf_module.names: the model has no module "
                       "named %s", missing)
    wanted = set(classes)
    return [module for name, module in modules.items()
            if class_named(module, wanted)
            or name in names or any(name.endswith(suffix) for suffix in suffixes)]


@dataclass(frozen=True)
class UnitRules:
    """The config's choice of stage-3 units besides zero's policy: the estimator keeps it with
    the shapes it planned (ModelShapes.unit_rules) and the engine applies it (sharding.py)."""
    granularity_threshold: int = 0   # stage3_module_granularity_threshold
    leaf_classes: tuple = DEFAULT_LEAF_MODULE_CLASSES  # zero_optimization.leaf_module.*
    leaf_names: tuple = ()
    leaf_suffixes: tuple = ()

    @classmethod
    def from_config(cls, zero_cfg) -> "UnitRules":
        leaf = zero_cfg.leaf_module
        return cls(int(zero_cfg.stage3_module_granularity_threshold), tuple(leaf.classes),
                   tuple(leaf.names), tuple(leaf.name_suffixes))

    def units(self, model: nn.Module) -> list[nn.Module]:
        """The modules to plan as units of their own (plan_units' marked_units)."""
        chosen = granularity_units(model, self.granularity_threshold)
        chosen += [m for m in leaf_units(model, self.leaf_classes, self.leaf_names,
                                         self.leaf_suffixes) if all(m is not c for c in chosen)]
        return chosen
