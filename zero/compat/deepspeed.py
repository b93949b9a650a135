"""`import zero.compat.deepspeed as deepspeed`: DeepSpeed's names, backed by zero.

deepspeed.zero.Init, GatheredParameters and register_external_parameter are zero's own
(zero/init.py, zero/stage3.py).
"""
from __future__ import annotations

import types

import torch.distributed as _dist

from zero.api import add_config_arguments, init_distributed, initialize
from zero.compat import accelerator
from zero.engine import ZeroEngine as DeepSpeedEngine
from zero.init import Init
from zero.checkpoint_export import (convert_zero_checkpoint_to_fp32_state_dict,
                                    get_fp32_state_dict_from_zero_checkpoint,
                                    load_state_dict_from_zero_checkpoint)
from zero.stage3 import (GatheredParameters, register_external_parameter, set_z3_leaf_modules,
                         unregister_external_parameter)

__all__ = ["initialize", "init_distributed", "add_config_arguments", "zero", "comm", "utils",
           "accelerator", "DeepSpeedEngine"]


zero = types.SimpleNamespace(
    Init=Init,
    GatheredParameters=GatheredParameters,
    register_external_parameter=register_external_parameter,
    unregister_external_parameter=unregister_external_parameter,
)

utils = types.SimpleNamespace(
    set_z3_leaf_modules=set_z3_leaf_modules,
    zero_to_fp32=types.SimpleNamespace(  # deepspeed.utils.zero_to_fp32 (attribute access)
        get_fp32_state_dict_from_zero_checkpoint=get_fp32_state_dict_from_zero_checkpoint,
        convert_zero_checkpoint_to_fp32_state_dict=convert_zero_checkpoint_to_fp32_state_dict,
        load_state_dict_from_zero_checkpoint=load_state_dict_from_zero_checkpoint))

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
