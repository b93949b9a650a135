"""`deepspeed.runtime.activation_checkpointing.checkpointing` (= `deepspeed.checkpointing`)."""
from zero.activation_checkpointing import (checkpoint, configure, detach_variable,
                                           is_configured, model_parallel_cuda_manual_seed,
                                           model_parallel_reconfigure_tp_seed,
                                           non_reentrant_checkpoint,
                                           partition_activations_in_checkpoint, reset,
                                           set_num_layers)
from zero.rng_tracker import RngStatesTracker as CudaRNGStatesTracker
from zero.rng_tracker import get_cuda_rng_tracker

__all__ = ["checkpoint", "non_reentrant_checkpoint", "detach_variable", "configure",
           "is_configured", "reset", "partition_activations_in_checkpoint", "set_num_layers",
           "CudaRNGStatesTracker", "get_cuda_rng_tracker", "model_parallel_cuda_manual_seed",
           "model_parallel_reconfigure_tp_seed"]
