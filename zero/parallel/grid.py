"""The process groups of a mesh and DeepSpeed's `PipelineParallelGrid` accessors.

Every rank creates every group in the same order (torch.distributed.new_group is collective
over the world) and keeps the ones it belongs to:

  - its data-parallel group: the ranks with its pipeline stage and tensor slice (ZeRO shards
    over these);
  - its pipe-parallel group: the ranks of its pipeline, one per stage (the loss is broadcast
    over it; activations go point to point between neighbours of it, `prev_stage_rank` and
    `next_stage_rank`, on the world group);
  - its tensor-parallel group: the ranks that split the same layers' weights (DeepSpeed's
    "slice" group; zero.tp's layers all-reduce over it);
  - its model-parallel group: every rank of its model replica (pipe x tensor), DeepSpeed's
    `get_model_parallel_*`.

`grid_for(...)` returns the one grid of a mesh in this process, so that a model converted
with the tensor group before `initialize` and the engine use the same groups.
"""
from __future__ import annotations

import torch.distributed as dist

from .mesh import DeviceMesh


def new_groups(partition: list[list[int]], rank: int):
    """Creates every group of `partition` on every rank, in order; returns this rank's."""
    mine = None
    for ranks in partition:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


class PipelineParallelGrid:
    """DeepSpeed's grid over a (pipe, data, tensor) mesh. Collective to build."""

    def __init__(self, mesh: DeviceMesh, rank: int | None = None):
        self.mesh = mesh
        self.global_rank = dist.get_rank() if rank is None else rank
        self.world_size = mesh.world_size
        coord = mesh.coord(self.global_rank)
        self.stage_id, self.data_parallel_id = coord.pipe, coord.data
        self.tensor_parallel_id = coord.tensor
        self.pipe_parallel_size, self.data_parallel_size = mesh.pipe, mesh.data
        self.tensor_parallel_size = mesh.tensor
        self.is_first_stage = self.stage_id == 0          # attributes, as in DeepSpeed
        self.is_last_stage = self.stage_id == mesh.pipe - 1
        self.prev_stage_rank = None if self.is_first_stage else \
            self.stage_to_global(self.stage_id - 1)
        self.next_stage_rank = None if self.is_last_stage else \
            self.stage_to_global(self.stage_id + 1)
        self.dp_group = mesh.data_parallel_ranks(self.stage_id, coord.tensor)
        self.pp_group = mesh.pipeline_ranks(self.data_parallel_id, coord.tensor)
        self.tp_group = mesh.tensor_parallel_ranks(self.stage_id, self.data_parallel_id)
        self.mp_group = mesh.model_parallel_ranks(self.data_parallel_id)
        self.dp_proc_group = new_groups(mesh.data_parallel_partition(), self.global_rank)
        self.pp_proc_group = new_groups(mesh.pipeline_partition(), self.global_rank)
        self.tp_proc_group = new_groups(mesh.tensor_parallel_partition(), self.global_rank)
        self.mp_proc_group = (self.pp_proc_group if mesh.tensor == 1 else
                              self.tp_proc_group if mesh.pipe == 1 else
                              new_groups(mesh.model_parallel_partition(), self.global_rank))

    # ---- DeepSpeed's accessors -------------------------------------------------------------
    def get_stage_id(self) -> int:
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    # Megatron's current spelling of the tensor slice, and DeepSpeed's "slice" spelling.
    def get_tensor_model_parallel_rank(self) -> int:
        return self.tensor_parallel_id

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tensor_parallel_size

    def get_tensor_model_parallel_group(self):
        return self.tp_proc_group

    get_slice_parallel_rank = get_tensor_model_parallel_rank
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    get_slice_parallel_group = get_tensor_model_parallel_group

    # DeepSpeed's model-parallel group: every kind of model parallelism of one replica
    # (pipe x tensor); with pipe 1 it is the tensor group, with tensor 1 the pipeline.
    def get_model_parallel_rank(self) -> int:
        return self.mp_group.index(self.global_rank)

    def get_model_parallel_world_size(self) -> int:
        return len(self.mp_group)

    def get_model_parallel_group(self):
        return self.mp_proc_group

    def describe(self) -> dict:
        """The mesh's sizes and this rank's coordinate (memory reports, checkpoints)."""
        return {"pipe": self.pipe_parallel_size, "data": self.data_parallel_size,
                "tensor": self.tensor_parallel_size, "stage": self.stage_id,
                "data_rank": self.data_parallel_id, "tensor_rank": self.tensor_parallel_id}

    def stage_to_global(self, stage_id: int, **kwargs) -> int:
        """The global rank of `stage_id` with this rank's other coordinates; `data=` and
        `tensor=` (DeepSpeed's `model=`) pick others."""
        unknown = sorted(set(kwargs) - {"data", "tensor", "model"})
        if unknown:
            raise ValueError(f"zero: stage_to_global got unknown axes {unknown}; the mesh has "
                             "the axes pipe, data and tensor (DeepSpeed's model)")
        tensor = kwargs.get("tensor", kwargs.get("model", self.tensor_parallel_id))
        return self.mesh.rank(stage_id, kwargs.get("data", self.data_parallel_id), tensor)


_GRIDS: list = []  # [(mesh, the world group object, grid)]: the grid of this process group


def grid_for(pipe: int = 1, tensor: int = 1) -> PipelineParallelGrid:
    """This process's grid of the mesh (pipe, world / (pipe * tensor), tensor): built on the
    first call (collective over the world: every rank must call it with the same sizes),
    the same object afterwards. Raises ValueError naming the sizes when they do not divide
    the world size."""
    mesh = DeviceMesh.build(dist.get_world_size(), pipe=pipe, tensor=tensor)
    for known, world, grid in _GRIDS:
        if known == mesh and world is dist.group.WORLD:  # the same object: the same groups
            return grid
    _GRIDS.clear()  # a grid of an earlier process group is of no use
    _GRIDS.append((mesh, dist.group.WORLD, PipelineParallelGrid(mesh)))
    return _GRIDS[0][2]
