"""`deepspeed.sequence`: DeepSpeed-Ulysses' attention (`layer.DistributedAttention`)."""
from . import layer

__all__ = ["layer"]
