"""DeepSpeed-Ulysses attention: each rank of a sequence group holds 1/s of the sequence and
every head; one all-to-all per tensor trades that for the whole sequence and 1/s of the heads,
the wrapped attention runs on it, and one all-to-all trades back.

Tensors are [batch, seq, heads, dim] (`batch_dim_idx` 0) or [seq, batch, heads, dim]
(`batch_dim_idx` 1), as DeepSpeed's `DistributedAttention` takes them. Going in (DeepSpeed's
`scatter_idx` >= 2) the heads are scattered and the sequence gathered; coming out
(`scatter_idx` < 2) the reverse. The pieces go in rank order, so the gathered sequence is the
sample's own order when rank r of the group holds piece r. The backward of one exchange is
the other (`_SeqAllToAll`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _dims(tensor: torch.Tensor, scatter_idx: int, batch_dim_idx: int) -> tuple[int, int]:
    """(dim scattered, dim gathered) of a 4-d tensor for one exchange."""
    if tensor.dim() != 4 or batch_dim_idx not in (0, 1):
        raise ValueError(f"zero: Ulysses attention takes 4-d [batch, seq, heads, dim] "
                         f"(batch_dim_idx 0) or [seq, batch, heads, dim] (batch_dim_idx 1) "
                         f"tensors; got shape {tuple(tensor.shape)} with batch_dim_idx "
                         f"{batch_dim_idx}")
    seq_dim = 1 - batch_dim_idx
    return (2, seq_dim) if scatter_idx >= 2 else (seq_dim, 2)


def single_all_to_all(input: torch.Tensor, scatter_idx: int, gather_idx: int,
                      batch_dim_idx: int, group, async_op: bool = False, handle=None,
                      type=None, num_kv_heads=None) -> torch.Tensor:
    """One exchange over `group` (DeepSpeed's function of this name; `gather_idx` is implied
    by `scatter_idx` and `batch_dim_idx`, as there). Synchronous: `async_op` (DeepSpeed's
    overlap on a side stream) is refused."""
    if async_op:
        raise NotImplementedError("zero: Ulysses' overlapped all-to-all (async_op, sp_stream) "
                                  "is not built; pass sp_stream=None")
    scatter, gather = _dims(input, scatter_idx, batch_dim_idx)
    size = dist.get_world_size(group)
    if input.shape[scatter] % size:
        what = "heads" if scatter == 2 else "sequence length"
        raise NotImplementedError(
            f"zero: Ulysses splits the {what} ({input.shape[scatter]}) over the "
            f"{size} ranks of the sequence group, and it does not divide evenly (DeepSpeed's "
            f"uneven-heads exchange is not built); use a sequence_parallel_size that divides "
            f"it")
    pieces = torch.stack(input.chunk(size, dim=scatter))  # [size, ...]: piece j goes to rank j
    received = torch.empty_like(pieces)
    dist.all_to_all_single(received, pieces, group=group)
    return torch.cat(received.unbind(0), dim=gather).contiguous()


class _SeqAllToAll(torch.autograd.Function):
    """DeepSpeed's autograd exchange (its argument order): backward runs the reverse one."""

    @staticmethod
    def forward(ctx, group, input, scatter_idx, gather_idx, batch_dim_idx, stream=None,
                handle=None, type=None, is_fwd=True, num_kv_heads=None):
        ctx.group, ctx.scatter_idx, ctx.gather_idx = group, scatter_idx, gather_idx
        ctx.batch_dim_idx = batch_dim_idx
        return single_all_to_all(input, scatter_idx, gather_idx, batch_dim_idx, group)

    @staticmethod
    def backward(ctx, grad):
        back = _SeqAllToAll.apply(ctx.group, grad, ctx.gather_idx, ctx.scatter_idx,
                                  ctx.batch_dim_idx)
        return (None, back) + (None,) * 8


def exchange(tensor: torch.Tensor, group, heads_out: bool, batch_dim_idx: int = 0):
    """The differentiable exchange: `heads_out` True trades sequence for heads (a rank's
    piece, every head -> the whole sequence, its heads), False the reverse."""
    seq_dim = 1 - batch_dim_idx
    scatter, gather = (2, seq_dim) if heads_out else (seq_dim, 2)  # backward swaps them
    return _SeqAllToAll.apply(group, tensor, scatter, gather, batch_dim_idx)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.unflatten(-1, (2, -1)).unbind(dim=-2)
    return torch.cat((-second, first), dim=-1)


def apply_rotary_pos_emb(t: torch.Tensor, freqs_cos: torch.Tensor,
                         freqs_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first freqs.shape[-1] features of `t` (DeepSpeed's
    reference formula); the rest pass through."""
    rot_dim = freqs_cos.shape[-1]
    rotated, passed = t[..., :rot_dim], t[..., rot_dim:]
    rotated = rotated * freqs_cos + _rotate_half(rotated) * freqs_sin
    return rotated if passed.shape[-1] == 0 else torch.cat((rotated, passed), dim=-1)


class DistributedAttention(nn.Module):
    """DeepSpeed's `deepspeed.sequence.layer.DistributedAttention`: wraps `local_attention`
    (q, k, v -> context, on the whole sequence and a slice of the heads) for a sequence
    group. `sp_stream` (DeepSpeed's overlap on a CUDA side stream) is not built and must be
    None; heads that the group's size does not divide are refused."""

    def __init__(self, local_attention: nn.Module, sequence_process_group, scatter_idx: int = 2,
                 gather_idx: int = 0, sp_stream=None, num_kv_heads: int | None = None):
        super().__init__()
        if sp_stream is not None:
            raise NotImplementedError("zero: DistributedAttention's sp_stream (the overlapped "
                                      "all-to-all) is not built; pass sp_stream=None")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx, self.gather_idx = scatter_idx, gather_idx
        self.num_kv_heads = num_kv_heads
        self.sp_overlap_comm, self.overlap_handles, self.sp_stream = False, None, None

    def layer_sync(self, layer):
        """DeepSpeed's wait for the overlapped exchange's event: nothing to wait for here."""

    def forward(self, query, key, value, batch_dim_idx: int, rotary_pos_emb=None, *args,
                **kwargs):
        q, k, v = (_SeqAllToAll.apply(self.spg, t, self.scatter_idx, self.gather_idx,
                                      batch_dim_idx) for t in (query, key, value))
        if rotary_pos_emb is not None:
            cos, sin = (f.permute(1, 0, 2, 3) for f in rotary_pos_emb)
            q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return _SeqAllToAll.apply(self.spg, context, self.gather_idx, self.scatter_idx,
                                  batch_dim_idx)
