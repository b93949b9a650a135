"""`deepspeed.moe.sharded_moe`: the gate, the gating functions and MOELayer (zero/moe/)."""
from zero.moe.gating import multiplicative_jitter, top1gating, top2gating, topkgating
from zero.moe.layer import MOELayer, TopKGate, _AllToAll

__all__ = ["MOELayer", "TopKGate", "_AllToAll", "multiplicative_jitter", "top1gating",
           "top2gating", "topkgating"]
