"""`deepspeed.moe`: DeepSpeed-MoE's layer, gate and helpers (zero/moe/)."""
from . import experts, layer, sharded_moe, utils

__all__ = ["experts", "layer", "sharded_moe", "utils"]
