"""Megatron's vocabulary-parallel embedding: the rows of the table (the vocabulary) split
over the tensor-parallel ranks, rank r holding tokens [r * V / t, (r + 1) * V / t). Each rank
looks up the tokens it holds, writes zeros for the others, and an all-reduce sums the ranks'
results into the whole embedding. Its weight can serve as the tied output head:
`column_parallel_linear(x, embedding.weight, None, embedding.group)` gives this rank's slice
of the logits, the input of `vocab_parallel_cross_entropy`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import comm
from .split import check_divisible, mark_split, shard


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding(num_embeddings, embedding_dim) with its rows split over `group`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, group=None,
                 device=None, dtype=None):
        super().__init__()
        self.group = group
        self.tensor_size, self.tensor_rank = comm.group_size(group), comm.group_rank(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        local = check_divisible(num_embeddings, self.tensor_size, "num_embeddings (vocabulary)")
        self.vocab_start, self.vocab_end = self.tensor_rank * local, (self.tensor_rank + 1) * local
        self.weight = mark_split(nn.Parameter(torch.empty(local, embedding_dim, device=device,
                                                          dtype=dtype)), 0)
        nn.init.normal_(self.weight)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group,
                       name: str = "embedding") -> "VocabParallelEmbedding":
        """This rank's rows of `embedding` (a copy). max_norm and sparse are refused."""
        if embedding.max_norm is not None or embedding.sparse:
            raise ValueError(f"zero: {name} uses max_norm={embedding.max_norm} / "
                             f"sparse={embedding.sparse}, which VocabParallelEmbedding does not "
                             "build; use max_norm=None and sparse=False")
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx,
                    group, device="meta")
        layer.weight = mark_split(nn.Parameter(
            shard(embedding.weight, 0, layer.tensor_rank, layer.tensor_size,
                  f"{name}.num_embeddings (vocabulary)"),
            requires_grad=embedding.weight.requires_grad), 0)
        return layer

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_end)
        local = (tokens - self.vocab_start).masked_fill(outside, 0)
        padding = None
        if self.padding_idx is not None and self.vocab_start <= self.padding_idx < self.vocab_end:
            padding = self.padding_idx - self.vocab_start  # its row gets no gradient, as in torch
        found = F.embedding(local, self.weight, padding_idx=padding)
        found = found.masked_fill(outside.unsqueeze(-1), 0.0)
        return comm.reduce_from_tensor_parallel(found, self.group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings} (rows {self.vocab_start}:{self.vocab_end} here), "
                f"{self.embedding_dim}")
