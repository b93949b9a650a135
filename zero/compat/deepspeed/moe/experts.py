"""`deepspeed.moe.experts`: a layer's local experts (zero/moe/layer.py)."""
from zero.moe.layer import Experts

__all__ = ["Experts"]
