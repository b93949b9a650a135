"""`deepspeed.runtime.zero.partition_parameters`: the names transformers touches around
zero.Init, and ZeroParamStatus (what a stage-3 parameter's `ds_status` is; zero/ds_param.py).
DeepSpeed's Init wraps torch's tensor constructors, and transformers swaps the wrapper
(`zero_wrapper_for_fp_tensor_constructor`) to keep torch.arange's dtype; zero.Init wraps no
constructor, so the wrapper is the identity and the swap changes nothing."""
import torch

from zero.compat.deepspeed.accelerator import get_accelerator
from zero.ds_param import ZeroParamStatus
from zero.init import Init
from zero.stage3 import GatheredParameters

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None):
    return fn


__all__ = ["Init", "GatheredParameters", "ZeroParamStatus", "get_accelerator",
           "zero_wrapper_for_fp_tensor_constructor"]
