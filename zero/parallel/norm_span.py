"""One gradient norm for a model split over pipeline stages and tensor ranks.

Each rank's engine holds one part of the model, so its own norm misses the others' and
counts some parameters more than once: a parameter tensor parallelism leaves whole (a norm, a
row-parallel bias) has the same gradient on each of the t tensor ranks, and a weight tied over
k stages (TiedLayerSpec) the same summed gradient on each of them. The engine weighs each
parameter's squared gradient by 1/t and 1/k for those, and sums the weighted squares over the
model-parallel group (every rank of one replica) as well as the data-parallel group, so every
part clips by the whole model's norm (torch.nn.utils.clip_grad_norm_ of the unsplit model,
DeepSpeed's clip over its mpu) and skips a non-finite step together.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class NormSpan:
    """The model-parallel group, and the weight of each parameter not counted once."""
    group: object  # torch.distributed ProcessGroup
    weights: dict[int, float] = field(default_factory=dict)  # id(param) -> weight

    def weight(self, param: torch.Tensor) -> float:
        return self.weights.get(id(param), 1.0)


def norm_span(grid, module: nn.Module) -> NormSpan | None:
    """None for a model held whole by every rank; else the span of `grid`'s model-parallel
    group with `module`'s weights (its tied weights from PipelineModule.tied_weights())."""
    if grid is None or grid.get_model_parallel_world_size() == 1:
        return None
    tied = getattr(module, "tied_weights", None)
    weights = norm_weights(module.parameters(), grid.get_tensor_model_parallel_world_size(),
                           lambda p: getattr(p, "tensor_model_parallel", False),
                           {id(p): k for p, k in (tied() if tied is not None else [])})
    return NormSpan(grid.get_model_parallel_group(), weights)


def norm_weights(params, tensor: int, is_split, tied: dict[int, int]) -> dict[int, float]:
    """{id(param): weight} of the parameters not counted once: 1/tensor for one `is_split`
    says is whole on each of `tensor` ranks, divided by k for a weight tied over k stages
    (`tied`: id -> k). The memory estimate uses it too, before AutoTP splits anything."""
    weights: dict[int, float] = {}
    if tensor > 1:
        for param in params:
            if not is_split(param):
                weights[id(param)] = 1.0 / tensor
    for param_id, stages in tied.items():
        weights[param_id] = weights.get(param_id, 1.0) / stages
    return weights


def by_weight(params: list, weight) -> list[list]:
    """`params` in runs of one weight(param) (any hashable key), in the order each first
    appears: the engine groups of one optimizer group (sharding.shard_groups)."""
    parts: dict[float, list] = {}
    for param in params:
        parts.setdefault(weight(param), []).append(param)
    return list(parts.values())
