"""Megatron's column- and row-parallel linear layers (DeepSpeed's LinearLayer and
LinearAllreduce). A pair of them, column then row, computes a whole `Linear -> act -> Linear`
with one all-reduce in forward (the row layer's output) and one in backward (the column
layer's input gradient).

ColumnParallelLinear: y = x A^T + b with A split by rows (output features): each rank
computes out_features / tensor of the outputs. `gather_output=True` all-gathers them so every
rank holds the whole y; otherwise y stays split (the input of a row-parallel layer).

RowParallelLinear: y = x A^T + b with A split by columns (input features): each rank
multiplies its slice of x (`input_is_parallel=True`: x arrives split, from a column layer)
and the partial outputs are summed with an all-reduce; the bias, replicated, is added once
after the sum.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import comm
from .split import check_divisible, mark_split, shard


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias, group,
                           gather_output: bool = False) -> torch.Tensor:
    """x (whole, the same on every tensor rank) times this rank's rows of the weight; the
    output split over the ranks unless gather_output. Also the tied output head of a
    vocabulary-parallel embedding (weight = the embedding's rows)."""
    y = F.linear(comm.copy_to_tensor_parallel(x, group), weight, bias)
    return comm.gather_from_tensor_parallel(y, group) if gather_output else y


class ColumnParallelLinear(nn.Module):
    """nn.Linear(in_features, out_features) whose output features are split over `group`
    (weight [out_features / tensor, in_features], bias [out_features / tensor])."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 gather_output: bool = False, device=None, dtype=None):
        super().__init__()
        self.group = group
        self.tensor_size, self.tensor_rank = comm.group_size(group), comm.group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        local = check_divisible(out_features, self.tensor_size, "out_features")
        self.weight = mark_split(nn.Parameter(torch.empty(local, in_features, device=device,
                                                          dtype=dtype)), 0)
        self.bias = mark_split(nn.Parameter(torch.zeros(local, device=device, dtype=dtype)),
                               0) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, gather_output: bool = False,
                    fused: int = 1, name: str = "linear") -> "ColumnParallelLinear":
        """This rank's rows of `linear` (a copy). `fused` > 1: the outputs are `fused` equal
        blocks (a fused q/k/v projection), each split on its own."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group,
                    gather_output, device="meta")
        what = f"{name}.out_features"
        with torch.no_grad():
            layer.weight = mark_split(nn.Parameter(shard(
                linear.weight, 0, layer.tensor_rank, layer.tensor_size, what, fused),
                requires_grad=linear.weight.requires_grad), 0, fused)
            if linear.bias is not None:
                layer.bias = mark_split(nn.Parameter(shard(
                    linear.bias, 0, layer.tensor_rank, layer.tensor_size, what, fused),
                    requires_grad=linear.bias.requires_grad), 0, fused)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel_linear(x, self.weight, self.bias, self.group, self.gather_output)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(/{self.tensor_size}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """nn.Linear(in_features, out_features) whose input features are split over `group`
    (weight [out_features, in_features / tensor]); the bias [out_features] is replicated."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 input_is_parallel: bool = True, device=None, dtype=None):
        super().__init__()
        self.group = group
        self.tensor_size, self.tensor_rank = comm.group_size(group), comm.group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        local = check_divisible(in_features, self.tensor_size, "in_features")
        self.weight = mark_split(nn.Parameter(torch.empty(out_features, local, device=device,
                                                          dtype=dtype)), 1)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) \
            if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, input_is_parallel: bool = True,
                    name: str = "linear") -> "RowParallelLinear":
        """This rank's columns of `linear` (a copy) and its whole bias."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group,
                    input_is_parallel, device="meta")
        with torch.no_grad():
            layer.weight = mark_split(nn.Parameter(shard(
                linear.weight, 1, layer.tensor_rank, layer.tensor_size,
                f"{name}.in_features"), requires_grad=linear.weight.requires_grad), 1)
            if linear.bias is not None:
                layer.bias = nn.Parameter(linear.bias.detach().clone(),
                                          requires_grad=linear.bias.requires_grad)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = comm.scatter_to_tensor_parallel(x, self.group)
        y = comm.reduce_from_tensor_parallel(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (/{self.tensor_size}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")
