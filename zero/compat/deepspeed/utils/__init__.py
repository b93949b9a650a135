"""`deepspeed.utils`: DeepSpeed's logger and log_dist, RepeatingLoader, set_z3_leaf_modules and
the zero_to_fp32 helpers."""
from __future__ import annotations

from zero.stage3 import set_z3_leaf_modules

from ..runtime.dataloader import RepeatingLoader
from . import zero_to_fp32
from .logging import log_dist, log_dist_once, logger, print_dist

__all__ = ["RepeatingLoader", "log_dist", "log_dist_once", "logger", "print_dist",
           "set_z3_leaf_modules", "zero_to_fp32"]
