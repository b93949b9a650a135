"""`deepspeed.comm`: the torch.distributed calls DeepSpeed scripts and Accelerate make through
DeepSpeed's comm module (init_distributed creates torch's default process group)."""
from __future__ import annotations

import os

from torch.distributed import (ReduceOp, all_gather, all_reduce, barrier, broadcast,
                               get_rank, get_world_size, is_initialized)

from zero.distributed import init_distributed
from zero.engine import live_engines


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None,
              debug=None) -> None:
    """DeepSpeed's switch for the comms logger, applied to the live engines (a new engine takes
    its config's comms_logger block). deepspeed_config is accepted and not read: zero's engines
    read that block when they are built."""
    for engine in live_engines():
        engine.watch.configure_comms(enabled=enabled, prof_all=prof_all, prof_ops=prof_ops,
                                     verbose=verbose, debug=debug)


def log_summary(show_straggler: bool = False, return_dict: bool = False):
    """DeepSpeed's summary of the collectives logged so far (comms_logger), printed on rank 0;
    every rank calls it. With several live engines logging, each one's table in turn."""
    barrier()
    results = [engine.watch.log_comms(True, show_straggler, return_dict)
               for engine in live_engines() if engine.watch.comms.enabled]
    if return_dict:
        return results[-1] if results else None
    return None


__all__ = ["configure", "log_summary", "init_distributed", "get_rank", "get_world_size", "get_local_rank", "barrier",
           "all_reduce", "broadcast", "all_gather", "is_initialized", "ReduceOp"]
