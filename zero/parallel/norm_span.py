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
    weights: dict[int, float] = {}
    tensor = grid.get_tensor_model_parallel_world_size()
    if tensor > 1:
        for param in module.parameters():
            if not getattr(param, "tensor_model_parallel", False):
                weights[id(param)] = 1.0 / tensor
    tied = getattr(module, "tied_weights", None)
    for param, stages in (tied() if tied is not None else []):
        weights[id(param)] = weights.get(id(param), 1.0) / stages
    return NormSpan(grid.get_model_parallel_group(), weights)
