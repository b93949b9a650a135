"""`deepspeed.comm`: the torch.distributed calls DeepSpeed scripts and Accelerate make through
DeepSpeed's comm module (init_distributed creates torch's default process group)."""
from __future__ import annotations

import os

from torch.distributed import (ReduceOp, all_gather, all_reduce, barrier, broadcast,
                               get_rank, get_world_size, is_initialized)

from zero.distributed import init_distributed


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


__all__ = ["init_distributed", "get_rank", "get_world_size", "get_local_rank", "barrier",
           "all_reduce", "broadcast", "all_gather", "is_initialized", "ReduceOp"]
