"""DeepSpeed's pipeline topologies (`deepspeed.runtime.pipe.topology`), the way a script
passes pipeline x tensor x data sizes to `PipelineModule(topology=...)`:

    PipeDataParallelTopology(num_pp, num_dp)               axes pipe, data
    PipeModelDataParallelTopology(num_pp, num_mp, num_dp)  axes pipe, data, model (tensor)

Each is a DeviceMesh (mesh.py: the same rank order, tensor fastest) with DeepSpeed's
accessors by axis name ("model" is the tensor axis).
"""
from __future__ import annotations

from collections import namedtuple

from .mesh import DeviceMesh


class ProcessTopology:
    """A mesh with DeepSpeed's axis-name accessors."""

    def __init__(self, axes: list[str], dims: list[int]):
        sizes = dict(zip(axes, dims))
        if list(axes) not in (["pipe", "data"], ["pipe", "data", "model"]):
            raise ValueError(f"zero: topology axes {list(axes)} are not built; the mesh lays "
                             "ranks out as ['pipe', 'data'] or ['pipe', 'data', 'model'] (tensor "
                             "fastest), DeepSpeed's PipeDataParallelTopology and "
                             "PipeModelDataParallelTopology")
        self.axes, self.dims = list(axes), list(dims)
        world = 1
        for dim in dims:
            world *= dim
        self.mesh = DeviceMesh.build(world, pipe=sizes.get("pipe", 1),
                                     data=sizes.get("data", 1), tensor=sizes.get("model", 1))
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)

    def _value(self, coord, axis: str) -> int:
        return {"pipe": coord.pipe, "data": coord.data, "model": coord.tensor}[axis]

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else 1

    def get_axis_names(self) -> list[str]:
        return list(self.axes)

    def world_size(self) -> int:
        return self.mesh.world_size

    def get_rank(self, **coord) -> int:
        if sorted(coord) != sorted(self.axes):
            raise ValueError(f"zero: get_rank needs every axis {self.axes}, got {sorted(coord)}")
        return self.mesh.rank(coord.get("pipe", 0), coord.get("data", 0), coord.get("model", 0))

    def get_coord(self, rank: int):
        coord = self.mesh.coord(rank)
        return self.ProcessCoord(**{axis: self._value(coord, axis) for axis in self.axes})

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """The rank lists that vary only along `axis` (DeepSpeed's process groups by axis)."""
        if axis not in self.axes:
            return []
        return {"pipe": self.mesh.pipeline_partition, "data": self.mesh.data_parallel_partition,
                "model": self.mesh.tensor_parallel_partition}[axis]()


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])
