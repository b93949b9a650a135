"""deepspeed.pipe: PipelineModule, LayerSpec, TiedLayerSpec (zero.pipe)."""
from zero.pipe import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec"]
