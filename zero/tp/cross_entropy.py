"""Cross-entropy over logits whose vocabulary is split over the tensor-parallel ranks
(Megatron's vocab_parallel_cross_entropy): no rank holds the whole logits. Three all-reduces
of one number per token (the maximum, the target's logit, the sum of exponentials) give
every rank the same loss, equal to F.cross_entropy of the gathered logits; the backward
gives each rank the gradient of its own slice (softmax minus the one-hot target)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group,
                                 ignore_index: int = -100,
                                 reduction: str = "mean") -> torch.Tensor:
    """logits [..., V / tensor] (this rank's slice of the vocabulary, rank order), targets
    [...] (token ids in the whole vocabulary). Computed in fp32. `reduction` is "mean" (over
    the targets that are not ignore_index), "sum" or "none", as in F.cross_entropy."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"zero: vocab_parallel_cross_entropy reduction = {reduction!r}; use "
                         "'mean', 'sum' or 'none'")
    logits = logits.float()
    local = logits.shape[-1]
    start = comm.group_rank(group) * local
    with torch.no_grad():  # any constant shift gives the same loss; the max keeps exp finite
        peak = logits.max(dim=-1, keepdim=True).values
        if comm.group_size(group) > 1:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - peak
    ignored = targets == ignore_index
    outside = (targets < start) | (targets >= start + local) | ignored
    index = (targets - start).masked_fill(outside, 0).unsqueeze(-1)
    target_logit = shifted.gather(-1, index).squeeze(-1).masked_fill(outside, 0.0)
    target_logit = comm.reduce_from_tensor_parallel(target_logit, group)
    sum_exp = comm.reduce_from_tensor_parallel(shifted.exp().sum(dim=-1), group)
    loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (~ignored).sum()
