"""Tensor parallelism (Megatron-style layers, DeepSpeed's AutoTP) composed with ZeRO over the
data-parallel ranks (docs/PARALLELISM.md): comm.py (the autograd functions in and out of a
tensor-parallel region), split.py (slicing weights; the error for sizes that do not divide),
linear.py (ColumnParallelLinear, RowParallelLinear), embedding.py (VocabParallelEmbedding),
cross_entropy.py (vocab_parallel_cross_entropy), auto_tp.py (the automatic pass), setup.py
(what initialize() does with tensor_parallel.autotp_size)."""
from .auto_tp import auto_tp
from .comm import (copy_to_tensor_parallel, gather_from_tensor_parallel,
                   reduce_from_tensor_parallel, scatter_to_tensor_parallel)
from .cross_entropy import vocab_parallel_cross_entropy
from .embedding import VocabParallelEmbedding
from .linear import ColumnParallelLinear, RowParallelLinear, column_parallel_linear
from .setup import tp_model_init
from .split import TensorParallelSplitError, is_split

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "column_parallel_linear", "auto_tp", "tp_model_init",
           "TensorParallelSplitError", "is_split", "copy_to_tensor_parallel",
           "reduce_from_tensor_parallel", "gather_from_tensor_parallel",
           "scatter_to_tensor_parallel"]
