"""The device mesh: which global rank holds which (pipe, data, tensor) coordinate.

The layout is DeepSpeed's `PipeModelDataParallelTopology` order with the axes (pipe, data,
tensor): the tensor axis varies fastest, then data, then pipe. The ranks of one tensor group
are consecutive (on one node, where its all-reduces are cheapest), and with tensor = 1 the
layout is DeepSpeed's `PipeDataParallelTopology`:

    world 4, pipe 2, data 2:     stage 0 = ranks 0, 1      stage 1 = ranks 2, 3
                                  pipeline 0 = ranks 0, 2   pipeline 1 = ranks 1, 3
    world 4, data 2, tensor 2:   tensor groups 0, 1 | 2, 3;  data groups 0, 2 | 1, 3

A mesh is plain arithmetic (no process groups): `ProcessGrid` (grid.py) builds the
torch.distributed groups from it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coord:
    """Where one rank sits in the mesh."""
    pipe: int
    data: int
    tensor: int = 0


@dataclass(frozen=True)
class DeviceMesh:
    """world = pipe * data * tensor. Build it with `DeviceMesh.build`."""
    pipe: int
    data: int
    tensor: int = 1

    @staticmethod
    def build(world_size: int, pipe: int = 1, data: int | None = None,
              tensor: int = 1) -> "DeviceMesh":
        """The mesh of `world_size` ranks; `data` None means world_size / (pipe * tensor).
        Raises ValueError naming the sizes and the world size when they are not positive
        integers or do not multiply to the world size."""
        for name, value in (("world_size", world_size), ("pipe", pipe), ("tensor", tensor),
                            ("data", data)):
            if value is None and name == "data":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"zero: mesh size {name} = {value!r} must be a positive integer "
                                 f"(world size {world_size}, pipe {pipe}, data {data}, "
                                 f"tensor {tensor})")
        if data is None:
            if world_size % (pipe * tensor):
                raise ValueError(
                    f"zero: pipe {pipe} x tensor {tensor} does not divide the world size "
                    f"{world_size}; use pipeline stages and a tensor-parallel size whose "
                    f"product divides {world_size}")
            data = world_size // (pipe * tensor)
        if pipe * data * tensor != world_size:
            raise ValueError(
                f"zero: mesh pipe {pipe} x data {data} x tensor {tensor} = "
                f"{pipe * data * tensor} ranks, but the world size is {world_size}; choose sizes "
                f"whose product is {world_size}")
        return DeviceMesh(pipe=pipe, data=data, tensor=tensor)

    @property
    def world_size(self) -> int:
        return self.pipe * self.data * self.tensor

    def rank(self, pipe: int, data: int, tensor: int = 0) -> int:
        """The global rank at (pipe, data, tensor)."""
        if not (0 <= pipe < self.pipe and 0 <= data < self.data and 0 <= tensor < self.tensor):
            raise ValueError(f"zero: coordinate pipe={pipe}, data={data}, tensor={tensor} is "
                             f"outside the mesh (pipe {self.pipe} x data {self.data} x tensor "
                             f"{self.tensor})")
        return (pipe * self.data + data) * self.tensor + tensor

    def coord(self, rank: int) -> Coord:
        """The (pipe, data, tensor) coordinate of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"zero: rank {rank} is outside the mesh of {self.world_size} ranks")
        return Coord(pipe=rank // (self.data * self.tensor),
                     data=rank // self.tensor % self.data, tensor=rank % self.tensor)

    def data_parallel_ranks(self, stage: int, tensor: int = 0) -> list[int]:
        """The ranks that hold the same layers and the same tensor slice and split the batch."""
        return [self.rank(stage, d, tensor) for d in range(self.data)]

    def pipeline_ranks(self, data: int, tensor: int = 0) -> list[int]:
        """The ranks of one pipeline (one per stage, in stage order)."""
        return [self.rank(p, data, tensor) for p in range(self.pipe)]

    def tensor_parallel_ranks(self, stage: int, data: int) -> list[int]:
        """The ranks that split the same layers' weights (consecutive)."""
        return [self.rank(stage, data, t) for t in range(self.tensor)]

    def model_parallel_ranks(self, data: int) -> list[int]:
        """Every rank of one model replica (all stages, all tensor slices), in rank order."""
        return [self.rank(p, data, t) for p in range(self.pipe) for t in range(self.tensor)]

    def data_parallel_partition(self) -> list[list[int]]:
        return [self.data_parallel_ranks(p, t) for p in range(self.pipe)
                for t in range(self.tensor)]

    def pipeline_partition(self) -> list[list[int]]:
        return [self.pipeline_ranks(d, t) for d in range(self.data) for t in range(self.tensor)]

    def tensor_parallel_partition(self) -> list[list[int]]:
        return [self.tensor_parallel_ranks(p, d) for p in range(self.pipe)
                for d in range(self.data)]

    def model_parallel_partition(self) -> list[list[int]]:
        return [self.model_parallel_ranks(d) for d in range(self.data)]
