"""`deepspeed.runtime`: the engine class, the LR schedules, the pipeline's topologies and
ZeRO's stage-3 helpers."""
from . import activation_checkpointing, engine, lr_schedules, pipe, zero

__all__ = ["activation_checkpointing", "engine", "lr_schedules", "pipe", "zero"]
