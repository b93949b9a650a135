"""`deepspeed.runtime`: the engine class, the LR schedules and ZeRO's stage-3 helpers."""
from . import activation_checkpointing, engine, lr_schedules, zero

__all__ = ["activation_checkpointing", "engine", "lr_schedules", "zero"]
