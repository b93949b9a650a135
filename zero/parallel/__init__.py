"""Model parallelism's layout: the device mesh (mesh.py) and its process groups with
DeepSpeed's PipelineParallelGrid accessors (grid.py). docs/PARALLELISM.md."""
from .grid import PipelineParallelGrid
from .mesh import Coord, DeviceMesh

__all__ = ["DeviceMesh", "Coord", "PipelineParallelGrid"]
