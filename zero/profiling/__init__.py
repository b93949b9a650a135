"""Profiling tools: DeepSpeed's FLOPs profiler, counting with torch.utils.flop_counter."""
from .flops_profiler import FlopsProfiler, ModuleProfile, get_model_profile

__all__ = ["FlopsProfiler", "ModuleProfile", "get_model_profile"]
