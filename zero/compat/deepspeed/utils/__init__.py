"""`deepspeed.utils`: DeepSpeed's logger and log_dist, RepeatingLoader, set_z3_leaf_modules,
recursive_getattr / recursive_setattr,
safe_get_full_* / safe_set_full_* and the zero_to_fp32 helpers."""
from __future__ import annotations

from zero.stage3 import set_z3_leaf_modules

from ..runtime.dataloader import RepeatingLoader
from . import groups, zero_to_fp32
from .logging import log_dist, log_dist_once, logger, print_dist
from .module_utils import recursive_getattr, recursive_setattr
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad,
                              safe_get_full_optimizer_state, safe_get_local_fp32_param,
                              safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_grad,
                              safe_set_full_optimizer_state, safe_set_local_fp32_param,
                              safe_set_local_grad, safe_set_local_optimizer_state)

__all__ = ["RepeatingLoader", "log_dist", "log_dist_once", "logger", "print_dist",
           "recursive_getattr", "recursive_setattr",
           "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state",
           "set_z3_leaf_modules", "groups", "zero_to_fp32"]
