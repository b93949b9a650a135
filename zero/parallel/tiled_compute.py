"""DeepSpeed's ALST tiling (`deepspeed.runtime.sequence_parallel.ulysses_sp`): a per-token
computation run over a long sequence a tile at a time, so that only one tile's intermediate
activations exist at once.

- `TiledMLP.apply(fn, module, x, shards, compute_params)`: `fn(module, tile)` on `shards`
  tiles of x's sequence (dim -2) without autograd; the backward runs it again tile by tile
  with autograd and backpropagates each tile at once.
- `SequenceTiledCompute` / `sequence_tiled_compute(...)`: the same for any function of
  keyword tensors cut along dim 1, with the outputs joined (or summed, or averaged).
- `TiledFusedLogitsLoss.apply(fn, module, x, y, mask, shards, compute_params,
  output_reduction)`: a loss over logits that never exist whole: each tile's loss is computed
  and backpropagated inside the forward, and the backward hands back the stored input
  gradient.

The weights a tile touches get their gradient once per tile. `compute_params` are marked
`ds_grad_is_ready = False` for all but the last tile, as DeepSpeed marks them: zero's
gradient hook then leaves the gradient adding up in `param.grad` and hands it to the engine
after the last tile, once (for the loss, whose tiles run in the forward, when the backward
opens: engine.py). A tile that raises leaves the weights marked ready again.
"""
from __future__ import annotations

import contextlib

import torch


def _mark(params, last: bool) -> None:
    for param in params:
        param.ds_grad_is_ready = last


@contextlib.contextmanager
def _tiles(params):
    """Around a loop over tiles: whatever ends the loop (a tile that raises, say out of
    memory) leaves the weights marked ready again, so a later untiled backward hands their
    gradients to the engine."""
    try:
        yield
    finally:
        _mark(params, last=True)


def _trainable(params) -> list:
    return [p for p in (params or ()) if p.requires_grad]


def _leaf(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return tensor.detach().requires_grad_(requires_grad)


class TiledMLP(torch.autograd.Function):
    """fn(module, x) on tiles of x's sequence; the backward recomputes each tile."""

    @staticmethod
    def forward(ctx, fn, module, x, shards, compute_params):
        ctx.fn, ctx.module, ctx.shards = fn, module, shards
        ctx.compute_params = _trainable(compute_params)
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(module, tile) for tile in x.chunk(shards, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        hidden = x.shape[-1]
        flat, flat_grad = x.reshape(-1, hidden), grad.reshape(-1, hidden)
        x_grad = torch.zeros_like(flat) if x.requires_grad else None
        start = 0
        tiles = flat.chunk(ctx.shards, dim=0)
        with _tiles(ctx.compute_params):
            for i, tile in enumerate(tiles):
                _mark(ctx.compute_params, last=i + 1 == len(tiles))
                tile = _leaf(tile, x.requires_grad)
                with torch.enable_grad():
                    out = ctx.fn(ctx.module, tile)
                torch.autograd.backward(out, flat_grad[start:start + tile.shape[0]])
                if x_grad is not None:
                    x_grad[start:start + tile.shape[0]] = tile.grad
                start += tile.shape[0]
        return None, None, None if x_grad is None else x_grad.view_as(x), None, None


def sequence_tiled_compute(fn, seqlen, shards, kwargs_to_shard, kwargs_to_pass,
                           grad_requiring_tensor_key, compute_params=None,
                           output_unshard_dimension=1, output_reduction="mean"):
    """DeepSpeed's entry to SequenceTiledCompute: `fn(**tiles, **kwargs_to_pass)` on `shards`
    tiles of every `kwargs_to_shard` tensor ([batch, seqlen, ...], cut on dim 1); the outputs
    joined on `output_unshard_dimension` (0: each tile's scalar stacked), then reduced by
    `output_reduction` (None, "mean" or "sum"); the gradient flows to
    `kwargs_to_shard[grad_requiring_tensor_key]`."""
    return SequenceTiledCompute.apply(
        fn, seqlen, shards, list(kwargs_to_shard), list(kwargs_to_pass),
        grad_requiring_tensor_key, compute_params, output_unshard_dimension, output_reduction,
        *kwargs_to_shard.values(), *kwargs_to_pass.values())


class SequenceTiledCompute(torch.autograd.Function):
    """DeepSpeed's generic tiled compute (its argument order; see sequence_tiled_compute)."""

    @staticmethod
    def forward(ctx, fn, seqlen, shards, keys_to_shard, keys_to_pass, grad_requiring_tensor_key,
                compute_params, output_unshard_dimension, output_reduction, *args):
        if output_reduction not in (None, "mean", "sum"):
            raise ValueError(f"unknown value {output_reduction}: valid values are: "
                             "none/mean/sum")
        ctx.fn, ctx.shards, ctx.dim = fn, shards, output_unshard_dimension
        ctx.reduction, ctx.key = output_reduction, grad_requiring_tensor_key
        ctx.compute_params = _trainable(compute_params)
        ctx.step = -(-seqlen // shards)  # ceil: the last tile may be shorter or empty
        ctx.sharded = dict(zip(keys_to_shard, args[:len(keys_to_shard)]))
        ctx.passed = dict(zip(keys_to_pass, args[len(keys_to_shard):]))
        ctx.index = (list(keys_to_shard) + list(keys_to_pass)).index(grad_requiring_tensor_key)
        ctx.count = len(args)
        with torch.no_grad():
            outputs = [fn(**SequenceTiledCompute._tile(ctx, i), **ctx.passed)
                       for i in range(shards)]
        joined = torch.stack(outputs) if ctx.dim == 0 else torch.cat(outputs, dim=ctx.dim)
        ctx.total = joined.numel()
        return {None: lambda t: t, "mean": torch.mean, "sum": torch.sum}[output_reduction](joined)

    @staticmethod
    def _tile(ctx, i: int) -> dict:
        return {k: v[:, i * ctx.step:(i + 1) * ctx.step] for k, v in ctx.sharded.items()}

    @staticmethod
    def backward(ctx, grad):
        whole = ctx.sharded[ctx.key]
        whole_grad = torch.zeros_like(whole)
        joined_at = 0  # where this tile's output sits in the joined output
        with _tiles(ctx.compute_params):
            for i in range(ctx.shards):
                _mark(ctx.compute_params, last=i + 1 == ctx.shards)
                tiles = SequenceTiledCompute._tile(ctx, i)
                tile = tiles[ctx.key] = _leaf(tiles[ctx.key], whole.requires_grad)
                with torch.enable_grad():
                    out = ctx.fn(**tiles, **ctx.passed)
                if ctx.reduction is not None:  # d(sum)/d(out) = 1, d(mean)/d(out) = 1/numel
                    incoming = grad.expand_as(out) / (ctx.total if ctx.reduction == "mean"
                                                      else 1)
                elif ctx.dim == 0:
                    incoming = grad[i]
                else:
                    incoming = grad.narrow(ctx.dim, joined_at, out.shape[ctx.dim])
                    joined_at += out.shape[ctx.dim]
                torch.autograd.backward(out, incoming)
                if tile.grad is not None:
                    start = min(i * ctx.step, whole.shape[1])
                    whole_grad.narrow(1, start, tile.shape[1]).copy_(tile.grad)
        grads = [None] * ctx.count
        grads[ctx.index] = whole_grad
        return (None,) * 9 + tuple(grads)


class TiledFusedLogitsLoss(torch.autograd.Function):
    """fn(module, x_tile, y_tile[, mask_tile]) -> a tile's loss, over `shards` tiles of the
    flattened [batch * seq] positions; each tile backpropagated inside the forward."""

    @staticmethod
    def forward(ctx, fn, module, x, y, mask, shards, compute_params, output_reduction):
        _check_loss_inputs(x, y, mask, output_reduction)
        params = _trainable(compute_params)
        batch, seq = x.shape[:2]
        flat_x, flat_y = x.reshape(-1, *x.shape[2:]), y.reshape(-1, *y.shape[2:])
        flat_mask = None if mask is None else mask.reshape(-1)
        x_grad = torch.zeros_like(flat_x) if x.requires_grad else None
        losses, start = [], 0
        tiles = list(zip(flat_x.chunk(shards), flat_y.chunk(shards),
                         flat_mask.chunk(shards) if flat_mask is not None else [None] * shards))
        # the reduction over tiles happens outside autograd: its gradient is put in by hand
        # (over the tiles chunk made, which can be fewer than `shards`)
        scale = torch.tensor(1.0 / len(tiles) if output_reduction == "mean" else 1.0,
                             dtype=torch.float32, device=x.device)
        with _tiles(params):
            for i, (x_tile, y_tile, mask_tile) in enumerate(tiles):
                _mark(params, last=i + 1 == len(tiles))
                x_tile = _leaf(x_tile, x.requires_grad)
                extra = () if mask_tile is None else (mask_tile,)
                with torch.enable_grad():
                    loss = fn(module, x_tile, y_tile, *extra)
                if x_grad is not None:
                    torch.autograd.backward(loss, scale.to(loss.dtype))
                    x_grad[start:start + x_tile.shape[0]] = x_tile.grad
                losses.append(loss.detach())
                start += x_tile.shape[0]
        if x_grad is not None:
            ctx.save_for_backward(x_grad.view(batch, seq, *x_grad.shape[1:]))
        stacked = torch.stack(losses)
        return stacked.mean() if output_reduction == "mean" else stacked.sum()

    @staticmethod
    def backward(ctx, grad):
        (x_grad,) = ctx.saved_tensors
        return None, None, x_grad * grad, None, None, None, None, None


def _check_loss_inputs(x, y, mask, output_reduction) -> None:
    if output_reduction not in ("mean", "sum"):
        raise ValueError(f'unknown reduction {output_reduction}: valid values are: "mean"/"sum"')
    if x.dim() < 2 or y.dim() < 2:
        raise ValueError("x and y must be at least 2D [batch_size, seq_len, ...]")
    if x.shape[:2] != y.shape[:2]:
        raise ValueError("x and y batch/seq dims must match")
    if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError("mask must be 2D [batch_size, seq_len], matching x and y")
