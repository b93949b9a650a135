"""`deepspeed.utils`: DeepSpeed's logger and log_dist, RepeatingLoader, the stage-3 leaf flags
(set_z3_leaf_modules and its kin),
recursive_getattr / recursive_setattr, OnDevice,
safe_get_full_* / safe_set_full_* and the zero_to_fp32 helpers."""
from __future__ import annotations

from ..runtime.dataloader import RepeatingLoader
from . import groups, zero_to_fp32
from .init_on_device import OnDevice
from .logging import log_dist, log_dist_once, logger, print_dist
from .module_utils import recursive_getattr, recursive_setattr
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad,
                              safe_get_full_optimizer_state, safe_get_local_fp32_param,
                              safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_grad,
                              safe_set_full_optimizer_state, safe_set_local_fp32_param,
                              safe_set_local_grad, safe_set_local_optimizer_state,
                              safe_update_full_grad_vectorized)
from .z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules,
                             set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix,
                             unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter)

__all__ = ["RepeatingLoader", "OnDevice", "log_dist", "log_dist_once", "logger", "print_dist",
           "recursive_getattr", "recursive_setattr",
           "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state",
           "safe_update_full_grad_vectorized",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules",
           "set_z3_leaf_module", "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix",
           "z3_leaf_module", "z3_leaf_parameter", "groups", "zero_to_fp32"]
