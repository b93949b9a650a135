"""Pipeline parallelism with DeepSpeed's `deepspeed.pipe` surface, composed with ZeRO inside
each stage (docs/PARALLELISM.md): module.py (PipelineModule, LayerSpec, TiedLayerSpec),
partition.py (where the stages are cut), schedule.py (1F1B and GPipe instruction lists),
p2p.py (activations between stages), engine.py (PipelineEngine)."""
from .module import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "PipelineEngine"]


def __getattr__(name):  # the engine needs zero._C; the module surface does not
    if name == "PipelineEngine":
        from .engine import PipelineEngine
        return PipelineEngine
    raise AttributeError(name)
