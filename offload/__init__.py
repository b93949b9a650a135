"""The Python side of offload: what the C++ memory manager is asked for (offload/options.py:
the typed OffloadOptions and ParamOffloadOptions, the pinning warning) and what a user sees
while it works (offload/progress.py: the progress bar of NVMe swap-file writes at start-up and
checkpoint load; offload/timings.py: where the offloaded steps' time went, and backward's
copies into a host gradient shard). Swap files go with their engine (ZeroEngine.destroy(), or
at interpreter exit for engines still alive then). The host pools, the chunked CPU step, the
copy worker and the NVMe I/O are C++ (csrc/adapter/offloaded_state.h, offload_store.h,
param_swap.h, csrc/core/)."""
from .options import OFFLOAD_TILE, offload_options, param_offload_options, pinning_warning
from .progress import SwapWriteProgress
from .timings import backward_copy_timings, step_timings

__all__ = ["OFFLOAD_TILE", "SwapWriteProgress", "backward_copy_timings", "offload_options",
           "param_offload_options", "pinning_warning", "step_timings"]
