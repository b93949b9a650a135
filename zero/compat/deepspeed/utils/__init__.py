"""`deepspeed.utils`: DeepSpeed's logger, set_z3_leaf_modules and the zero_to_fp32 helpers."""
from __future__ import annotations

import logging

from zero.stage3 import set_z3_leaf_modules

from . import zero_to_fp32

logger = logging.getLogger("DeepSpeed")  # DeepSpeed's logger name; HF sets its level

__all__ = ["logger", "set_z3_leaf_modules", "zero_to_fp32"]
