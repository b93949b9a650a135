"""The estimate of a model split over pipeline stages and tensor ranks (zero.parallel's mesh,
pipe x data x tensor): each rank holds one part of the model, a pipeline stage's layers with
each split linear cut to its tensor slice, and shards that part's states over the part's
data-parallel ranks. So each part is estimated as a model of its own with N = the
data-parallel size; the ranks of one stage hold equal shapes whatever their tensor rank.

The parts come from the engine's own rules: the stage cuts of zero.pipe (stage_cuts, the same
partition_method) and the slices of zero.tp's AutoTP (local_shapes). What a hand-built
zero.tp layer splits (a VocabParallelEmbedding) is not seen: the estimate counts it whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import EstimateError
from .shapes import ModelShapes, shapes_from_module


@dataclass(frozen=True)
class MeshSizes:
    """pipe x data x tensor = the world size."""
    pipe: int
    data: int
    tensor: int

    @staticmethod
    def of(world_size: int, pipe: int, tensor: int) -> "MeshSizes":
        from zero.parallel import DeviceMesh

        try:
            mesh = DeviceMesh.build(world_size, pipe=pipe, tensor=tensor)
        except ValueError as error:
            raise EstimateError(str(error).removeprefix("zero: ")) from None
        return MeshSizes(mesh.pipe, mesh.data, mesh.tensor)

    def to_dict(self) -> dict:
        return {"pipe": self.pipe, "data": self.data, "tensor": self.tensor}


@dataclass(frozen=True)
class MeshPart:
    """One pipeline stage's shapes as each of its tensor ranks holds them, in the engine's
    groups (one per gradient-norm weight, parallel/norm_span.py), and the ZeRO stages the
    engine builds for it (0-2; not 2 when a layer is tied across stages)."""
    stage: int
    layers: tuple[int, int]  # [first, stop) of the layer list; (0, 0) without pipeline stages
    shapes: ModelShapes
    zero_stages: tuple[int, ...] = (0, 1, 2)


def tensor_slice(module: nn.Module, tensor: int, description: str,
                 tied: dict[int, int] | None = None) -> ModelShapes:
    """`module`'s shapes on one of `tensor` ranks after AutoTP (whole when tensor is 1, or
    when AutoTP finds nothing to split in it), grouped as the engine groups them: by
    gradient-norm weight, 1/tensor for a parameter left whole, 1/k for a weight tied over k
    stages (`tied`: id(param) -> k)."""
    local = _local_shapes(module, tensor)
    if local:
        description = f"{description}, tensor slice 1/{tensor} (AutoTP)"
    from zero.parallel.norm_span import by_weight, norm_weights

    trainable = [p for p in module.parameters() if p.requires_grad]  # each once
    weights = norm_weights(trainable, tensor, lambda p: id(p) in local or
                           getattr(p, "tensor_model_parallel", False), tied or {})
    return shapes_from_module(module, description=description, local_shape=local,
                              param_groups=by_weight(trainable,
                                                     lambda p: weights.get(id(p), 1.0)))


def _local_shapes(module: nn.Module, tensor: int) -> dict:
    if tensor == 1:
        return {}
    from zero.tp.auto_tp import local_shapes
    from zero.tp.split import TensorParallelSplitError

    try:
        return local_shapes(module, tensor)
    except TensorParallelSplitError as error:
        raise EstimateError(str(error).removeprefix("zero: ")) from None


def mesh_parts(model, sizes: MeshSizes, partition_method: str, description: str
               ) -> list[MeshPart]:
    """Every stage's part. `model`: an nn.Module (one stage), or with pipeline stages the
    PipelineModule's layer list (LayerSpecs, TiedLayerSpecs, modules) or an nn.Sequential,
    whose children are the layers."""
    tied: list[dict[int, int]] = [{}] * sizes.pipe
    if sizes.pipe == 1:
        if not isinstance(model, nn.Module):
            model = _stage_module(list(model), 0, len(model))
        modules, cuts = [model], [0, 0]
    else:
        cuts = _cuts(model, sizes, partition_method)
        layers = _layers(model)
        modules = [_stage_module(layers, cuts[s], cuts[s + 1]) for s in range(sizes.pipe)]
        tied = [_tied_weights(layers, cuts, s, module) for s, module in enumerate(modules)]
    zero_stages = (0, 1) if any(tied) else (0, 1, 2)
    if sizes.tensor > 1 and not any(_local_shapes(m, sizes.tensor) for m in modules):
        raise EstimateError(f"--tensor-parallel {sizes.tensor}: AutoTP finds no attention or MLP "
                            f"block to split in {description} (as the engine would refuse it)")
    parts = []
    for stage, module in enumerate(modules):
        start, stop = cuts[stage], cuts[stage + 1]
        where = f", stage {stage} (layers {start}-{stop - 1})" if sizes.pipe > 1 else ""
        if not any(p.requires_grad for p in module.parameters()):
            raise EstimateError(f"pipeline stage {stage} (layers {start}-{stop - 1}) has no "
                                "trainable parameter; use fewer --pipeline-stages")
        parts.append(MeshPart(stage, (start, stop), tensor_slice(
            module, sizes.tensor, description + where, tied[stage]), zero_stages))
    return parts


def _tied_weights(layers: list, cuts: list[int], stage: int, module: nn.Module) -> dict[int, int]:
    """id(weight) -> the number of stages holding it, for each weight of a TiedLayerSpec
    used on several stages and built on `stage` (PipelineModule.tied_weights)."""
    from zero.pipe.module import TiedLayerSpec
    from zero.pipe.module import dotted_attr, tied_stages

    stages = tied_stages(layers, cuts)
    specs = {layer.key: layer for layer in reversed(layers) if isinstance(layer, TiedLayerSpec)}
    return {id(dotted_attr(tied_module, attr)): len(stages[key])
            for key, tied_module in module.tied_modules.items() if len(stages[key]) > 1
            for attr in specs[key].tied_weight_attr}


def _layers(model) -> list:
    layers = list(model.children()) if isinstance(model, nn.Sequential) else model
    if not isinstance(layers, (list, tuple)):
        raise EstimateError(
            "pipeline stages need the model as a list of layers: make --model return the "
            "PipelineModule's `layers` list (or an nn.Sequential); "
            f"{type(model).__name__} cannot be cut into stages")
    return list(layers)


def _cuts(model, sizes: MeshSizes, partition_method: str) -> list[int]:
    from zero.pipe.module import stage_cuts

    try:
        with torch.device("meta"):
            return stage_cuts(_layers(model), sizes.pipe, partition_method)
    except NotImplementedError as error:
        raise EstimateError(str(error).removeprefix("zero: ")) from None


def _stage_module(layers: list, start: int, stop: int) -> nn.Module:
    """Layers [start, stop) built on the meta device as one module, named as a
    PipelineModule names them."""
    from zero.pipe.module import build_stage

    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        built = build_stage(layers, start, stop)
    module = nn.Module()
    module.tied_modules = nn.ModuleDict(built.tied)
    for index, layer in built.owned:
        module.add_module(str(index), layer)
    return module
