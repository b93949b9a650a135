"""Model parallelism's layout: the device mesh (mesh.py) and its process groups with
DeepSpeed's PipelineParallelGrid accessors (grid.py), DeepSpeed's topology classes
(topology.py). docs/PARALLELISM.md."""
from .grid import PipelineParallelGrid
from .mesh import Coord, DeviceMesh
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ["DeviceMesh", "Coord", "PipelineParallelGrid", "PipeDataParallelTopology",
           "PipeModelDataParallelTopology", "ProcessTopology"]
