"""`deepspeed.runtime.lr_schedules`: DeepSpeed's schedule classes (zero/schedulers.py) and
VALID_LR_SCHEDULES, which Accelerate reads on every prepare() to tell a DeepSpeed schedule
from a torch one."""
from zero.schedulers import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]

__all__ = ["VALID_LR_SCHEDULES", "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
           "WarmupCosineLR"]
