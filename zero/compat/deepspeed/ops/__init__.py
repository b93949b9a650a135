"""`deepspeed.ops`: the optimizer classes that name DeepSpeed's CPU and fused kernels."""
from . import adam

__all__ = ["adam"]
