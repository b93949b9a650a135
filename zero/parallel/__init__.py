"""Model parallelism's layout: the device mesh (mesh.py) and its process groups with
DeepSpeed's PipelineParallelGrid accessors (grid.py), DeepSpeed's topology classes
(topology.py); sequence parallelism's groups (sequence.py), exchange (ulysses.py), its
Hugging Face attention and loader (ulysses_hf.py) and ALST's tiling (tiled_compute.py).
docs/PARALLELISM.md."""
from .grid import PipelineParallelGrid
from .mesh import Coord, DeviceMesh
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ["DeviceMesh", "Coord", "PipelineParallelGrid", "PipeDataParallelTopology",
           "PipeModelDataParallelTopology", "ProcessTopology"]
