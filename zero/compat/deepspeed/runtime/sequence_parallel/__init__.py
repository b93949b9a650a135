"""`deepspeed.runtime.sequence_parallel`: the sequence groups (`parallel_state_sp`)."""
from . import parallel_state_sp

__all__ = ["parallel_state_sp"]
