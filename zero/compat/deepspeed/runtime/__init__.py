"""`deepspeed.runtime`: the engine class, the parsed config, the LR schedules, the pipeline's
topologies, ZeRO's stage-3 helpers, RepeatingLoader and see_memory_usage."""
from . import (activation_checkpointing, config, dataloader, engine, lr_schedules, pipe,
               sequence_parallel, utils, zero)

__all__ = ["activation_checkpointing", "config", "dataloader", "engine", "lr_schedules", "pipe",
           "sequence_parallel", "utils", "zero"]
