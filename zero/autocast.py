"""DeepSpeed's `torch_autocast` block: the engine's forward under torch.autocast.

With the block enabled the parameters keep their own dtype (fp32 unless bf16/fp16 is enabled
too), the forward runs under `torch.autocast(device, dtype)`, and the optimizer steps the
parameters directly (no separate master copy, as in fp32 training). An fp16 autocast scales
the loss dynamically with the fp16 block's loss-scale keys (engine.py builds the scaler).

As DeepSpeed's `autocast_if_enabled`: a torch.autocast the script opened around the forward
gives way to the block's dtype when the block is enabled, and is switched off inside the
forward when it is not (the bf16/fp16 blocks then say the precision); either case is logged
once, on rank 0.

DeepSpeed also reduces the gradients of `lower_precision_safe_modules` (Linear, Conv) in the
autocast dtype. zero reduces every gradient in `communication_data_type` (default: the
parameters' dtype): the names are checked to import, the reduction is unchanged.
"""
from __future__ import annotations

import contextlib
import importlib
import logging

import torch
import torch.distributed as dist

from .config import schema

logger = logging.getLogger("zero")

DTYPES = {**dict.fromkeys(schema.BF16_DTYPES, torch.bfloat16),  # the block's spellings
          **dict.fromkeys(schema.FP16_AUTOCAST_DTYPES, torch.float16)}


class ForwardAutocast:
    """The context the engine's forward runs in (`__call__` returns a fresh one)."""

    def __init__(self, block, device_type: str):
        """`block`: the config's TorchAutocastConfig."""
        self.device_type = device_type
        self.dtype = None
        if block.enabled:
            self.dtype = DTYPES[block.dtype] if block.dtype is not None else \
                torch.get_autocast_dtype(device_type)
            check_modules(block.lower_precision_safe_modules)
        self._told = False

    @property
    def loss_scaled(self) -> bool:
        """Whether the forward autocasts to fp16, whose gradients need a loss scale."""
        return self.dtype == torch.float16

    def __call__(self):
        outer = torch.is_autocast_enabled(self.device_type)
        if self.dtype is not None:
            if outer:
                self._tell_once("a torch.autocast around the forward gives way to the config's "
                                f"torch_autocast block ({self.dtype})")
            return torch.autocast(self.device_type, dtype=self.dtype)
        if outer:
            self._tell_once("a torch.autocast around the forward is switched off inside it: the "
                            "bf16/fp16 blocks set the precision; to autocast, enable the "
                            "config's torch_autocast block")
            return torch.autocast(self.device_type, enabled=False)
        return contextlib.nullcontext()

    def _tell_once(self, message: str) -> None:
        if not self._told and (not dist.is_initialized() or dist.get_rank() == 0):
            logger.warning("zero: %s (as DeepSpeed does)", message)
        self._told = True


def module_class(name: str):
    """The class "package.module.Class" names; None if it does not import as one."""
    module_name, _, class_name = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name) \
            if module_name else None
    except (ImportError, AttributeError):
        found = None
    return found if isinstance(found, type) else None


def check_modules(names) -> None:
    """Each of `names` ("package.module.Class") must import; ValueError naming it otherwise,
    as DeepSpeed's init_autocast_params raises."""
    for name in names:
        if module_class(name) is None:
            raise ValueError(f"zero: torch_autocast.lower_precision_safe_modules names "
                             f"{name!r}, which does not import as a class; give module classes "
                             "by import path, such as \"torch.nn.Linear\"")
