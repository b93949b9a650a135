"""`deepspeed.ops`: the optimizer classes that name DeepSpeed's CPU and fused kernels."""
from . import adagrad, adam, lamb, lion

__all__ = ["adagrad", "adam", "lamb", "lion"]
