"""`deepspeed.runtime.activation_checkpointing.checkpointing` (= `deepspeed.checkpointing`)."""
from zero.activation_checkpointing import (checkpoint, configure, is_configured,
                                           partition_activations_in_checkpoint, reset,
                                           set_num_layers)

__all__ = ["checkpoint", "configure", "is_configured", "reset",
           "partition_activations_in_checkpoint", "set_num_layers"]
