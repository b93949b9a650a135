"""What a ZeroEngine does differently when it shards over a data-parallel sub-group (a
pipeline stage's ranks) instead of the world: the model starts from the group's first
rank's values, and the parts not built for a sub-group yet are refused up front."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .. import init as zero_init
from .. import model_dtype


def is_world(group) -> bool:
    return group is dist.group.WORLD or \
        dist.get_process_group_ranks(group) == list(range(dist.get_world_size()))


def first_rank(group) -> int:
    """The global rank broadcasts within `group` come from (its lowest)."""
    return min(dist.get_process_group_ranks(group))


def check_supported(stage: int, model: nn.Module) -> None:
    if stage == 3:
        raise NotImplementedError(
            "zero: ZeRO stage 3 inside a pipeline stage (a data-parallel sub-group) is not "
            "built: set zero_optimization.stage to 0, 1 or 2 with pipeline parallelism")
    if any(zero_init.is_partitioned(p) for p in model.parameters()):
        raise NotImplementedError(
            "zero: a model built under zero.Init with a data-parallel sub-group: zero.Init "
            "partitions over the world; build the pipeline stage without zero.Init")


def check_whole_model_save(whole_world: bool, what: str) -> None:
    if not whole_world:
        raise NotImplementedError(
            f"zero: {what} with a data-parallel sub-group (pipeline or tensor parallelism) is "
            "not built: each rank holds only its stage / slice. Use engine.save_checkpoint "
            "(each part saves its own files), then zero_to_fp32.py or "
            "get_fp32_state_dict_from_zero_checkpoint for the whole model's weights")


def equalize_unsplit(model: nn.Module, device: torch.device, dtype: torch.dtype,
                     buffer_dtype: torch.dtype | None, tensor_group) -> None:
    """The parameters and buffers a tensor-parallel layer does not split (norms, row-parallel
    biases) take the tensor group's first rank's values, in the engine's dtypes
    (model_dtype.cast), so they start equal on the tensor ranks (their gradients are equal
    there, so they stay equal). The engine then broadcasts everything over the data group
    (sharding.prepare_model)."""
    model.to(device=device)
    model_dtype.cast(model, dtype, buffer_dtype)
    src = first_rank(tensor_group)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if not getattr(tensor, "tensor_model_parallel", False):
                dist.broadcast(tensor.data, src=src, group=tensor_group)
