"""Sequence parallelism (DeepSpeed-Ulysses): the ranks that split one sample's sequence.

`sequence_parallel_size` s cuts the world into groups of s consecutive ranks, as DeepSpeed's
mesh ("data_parallel", "sequence_parallel") and its `parallel_state_sp` lay them out:

    world 4, sequence 2:   sequence groups 0, 1 | 2, 3;   replicas (data ranks) 0 | 1

The ranks of one sequence group read the same samples, each holding 1/s of every sequence;
their attention layers trade sequence for heads with all-to-alls (ulysses.py). ZeRO shards
over every rank (DeepSpeed's "sequence data parallel" group) and averages the gradients over
every rank, as DeepSpeed's ZeRO-3 does: exact when each rank's loss is its piece's mean
(equal pieces) or the sequence's loss gathered over the group as the Hugging Face Trainer
computes it (each rank's backward then carries s times its share). DeepSpeed's stages 0-2
divide by w / s instead (s times that gradient). The batch keys count the w / s replicas.

`ActiveGroups` keeps the layout DeepSpeed's module-level accessors answer for
(`deepspeed.utils.groups`, `parallel_state_sp`); the engine takes its own copy.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch.distributed as dist

from .grid import new_groups

KEY = "sequence_parallel_size"
_MPU_METHODS = ("get_sequence_parallel_group", "get_sequence_parallel_rank",
                "get_sequence_parallel_world_size", "get_sequence_data_parallel_group")


class SequenceParallelError(ValueError):
    """The sequence-parallel layout asked for cannot be built for this run."""


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place: its sequence group (`size` ranks, this one at `rank`), and which of
    the `data_size` replicas that group is (`data_rank`)."""
    size: int
    rank: int
    group: object  # torch.distributed ProcessGroup
    data_size: int
    data_rank: int

    @property
    def data_group(self):
        """ZeRO's ranks: every rank (DeepSpeed's sequence data parallel group)."""
        return dist.group.WORLD


def requested_size(raw: dict) -> int:
    """The config's size before validation (the batch keys count w / s replicas): the value
    when it is a positive int, else 1 (the schema then names what is wrong)."""
    size = raw.get(KEY) if isinstance(raw, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1


def planned_size(raw: dict, mpu, mesh_param=None) -> int:
    """The sequence group size this run asks for: a sequence-parallel mpu's, else
    initialize's `mesh_param` (DeepSpeed's (data, sequence) mesh shape), else the config's;
    two sources that disagree are refused."""
    asked = requested_size(raw)
    if is_sequence_mpu(mpu):
        size, source = mpu.get_sequence_parallel_world_size(), "the mpu's sequence groups have"
    elif mesh_param is not None:
        size, source = _mesh_size(mesh_param), "mesh_param asks for"
    else:
        return asked
    if asked > 1 and asked != size:
        raise SequenceParallelError(
            f"zero.initialize: the config's {KEY} is {asked} but {source} {size} ranks; set "
            f"{KEY} to {size} or leave it out")
    return size


def _mesh_size(mesh_param) -> int:
    """The sequence size of DeepSpeed's mesh_param (data, sequence), checked against the
    world."""
    world = dist.get_world_size()
    if (not isinstance(mesh_param, (tuple, list)) or len(mesh_param) != 2 or
            not all(isinstance(n, int) and n > 0 for n in mesh_param) or
            mesh_param[0] * mesh_param[1] != world):
        raise SequenceParallelError(
            f"zero.initialize: mesh_param={mesh_param!r} must be (data_parallel_size, "
            f"sequence_parallel_size), two positive ints whose product is the world size "
            f"{world}")
    return mesh_param[1]


def check_alone(size: int, *, pipeline: bool, mpu: bool, tensor: int) -> None:
    """Sequence parallelism beside pipeline stages, a model-parallel mpu or tensor
    parallelism is not built: refused naming both."""
    if size <= 1:
        return
    other = ("pipeline stages (a PipelineModule)" if pipeline else
             "an mpu's model parallelism" if mpu else
             f"tensor parallelism (size {tensor})" if tensor > 1 else None)
    if other is not None:
        raise SequenceParallelError(
            f"zero: {KEY} = {size} with {other} is not built; sequence parallelism runs "
            "beside ZeRO data parallelism alone")


def replicas(world_size: int, size: int) -> int:
    """w / s; SequenceParallelError naming both when s does not divide w."""
    if world_size % size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise SequenceParallelError(
            f"zero: {KEY} = {size} does not divide the world size {world_size}; each sequence "
            f"group is {size} consecutive ranks: use one of {divisors}")
    return world_size // size


def build(size: int) -> SequenceParallel:
    """Creates the sequence groups of consecutive ranks (collective: every rank, same size)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    count = replicas(world, size)
    partition = [list(range(i * size, (i + 1) * size)) for i in range(count)]
    group = new_groups(partition, rank)
    return SequenceParallel(size=size, rank=rank % size, group=group, data_size=count,
                            data_rank=rank // size)


def is_sequence_mpu(mpu) -> bool:
    """Whether `mpu` brings sequence groups: DeepSpeed's parallel_state_sp (which Ulysses'
    register_with_transformers returns; DeepSpeed tests for `initialize_sequence_parallel`),
    or a Megatron-DeepSpeed mpu whose get_sequence_parallel_world_size() is above 1 (its
    sequence data parallel group must then be the world: from_mpu refuses tensor or pipeline
    parallelism beside it rather than leave the sequence ranks' gradients apart)."""
    if mpu is None:
        return False
    if hasattr(mpu, "initialize_sequence_parallel"):
        return True
    size = getattr(mpu, "get_sequence_parallel_world_size", None)
    return callable(size) and size() > 1


def from_mpu(mpu) -> SequenceParallel:
    """The layout an sp mpu answers for (read once, nothing created); its sequence data
    parallel group must be the world (pipeline or tensor parallelism beside it is not built)."""
    missing = [name for name in _MPU_METHODS if not callable(getattr(mpu, name, None))]
    if missing:
        name = getattr(mpu, "__name__", type(mpu).__name__)
        raise SequenceParallelError(
            f"zero.initialize: the sequence-parallel mpu ({name}) has no {missing}; "
            "DeepSpeed's parallel_state_sp answers them once initialize_sequence_parallel(size) "
            "has run")
    seq_data = dist.get_process_group_ranks(mpu.get_sequence_data_parallel_group())
    if seq_data != list(range(dist.get_world_size())):
        raise SequenceParallelError(
            f"zero.initialize: the mpu's sequence data parallel group is ranks {seq_data}, not "
            "the world; sequence parallelism beside pipeline or tensor parallelism is not built")
    group = mpu.get_sequence_parallel_group()
    size = mpu.get_sequence_parallel_world_size()
    ranks = dist.get_process_group_ranks(group)
    start = ranks[0]
    if ranks != list(range(start, start + size)) or start % size:
        raise SequenceParallelError(
            f"zero.initialize: the mpu's sequence group is ranks {ranks}; zero lays sequence "
            f"groups out as DeepSpeed does, {size} consecutive ranks from a multiple of {size}")
    return SequenceParallel(size=size, rank=mpu.get_sequence_parallel_rank(), group=group,
                            data_size=replicas(dist.get_world_size(), size),
                            data_rank=start // size)


def reduction_config(config):
    """`config` with the gradients reduced in `seq_parallel_communication_data_type`, as
    DeepSpeed's engine does under sequence parallelism (it then ignores
    communication_data_type: a different value there is refused)."""
    dtype = config.seq_parallel_communication_data_type
    given = config.communication_data_type
    if given is not None and given != dtype:
        raise SequenceParallelError(
            f"zero: communication_data_type = {given!r}, but with sequence parallelism the "
            f"gradients are reduced in seq_parallel_communication_data_type ({dtype!r}), as in "
            f"DeepSpeed, which ignores communication_data_type then: set "
            f"seq_parallel_communication_data_type to {given!r} and leave "
            "communication_data_type out")
    return dataclasses.replace(config, communication_data_type=dtype)


class ActiveGroups:
    """The layout DeepSpeed's module-level accessors answer for: the last one built or read
    by `initialize` or `parallel_state_sp.initialize_sequence_parallel` in this process."""
    current: SequenceParallel | None = None

    @classmethod
    def set(cls, layout: SequenceParallel | None) -> None:
        cls.current = layout

    @classmethod
    def get(cls) -> SequenceParallel | None:
        return cls.current
