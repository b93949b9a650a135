"""The Python side of offload: what the C++ memory manager is asked for (offload/options.py)
and the swap files' lifetime (offload/swap_files.py). The host pools, the chunked CPU step,
the copy worker and the NVMe I/O are C++ (csrc/adapter/offloaded_state.h,
param_swap.h, csrc/core/)."""
from .options import OFFLOAD_TILE, offload_options, param_offload_options, pinning_warning
from .swap_files import remove_at_exit

__all__ = ["OFFLOAD_TILE", "offload_options", "param_offload_options", "pinning_warning",
           "remove_at_exit"]
