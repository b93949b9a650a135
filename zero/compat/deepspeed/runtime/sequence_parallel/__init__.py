"""`deepspeed.runtime.sequence_parallel`: the sequence groups (`parallel_state_sp`) and
Ulysses for Hugging Face models (`ulysses_sp`)."""
from . import parallel_state_sp, ulysses_sp

__all__ = ["parallel_state_sp", "ulysses_sp"]
