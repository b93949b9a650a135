"""`deepspeed.utils.z3_leaf_module` (DeepSpeed 0.19.8): the stage-3 leaf flag of a module.
A flagged module (with everything inside it) is one gather unit (zero.stage3.gather_unit);
the flag is DeepSpeed's `_z3_leaf` attribute, so code that sets or reads it directly agrees.
When a stage-3 engine starts, each parameter inside a flagged module names the outermost
one in `param.ds_z3_leaf_module`, as DeepSpeed's hooks set it."""
from __future__ import annotations

from torch import nn

from zero.stage3 import gather_unit, is_gather_unit, set_z3_leaf_modules

__all__ = ["z3_leaf_module", "z3_leaf_parameter", "get_z3_leaf_modules", "set_z3_leaf_module",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix"]


def z3_leaf_module(model: nn.Module) -> bool:
    """Whether `model` is flagged as a leaf."""
    return is_gather_unit(model)


def z3_leaf_parameter(model: nn.Parameter) -> bool:
    """Whether a stage-3 engine found this parameter inside a leaf module."""
    return hasattr(model, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: nn.Module) -> list[nn.Module]:
    """The modules inside `model` (itself included) flagged as leaves."""
    return [module for module in model.modules() if is_gather_unit(module)]


def set_z3_leaf_module(model: nn.Module, flag: bool) -> None:
    gather_unit(model, flag)


def unset_z3_leaf_modules(model: nn.Module, leaf_module_classes,
                          raise_if_not_found: bool = True) -> list[nn.Module]:
    """Clears the flag of every instance of the given classes (or class names); none found is
    a ValueError unless raise_if_not_found is false."""
    return set_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found, flag=False)


def set_z3_leaf_modules_by_name(model: nn.Module, module_names, flag: bool = True,
                                raise_if_not_found: bool = True
                                ) -> tuple[list[nn.Module], list[str]]:
    """Flags (or with flag False clears) the modules named in `model.named_modules()`:
    (the modules, the names not found); a name not found is a ValueError unless
    raise_if_not_found is false."""
    modules = dict(model.named_modules())
    found = [gather_unit(modules[name], flag) for name in module_names if name in modules]
    missing = [name for name in module_names if name not in modules]
    if missing and raise_if_not_found:
        raise ValueError(f"zero: set_z3_leaf_modules_by_name: no modules named {missing} in "
                         f"{type(model).__name__}; names are model.named_modules()'s")
    return found, missing


def set_z3_leaf_modules_by_suffix(model: nn.Module, module_name_suffixes, flag: bool = True,
                                  raise_if_not_found: bool = True
                                  ) -> tuple[list[nn.Module], list[str]]:
    """Flags (or clears) every module whose name in `model.named_modules()` ends with one of
    the suffixes: (the modules, once each, the suffixes that matched none)."""
    found: dict[int, nn.Module] = {}
    missing = []
    for suffix in module_name_suffixes:
        matched = [m for name, m in model.named_modules() if name.endswith(suffix)]
        missing += [] if matched else [suffix]
        found.update((id(m), gather_unit(m, flag)) for m in matched)
    if missing and raise_if_not_found:
        raise ValueError(f"zero: set_z3_leaf_modules_by_suffix: no module name ends with "
                         f"{missing} in {type(model).__name__}")
    return list(found.values()), missing
