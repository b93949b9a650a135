"""`deepspeed.sequence.layer`: DeepSpeed-Ulysses' DistributedAttention and its all-to-all
(zero/parallel/ulysses.py)."""
from zero.parallel.ulysses import (DistributedAttention, _SeqAllToAll, apply_rotary_pos_emb,
                                   single_all_to_all)

__all__ = ["DistributedAttention", "_SeqAllToAll", "apply_rotary_pos_emb", "single_all_to_all"]
