"""`deepspeed.runtime.pipe`: the pipeline module and its topologies (zero.pipe,
zero.parallel.topology)."""
from zero.pipe import LayerSpec, PipelineModule, TiedLayerSpec

from . import topology
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec", "topology",
           "PipeDataParallelTopology", "PipeModelDataParallelTopology", "ProcessTopology"]
