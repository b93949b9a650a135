"""PipelineModule, LayerSpec and TiedLayerSpec: DeepSpeed's `deepspeed.pipe` surface.

A PipelineModule is given the whole model as a list of layers (LayerSpec, TiedLayerSpec,
nn.Module instances or plain callables), cuts it into `num_stages` stages
(partition.py), and builds only this rank's stage: a LayerSpec elsewhere is never
constructed (only counted on the meta device when partition_method is "parameters").

Tied layers (TiedLayerSpec with the same key, e.g. the token embedding and the output
projection) are built on every stage that uses them; the weights named by
`tied_weight_attr` start equal (broadcast from the lowest stage) and stay equal because
their gradients are summed over those stages before the optimizer step
(`allreduce_tied_weight_gradients`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from ..parallel import DeviceMesh
from ..parallel.grid import grid_for, new_groups
from ..parallel.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                 ProcessTopology)
from .partition import partition_layers


class LayerSpec:
    """A layer to build later: `typename(*module_args, **module_kwargs)`."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError(f"zero: LayerSpec only supports torch.nn.Module types, got "
                               f"{typename!r}")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self, log: bool = False) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer shared by several places of the pipeline under `key`. `forward_fn(module, x)`,
    when given, is what this place runs (e.g. the embedding's weight as the output head);
    `tied_weight_attr` names the tied parameters (a name or a list; dotted names reach into
    submodules)."""

    def __init__(self, key, typename, *module_args, forward_fn=None,
                 tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) \
            else list(tied_weight_attr)


@dataclass
class TiedComm:
    """One tied key on this rank: the stages that hold it, this rank's group over them
    (None when only one stage holds it), the built module and its tied weight names."""
    stages: list[int]
    ranks: list[int]
    group: object
    module: nn.Module
    weight_attr: list[str]


class PipelineModule(nn.Module):
    """This rank's stage of a model given as a list of layers. Collective to build (the
    mesh's process groups and the tied-weight groups)."""

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False,
                 seed_fn=None, base_seed=1234, partition_method="parameters",
                 activation_checkpoint_interval=0, activation_checkpoint_func=None,
                 checkpointable_layers=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("zero: PipelineModule needs torch.distributed; call "
                               "zero.init_distributed() (deepspeed.init_distributed()) first")
        self.mesh = _mesh(num_stages, topology)
        num_stages = self.mesh.pipe
        self._topology = topology if isinstance(topology, ProcessTopology) else \
            (PipeDataParallelTopology(self.mesh.pipe, self.mesh.data) if self.mesh.tensor == 1
             else PipeModelDataParallelTopology(self.mesh.pipe, self.mesh.tensor, self.mesh.data))
        self._layer_specs = list(layers)
        self.num_stages = num_stages
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or functools.partial(
            torch_checkpoint, use_reentrant=False)
        self.checkpointable_layers = checkpointable_layers
        self._grid = grid_for(pipe=self.mesh.pipe, tensor=self.mesh.tensor)
        self.stage_id = self._grid.stage_id
        # only "parameters" needs the counts (each LayerSpec built on the meta device)
        self.parts = stage_cuts(self._layer_specs, num_stages, partition_method)
        self._local_start = self.parts[self.stage_id]
        self._local_stop = self.parts[self.stage_id + 1]
        self.tied_modules = nn.ModuleDict()
        self.forward_funcs: list = []
        self._build()
        self.tied_comms = self._index_tied_modules()
        self._synchronize_tied_weights()

    # ---- construction ------------------------------------------------------------------------
    def _build(self) -> None:
        seed = None
        if self.seed_layers:
            seed = lambda index: (self.seed_fn or torch.manual_seed)(self.base_seed + index)
        built = build_stage(self._layer_specs, self._local_start, self._local_stop, seed)
        for index, module in built.owned:
            self.add_module(str(index), module)
        for key, module in built.tied.items():
            self.tied_modules[key] = module
        self.forward_funcs.extend(built.forward_funcs)

    def _index_tied_modules(self) -> dict[str, TiedComm]:
        """Creates (on every rank, in key order) the group of each tied key per pipeline."""
        comms = {}
        for key, stages in tied_stages(self._layer_specs, self.parts).items():
            group = None
            if len(stages) > 1:
                partition = [[self.mesh.rank(s, d, t) for s in stages]
                             for d in range(self.mesh.data) for t in range(self.mesh.tensor)]
                group = new_groups(partition, self._grid.global_rank)
            if key in self.tied_modules:
                spec = next(s for s in self._layer_specs
                            if isinstance(s, TiedLayerSpec) and s.key == key)
                ranks = [self._grid.stage_to_global(s) for s in stages]
                comms[key] = TiedComm(stages, ranks, group, self.tied_modules[key],
                                      spec.tied_weight_attr)
        return comms

    def _shared_tied_weights(self):
        """(weight, its TiedComm) for every tied weight this rank shares with other stages."""
        for comm in self.tied_comms.values():
            if comm.group is not None:
                for attr in comm.weight_attr:
                    yield dotted_attr(comm.module, attr), comm

    def _synchronize_tied_weights(self) -> None:
        for weight, comm in self._shared_tied_weights():
            with torch.no_grad():
                dist.broadcast(weight.data, src=min(comm.ranks), group=comm.group)

    # ---- DeepSpeed's surface -----------------------------------------------------------------
    def forward(self, forward_input):
        x = forward_input
        interval = self.activation_checkpoint_interval
        if interval <= 0 or not torch.is_grad_enabled():
            for func in self.forward_funcs:
                x = func(x)
            return x
        for start in range(0, len(self.forward_funcs), interval):
            chunk = self.forward_funcs[start:start + interval]
            x = self.activation_checkpoint_func(_run_chunk(chunk), x)
        return x

    def allreduce_tied_weight_gradients(self, grad_of=None) -> None:
        """Sums every tied weight's gradient over the stages that hold it. `grad_of(weight)`:
        where the gradient is (the engine's fp32 buffer with fp32 accumulation, as DeepSpeed
        sums `_hp_grad`); default `weight.grad`."""
        for weight, comm in self._shared_tied_weights():
            grad = weight.grad if grad_of is None else grad_of(weight)
            if grad is not None:
                dist.all_reduce(grad, group=comm.group)

    def tied_weights(self) -> list[tuple[nn.Parameter, int]]:
        """(weight, number of stages holding it) for every tied weight shared by more than
        one stage on this rank (each such stage holds the same summed gradient)."""
        return [(weight, len(comm.stages)) for weight, comm in self._shared_tied_weights()]

    def ties_across_stages(self) -> bool:
        """Whether a tied key is used on more than one stage (from the layer list: the same
        answer on every rank, whichever stage it builds)."""
        return any(len(used) > 1 for used in tied_stages(self._layer_specs, self.parts).values())

    def topology(self) -> ProcessTopology:
        """DeepSpeed's: the ProcessTopology (get_dim, get_coord, get_rank, ...)."""
        return self._topology

    def mpu(self):
        return self._grid

    def num_pipeline_stages(self) -> int:
        return self.num_stages


def _mesh(num_stages, topology) -> DeviceMesh:
    """The mesh of num_stages x the rest of the world, or of a DeepSpeed topology
    (PipeModelDataParallelTopology: pipeline x tensor x data) or a DeviceMesh; ValueError
    naming the sizes when they disagree with each other or the world."""
    world = dist.get_world_size()
    if topology is None:
        if num_stages is None:
            raise ValueError("zero: PipelineModule needs num_stages (or topology=)")
        return DeviceMesh.build(world, pipe=num_stages)
    mesh = topology.mesh if isinstance(topology, ProcessTopology) else topology
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"zero: PipelineModule(topology=...) takes a PipeDataParallelTopology, "
                        f"PipeModelDataParallelTopology or DeviceMesh, got "
                        f"{type(topology).__name__}")
    if num_stages is not None and num_stages != mesh.pipe:
        raise ValueError(f"zero: PipelineModule num_stages = {num_stages} but the topology has "
                         f"{mesh.pipe} pipeline stages; pass one of them")
    if mesh.world_size != world:
        raise ValueError(f"zero: the topology pipe {mesh.pipe} x data {mesh.data} x tensor "
                         f"{mesh.tensor} = {mesh.world_size} ranks, but the world size is "
                         f"{world}; choose sizes whose product is {world}")
    return mesh


def _run_chunk(funcs):
    def run(x):
        for func in funcs:
            x = func(x)
        return x
    return run


def tied_stages(layers: list, parts: list[int]) -> dict[str, list[int]]:
    """Each TiedLayerSpec key and the stages (in order) whose layers use it, for the cut
    `parts` (stage s holds layers parts[s] .. parts[s+1]-1)."""
    keys: dict[str, list[int]] = {}
    for index, layer in enumerate(layers):
        if isinstance(layer, TiedLayerSpec):
            stage = next(s for s in range(len(parts) - 1) if parts[s] <= index < parts[s + 1])
            stages = keys.setdefault(layer.key, [])
            if stage not in stages:
                stages.append(stage)
    return keys


def dotted_attr(module: nn.Module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


@dataclass
class StageLayers:
    """The layers of one stage, built: `owned` (index, module) pairs, the tied modules by key
    (one per key however many places use it), and the stage's forward functions in order."""
    owned: list
    tied: dict
    forward_funcs: list


def build_stage(layers: list, start: int, stop: int, seed=None) -> StageLayers:
    """Builds layers[start:stop] (under the caller's default device: meta to count them);
    `seed(index)`, when given, runs before each layer is built."""
    built = StageLayers([], {}, [])
    for index in range(start, stop):
        layer = layers[index]
        if seed is not None:
            seed(index)
        if isinstance(layer, TiedLayerSpec):
            if layer.key not in built.tied:
                built.tied[layer.key] = layer.build()
            module = built.tied[layer.key]
            built.forward_funcs.append(module if layer.forward_fn is None
                                       else functools.partial(layer.forward_fn, module))
        elif isinstance(layer, (LayerSpec, nn.Module)):
            module = layer.build() if isinstance(layer, LayerSpec) else layer
            built.owned.append((index, module))
            built.forward_funcs.append(module)
        elif callable(layer):
            built.forward_funcs.append(layer)
        else:
            raise TypeError(f"zero: layer {index} of the PipelineModule is {layer!r}; give "
                            "LayerSpec, TiedLayerSpec, nn.Module or a callable")
    return built


def stage_cuts(layers: list, num_stages: int, partition_method: str) -> list[int]:
    """Where `partition_method` cuts `layers` into `num_stages` (partition.py's parts); only
    "parameters" builds the LayerSpecs, on the meta device, to count them."""
    counts = [_trainable_count(s) if str(partition_method).lower() == "parameters" else 0
              for s in layers]
    return partition_layers(partition_method, counts, [_class_name(s) for s in layers],
                            num_stages)


def _trainable_count(layer) -> int:
    """Trainable parameters of a layer; a LayerSpec is built on the meta device to count."""
    if isinstance(layer, LayerSpec):
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            layer = layer.build()
    if isinstance(layer, nn.Module):
        return sum(p.numel() for p in layer.parameters() if p.requires_grad)
    return 0


def _class_name(layer) -> str:
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    return type(layer).__name__
