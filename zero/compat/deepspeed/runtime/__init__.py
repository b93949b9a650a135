"""`deepspeed.runtime`: the engine class, the LR schedules and ZeRO's stage-3 helpers."""
from . import engine, lr_schedules, zero

__all__ = ["engine", "lr_schedules", "zero"]
