"""deepspeed.utils.module_utils: the two module-path helpers DeepSpeed-Chat's LoRA code uses to
swap a model's Linear layers (it imports them from their old home, deepspeed.compression.helper)."""
from __future__ import annotations

import functools

import torch

__all__ = ["recursive_getattr", "recursive_setattr"]


def recursive_getattr(model: torch.nn.Module, module_name: str):
    """The attribute at the dotted path `module_name` under `model` ("decoder.layers.0.fc1")."""
    return functools.reduce(getattr, module_name.split("."), model)


def recursive_setattr(model: torch.nn.Module, module_name: str, module) -> None:
    """Set the attribute at the dotted path `module_name` under `model` to `module`."""
    parent, _, name = module_name.rpartition(".")
    setattr(recursive_getattr(model, parent) if parent else model, name, module)
