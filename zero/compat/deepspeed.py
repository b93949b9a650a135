"""`import zero.compat.deepspeed as deepspeed`: DeepSpeed's names, backed by zero.

zero.GatheredParameters works on an engine's parameters (stage 3 gathers them; other stages
need nothing). zero.Init and register_external_parameter exist and raise a clear error until
they are built.
"""
from __future__ import annotations

import types

import torch.distributed as _dist

from zero.api import add_config_arguments, init_distributed, initialize
from zero.engine import ZeroEngine as DeepSpeedEngine
from zero.stage3 import GatheredParameters

__all__ = ["initialize", "init_distributed", "add_config_arguments", "zero", "comm",
           "DeepSpeedEngine"]


class _NeedsStage3:
    """Placeholder for a ZeRO-3 API not built yet: calling it explains what is missing."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"deepspeed.zero.{self._name} needs ZeRO stage 3 features zero does not support yet; "
            "construct the model normally and pass it to initialize() (stage 3 partitions it)")


zero = types.SimpleNamespace(
    Init=_NeedsStage3("Init"),
    GatheredParameters=GatheredParameters,
    register_external_parameter=_NeedsStage3("register_external_parameter"),
)

comm = types.SimpleNamespace(
    init_distributed=init_distributed,
    get_rank=_dist.get_rank,
    get_world_size=_dist.get_world_size,
    get_local_rank=lambda: int(__import__("os").environ.get("LOCAL_RANK", "0")),
    barrier=_dist.barrier,
    all_reduce=_dist.all_reduce,
    broadcast=_dist.broadcast,
    all_gather=_dist.all_gather,
    is_initialized=_dist.is_initialized,
    ReduceOp=_dist.ReduceOp,
)
