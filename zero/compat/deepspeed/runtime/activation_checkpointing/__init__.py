"""`deepspeed.runtime.activation_checkpointing`: where DeepSpeed keeps `checkpointing`."""
from . import checkpointing

__all__ = ["checkpointing"]
