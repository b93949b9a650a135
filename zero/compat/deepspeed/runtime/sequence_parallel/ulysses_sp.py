"""`deepspeed.runtime.sequence_parallel.ulysses_sp`: Ulysses for Hugging Face models (DeepSpeed's
ALST), as the Trainer and Accelerate call it with `ParallelismConfig(sp_backend="deepspeed")`:
`UlyssesSPAttentionHF.register_with_transformers(...)` returns the mpu (parallel_state_sp)
for `deepspeed.initialize(mpu=...)`, and `UlyssesSPDataLoaderAdapter` cuts the batches.
zero/parallel/ulysses_hf.py holds the attention and the loader; tiled_compute.py the tiling
(TiledMLP, SequenceTiledCompute, TiledFusedLogitsLoss)."""
from __future__ import annotations

import logging

from zero.parallel.tiled_compute import (SequenceTiledCompute, TiledFusedLogitsLoss, TiledMLP,
                                         sequence_tiled_compute)
from zero.parallel.ulysses_hf import SequenceShardingLoader, UlyssesAttention, check, install

from . import parallel_state_sp

logger = logging.getLogger("zero")


class UlyssesSPAttentionHF(UlyssesAttention):
    """DeepSpeed's class: the attention (zero.parallel.ulysses_hf.UlyssesAttention) and its
    registration with transformers."""

    @classmethod
    def register_with_transformers(cls, model_name_or_path, core_attn_implementation,
                                   sequence_parallel_size, micro_batch_size, seq_length=None,
                                   seq_length_is_variable=True, disable_in_eval=False,
                                   max_length=None):
        """Creates the sequence groups of `sequence_parallel_size` ranks, puts Ulysses in
        transformers' attention table under `core_attn_implementation` (sized from the model,
        or from the config of a model name or path) and returns the mpu for
        deepspeed.initialize; None when the size is 1 (DeepSpeed's arguments and checks)."""
        if sequence_parallel_size == 1:
            return None
        if max_length is not None:
            logger.warning("The 'max_length` argument is deprecated and will be eventually "
                           "removed, please use `seq_length` instead")
            seq_length = seq_length if seq_length is not None else max_length
        text_config = check(model_name_or_path, core_attn_implementation,
                            sequence_parallel_size, seq_length, seq_length_is_variable)
        parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size)
        install(text_config, core_attn_implementation,
                parallel_state_sp.get_sequence_parallel_group(), micro_batch_size, seq_length,
                seq_length_is_variable, disable_in_eval, cls=cls)
        return parallel_state_sp


UlyssesSPDataLoaderAdapter = SequenceShardingLoader

__all__ = ["UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter", "SequenceTiledCompute",
           "TiledFusedLogitsLoss", "TiledMLP", "sequence_tiled_compute"]
