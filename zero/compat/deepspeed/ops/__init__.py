"""`deepspeed.ops`: the optimizer classes that name DeepSpeed's CPU and fused kernels."""
from . import adagrad, adam, lion

__all__ = ["adagrad", "adam", "lion"]
