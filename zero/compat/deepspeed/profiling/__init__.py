"""`deepspeed.profiling`: the FLOPs profiler (zero.profiling)."""
from . import flops_profiler

__all__ = ["flops_profiler"]
