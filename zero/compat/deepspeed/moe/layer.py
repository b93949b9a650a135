"""`deepspeed.moe.layer`: the MoE layer (zero/moe/layer.py)."""
from zero.moe.layer import MoE

__all__ = ["MoE"]
