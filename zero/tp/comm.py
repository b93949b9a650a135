"""The autograd functions that move activations in and out of a tensor-parallel region
(Megatron's mappings). Each takes the tensor-parallel process group explicitly.

    copy_to_tensor_parallel      forward: identity          backward: all-reduce (sum)
    reduce_from_tensor_parallel  forward: all-reduce (sum)  backward: identity
    gather_from_tensor_parallel  forward: all-gather of the last dimension (rank order)
                                 backward: this rank's slice of the gradient
    scatter_to_tensor_parallel   forward: this rank's slice of the last dimension
                                 backward: all-gather

A column-parallel layer starts with copy_to (every rank reads the whole input; the input's
gradient is the sum of each slice's contribution), a row-parallel layer ends with
reduce_from (each rank holds a partial sum of the output). With one rank all four are
identities.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def group_size(group) -> int:
    return dist.get_world_size(group)


def group_rank(group) -> int:
    return dist.get_rank(group)


def _all_reduce(tensor: torch.Tensor, group) -> torch.Tensor:
    if group_size(group) == 1:
        return tensor
    tensor = tensor.contiguous()
    dist.all_reduce(tensor, group=group)
    return tensor


def _gather_last(tensor: torch.Tensor, group) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _slice_last(tensor: torch.Tensor, group) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return tensor
    if tensor.shape[-1] % size:
        raise ValueError(f"zero: the last dimension {tensor.shape[-1]} does not divide by the "
                         f"tensor-parallel size {size}")
    return tensor.chunk(size, dim=-1)[group_rank(group)].contiguous()


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.group), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _gather_last(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _slice_last(grad, ctx.group), None


class _ScatterToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _slice_last(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


def copy_to_tensor_parallel(tensor: torch.Tensor, group) -> torch.Tensor:
    return _CopyToTensorParallel.apply(tensor, group)


def reduce_from_tensor_parallel(tensor: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromTensorParallel.apply(tensor, group)


def gather_from_tensor_parallel(tensor: torch.Tensor, group) -> torch.Tensor:
    return _GatherFromTensorParallel.apply(tensor, group)


def scatter_to_tensor_parallel(tensor: torch.Tensor, group) -> torch.Tensor:
    return _ScatterToTensorParallel.apply(tensor, group)
