"""`deepspeed.profiling.flops_profiler`: FlopsProfiler and get_model_profile, zero's
(zero/profiling: counts from torch.utils.flop_counter)."""
from zero.profiling import FlopsProfiler, get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
