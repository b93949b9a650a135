"""Checkpoints of a model split over pipeline stages or tensor ranks: which part of the model
a rank saves and loads, and what the part records so that the parts fit together again.

Every rank of a model-parallel part (one pipeline stage's tensor slice: DeepSpeed's
model-parallel rank, stage-major) holds the same layers and shards their states over its
data-parallel group. So each part is a checkpoint of its own inside the tag's directory,
under DeepSpeed's names (checkpoint_files.PartNames): the part's first data-parallel rank
writes `mp_rank_XX_model_states.pt` (its module, counters, layout, the mesh), and each rank
its shard `zero_pp_rank_<d>_mp_rank_XX_optim_states.pt`. One manifest covers every part.

A part loads into the same pipeline stages and tensor size at any data-parallel size (the
shards are resharded as for a plain checkpoint); into another pipeline or tensor layout (or
the whole model) through checkpoint_remesh.py, which joins the parts into whole arrays and
cuts this rank's part from them. `tensor_split` records how each split parameter's slices
make the whole one (dim, fused blocks, HF Conv1D transposition): `join_slices` and
`cut_slice` are the two directions, shared with the fp32 export.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint_files import WHOLE, PartNames
from .parallel import data_group


@dataclass(frozen=True)
class Part:
    """What one rank saves: its part's file names, its rank among the part's data-parallel
    ranks, and the mesh (None without pipeline or tensor parallelism)."""
    names: PartNames
    data_rank: int
    mesh: dict | None

    @property
    def writes_model(self) -> bool:
        """Whether this rank writes the part's model file (its first data-parallel rank)."""
        return self.data_rank == 0


def part_of(engine) -> Part:
    """The part `engine`'s rank holds. An engine sharding over a data-parallel sub-group
    without a grid (ZeroEngine(data_parallel_group=...) built by hand) cannot say which part
    it is: refused, naming the fix."""
    grid = getattr(engine, "grid", None)
    data_rank = dist.get_rank(engine.data_parallel_group)
    if grid is None or grid.get_model_parallel_world_size() == 1:
        if not data_group.is_world(engine.data_parallel_group):
            raise NotImplementedError(
                "zero: checkpoints of an engine built with a data_parallel_group of its own "
                "need the mesh to name its part: build it through zero.initialize (pipeline "
                "stages or tensor_parallel.autotp_size), or save each rank's "
                "engine.module_state_dict() yourself")
        return Part(WHOLE, data_rank, None)
    return Part(PartNames(grid.get_model_parallel_rank()), data_rank, grid.describe())


def same_layout(saved: dict | None, current: dict | None) -> bool:
    """Whether a checkpoint's pipeline stages and tensor size are this engine's (then each
    part loads its own files; the data-parallel size may differ)."""
    def shape(mesh):
        return (1, 1) if mesh is None else (mesh["pipe"], mesh["tensor"])

    return shape(saved) == shape(current)


def join_slices(slices: list[torch.Tensor], split: dict) -> torch.Tensor:
    """The whole parameter from the tensor ranks' slices, in the unsplit model's form:
    concatenated along the split dimension (a fused layer's blocks each on their own), an HF
    Conv1D's weight transposed back to [in, out]."""
    dim, fused = split["dim"], split["fused"]
    blocks = [piece.chunk(fused, dim=dim) for piece in slices]
    whole = torch.cat([torch.cat([b[i] for b in blocks], dim=dim) for i in range(fused)], dim=dim)
    return whole.t().contiguous() if split["transposed"] else whole


def check_parts(path: str, mp_ranks: list[int], pipe: int, tensor: int) -> None:
    """A checkpoint saved with `pipe` x `tensor` parts must have the model files of parts 0
    to pipe x tensor - 1; CorruptCheckpoint naming what is there otherwise."""
    if mp_ranks != list(range(pipe * tensor)):
        from .checkpoint_files import CorruptCheckpoint

        raise CorruptCheckpoint(
            f"zero: checkpoint {path} was saved with {pipe} pipeline stage(s) x tensor size "
            f"{tensor}, so it needs the model files of parts 0 to {pipe * tensor - 1}, but has "
            f"those of parts {mp_ranks}; copy the missing parts back")


def join_parts(per_part: list[dict], splits: list[dict], pipe: int, tensor: int, join) -> dict:
    """name -> the whole model's value from each part's {name: value} (parts in
    model-parallel rank order, stage-major): stage by stage, a name an earlier stage has
    keeps that stage's value (a tied layer); a name its stage's tensor ranks split
    (`splits`: each part's tensor_split) is `join(their values, split)`, the others tensor
    rank 0's value."""
    whole: dict = {}
    for stage in range(pipe):
        slices = per_part[stage * tensor:(stage + 1) * tensor]
        split = splits[stage * tensor]
        for name, value in slices[0].items():
            if name not in whole:
                whole[name] = join([s[name] for s in slices], split[name]) \
                    if name in split else value
    return whole


def whole_parameters(module: nn.Module, tensor_group, exclude_frozen: bool = False):
    """The whole model's parameters ({name: CPU tensor}, tied names each listed) on global
    rank 0, None on the others: each slice a tensor rank holds all-gathered over
    `tensor_group` and joined as the unsplit model holds it. Collective over the group."""
    split = tensor_split(module)
    size = dist.get_world_size(tensor_group)
    whole = {} if dist.get_rank() == 0 else None
    for name, param in module.named_parameters(remove_duplicate=False):
        value = param.detach()
        if name in split:
            slices = [torch.empty_like(value) for _ in range(size)]
            dist.all_gather(slices, value.contiguous(), group=tensor_group)
            value = join_slices(slices, split[name])
        if whole is not None and (param.requires_grad or not exclude_frozen):
            whole[name] = value.cpu().clone()
    return whole


def cut_slice(whole: torch.Tensor, param: torch.Tensor | None, tensor_rank: int) -> torch.Tensor:
    """`param`'s part of the whole (unsplit model's) value: itself unless `param` is a slice
    a tensor-parallel layer holds (join_slices' inverse for this rank)."""
    if param is None or not getattr(param, "tensor_model_parallel", False):
        return whole
    from .tp.split import shard

    if getattr(param, "partition_transposed", False):
        whole = whole.t()
    dim = param.partition_dim
    size = whole.shape[dim] // param.shape[dim]
    return shard(whole, dim, tensor_rank, size, "a checkpoint's parameter",
                 getattr(param, "partition_fused", 1))


def tensor_split(module: nn.Module) -> dict[str, dict]:
    """{name: {"dim", "fused", "transposed"}} for every name of every parameter a tensor
    rank holds a slice of (zero.tp.split's marks)."""
    split = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if getattr(param, "tensor_model_parallel", False):
            split[name] = {"dim": param.partition_dim,
                           "fused": getattr(param, "partition_fused", 1),
                           "transposed": getattr(param, "partition_transposed", False)}
    return split
