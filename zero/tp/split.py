"""Slicing a whole weight into this rank's part, and the error for a size that does not
divide. Parameters a layer splits carry `tensor_model_parallel = True` and `partition_dim`
(Megatron's attributes; `partition_fused` too for a fused q/k/v or gate/up layer);
parameters without it are replicated on every tensor rank."""
from __future__ import annotations

import torch
from torch import nn


class TensorParallelSplitError(ValueError):
    """A dimension that cannot be split evenly over the tensor-parallel ranks."""


def check_divisible(size: int, parts: int, what: str) -> int:
    """size / parts; raises TensorParallelSplitError naming `what` and the fix otherwise."""
    if size % parts:
        raise TensorParallelSplitError(
            f"zero: cannot split {what} = {size} over {parts} tensor-parallel ranks: {size} is "
            f"not divisible by {parts}; choose a tensor_parallel.autotp_size that divides "
            f"{size}, or leave this layer unsplit")
    return size // parts


def shard(tensor: torch.Tensor, dim: int, rank: int, parts: int, what: str,
          fused: int = 1) -> torch.Tensor:
    """This rank's slice of `tensor` along `dim` (a copy). `fused` > 1: the dimension holds
    `fused` equal blocks (q, k, v of a fused projection), each split on its own, and the
    rank's slices of the blocks are concatenated in order."""
    block = check_divisible(tensor.shape[dim], fused, what)
    check_divisible(block, parts, what + (f" / {fused} (one block of the fused layer)"
                                          if fused > 1 else ""))
    pieces = [part.chunk(parts, dim=dim)[rank] for part in tensor.split(block, dim=dim)]
    return torch.cat(pieces, dim=dim).detach().clone()


def mark_split(param: nn.Parameter, dim: int, fused: int = 1) -> nn.Parameter:
    """Marks `param` as this rank's slice along `dim`; `fused` > 1: of each of that many
    equal blocks (what `shard` cut). Checkpoints record the marks to put the slices back
    together (zero.checkpoint_mesh)."""
    param.tensor_model_parallel = True
    param.partition_dim = dim
    param.partition_fused = fused
    return param


def is_split(param: torch.Tensor) -> bool:
    """True for a parameter a tensor-parallel layer holds a slice of."""
    return bool(getattr(param, "tensor_model_parallel", False))
