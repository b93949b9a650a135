"""`deepspeed.runtime.pipe.topology`: pipeline x data x model (tensor) layouts for
PipelineModule(topology=...), and the grid (zero.parallel)."""
from zero.parallel.grid import PipelineParallelGrid
from zero.parallel.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                    ProcessTopology)

__all__ = ["PipeDataParallelTopology", "PipeModelDataParallelTopology", "PipelineParallelGrid",
           "ProcessTopology"]
