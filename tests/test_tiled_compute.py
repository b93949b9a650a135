"""DeepSpeed's ALST tiling (`deepspeed.runtime.sequence_parallel.ulysses_sp`: TiledMLP,
SequenceTiledCompute / sequence_tiled_compute, TiledFusedLogitsLoss): each equals the untiled
computation, outputs and gradients; and under zero's engine at stages 0-3 a model whose MLPs
and loss are tiled trains like the untiled model in one process, the tiles' weight gradients
added up before the engine takes them (the `ds_grad_is_ready` marks)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distributed_harness import run_distributed

DIM, VOCAB, SEQ, STEPS = 8, 16, 12, 3


def _tiling():
    from zero.compat.deepspeed.runtime.sequence_parallel import ulysses_sp

    return ulysses_sp


def _mlp(module, x):
    return module[2](module[1](module[0](x)))


def _grads(*tensors):
    return [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("shards", [1, 3, 5])  # 5: tiles of unequal length
def test_tiled_mlp_equals_the_mlp(shards):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
    x = torch.randn(2, SEQ, DIM, requires_grad=True)
    weight = torch.randn(2, SEQ, DIM)
    (_mlp(mlp, x) * weight).sum().backward()
    expected = _grads(x, *mlp.parameters())
    for t in (x, *mlp.parameters()):
        t.grad = None
    out = _tiling().TiledMLP.apply(_mlp, mlp, x, shards, list(mlp.parameters()))
    assert torch.allclose(out, _mlp(mlp, x), atol=1e-6)
    (out * weight).sum().backward()
    for got, want in zip(_grads(x, *mlp.parameters()), expected):
        assert torch.allclose(got, want, atol=1e-5)
    assert all(p.ds_grad_is_ready for p in mlp.parameters())  # the last tile says ready


@pytest.mark.parametrize("dim,reduction", [(1, None), (1, "sum"), (1, "mean"), (0, "mean"),
                                           (0, "sum")])
def test_sequence_tiled_compute_equals_the_whole_sequence(dim, reduction):
    torch.manual_seed(0)
    linear = nn.Linear(DIM, DIM)
    x = torch.randn(1, SEQ, DIM, requires_grad=True)
    scale = torch.tensor(2.0)

    def fn(hidden, scale):
        out = linear(hidden) * scale
        return out.square().mean() if dim == 0 else out

    tiles = 4  # equal tiles: the mean of tile means is the whole mean
    whole = [fn(x[:, i * 3:(i + 1) * 3], scale) for i in range(tiles)]
    whole = torch.stack(whole) if dim == 0 else torch.cat(whole, dim=1)
    whole = {None: lambda t: t, "mean": torch.mean, "sum": torch.sum}[reduction](whole)
    weight = torch.randn_like(whole)
    (whole * weight).sum().backward()
    expected = _grads(x, linear.weight)
    x.grad = linear.weight.grad = None
    out = _tiling().sequence_tiled_compute(
        fn, SEQ, tiles, {"hidden": x}, {"scale": scale}, "hidden", [linear.weight],
        output_unshard_dimension=dim, output_reduction=reduction)
    assert torch.allclose(out, whole.detach(), atol=1e-6)
    (out * weight).sum().backward()
    for got, want in zip(_grads(x, linear.weight), expected):
        assert torch.allclose(got, want, atol=1e-5)


def test_the_mean_is_over_the_tiles_chunk_makes():
    """Five positions in four shards are three tiles: "mean" averages three losses, and the
    gradients are those of that mean."""
    torch.manual_seed(0)
    head = nn.Linear(DIM, VOCAB)
    x = torch.randn(1, 5, DIM, requires_grad=True)
    y = torch.randint(0, VOCAB, (1, 5))

    def loss_fn(module, x, y):
        return F.cross_entropy(module(x), y, reduction="sum")

    pieces = [loss_fn(head, xs, ys) for xs, ys in zip(x[0].chunk(4), y[0].chunk(4))]
    expected_loss = torch.stack(pieces).mean()
    expected_loss.backward()
    expected = _grads(x, head.weight)
    x.grad = head.weight.grad = None
    loss = _tiling().TiledFusedLogitsLoss.apply(loss_fn, head, x, y, None, 4, [head.weight],
                                                "mean")
    loss.backward()
    assert torch.allclose(loss, expected_loss.detach(), atol=1e-6)
    for got, want in zip(_grads(x, head.weight), expected):
        assert torch.allclose(got, want, atol=1e-6)


def test_a_failing_tile_leaves_the_weights_ready():
    mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.Identity(), nn.Identity())
    calls = []

    def fn(module, x):
        calls.append(1)
        if len(calls) > 2:  # the forward's two tiles pass; the backward's first fails
            raise RuntimeError("out of memory")
        return _mlp(module, x)

    out = _tiling().TiledMLP.apply(fn, mlp, torch.randn(1, 4, DIM, requires_grad=True), 2,
                                   list(mlp.parameters()))
    with pytest.raises(RuntimeError, match="out of memory"):
        out.sum().backward()
    assert all(p.ds_grad_is_ready for p in mlp.parameters())


@pytest.mark.parametrize("masked", [False, True])
def test_tiled_fused_logits_loss_equals_the_loss(masked):
    torch.manual_seed(0)
    head = nn.Linear(DIM, VOCAB)
    x = torch.randn(2, SEQ, DIM, requires_grad=True)
    y = torch.randint(0, VOCAB, (2, SEQ))
    mask = (torch.rand(2, SEQ) > 0.3) if masked else None

    def loss_fn(module, x, y, mask=None):
        losses = F.cross_entropy(module(x), y, reduction="none")
        return losses.sum() if mask is None else (losses * mask).sum()

    expected_loss = loss_fn(head, x.reshape(-1, DIM), y.reshape(-1),
                            None if mask is None else mask.reshape(-1))
    (expected_loss * 3).backward()
    expected = _grads(x, head.weight)
    x.grad = head.weight.grad = None
    loss = _tiling().TiledFusedLogitsLoss.apply(loss_fn, head, x, y, mask, 4, [head.weight],
                                                "sum")
    assert torch.allclose(loss, expected_loss.detach(), atol=1e-5)
    (loss * 3).backward()
    # the weights got theirs inside the forward (a loss is the last thing a step computes),
    # scaled by the backward's own incoming gradient only for the input
    assert torch.allclose(x.grad, expected[0], atol=1e-5)
    assert torch.allclose(head.weight.grad * 3, expected[1], atol=1e-5)


class Block(nn.Module):
    """A residual MLP whose forward runs the MLP tiled (as a patched LlamaMLP.forward runs
    TiledMLP inside its decoder layer, the unit ZeRO-3 gathers)."""

    def __init__(self, tiles: int):
        super().__init__()
        self.tiles = tiles
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x):
        if self.tiles == 1:
            return x + _mlp(self.mlp, x)
        return x + _tiling().TiledMLP.apply(_mlp, self.mlp, x, self.tiles,
                                            list(self.mlp.parameters()))


class TiledLM(nn.Module):
    """Embedding, two residual MLP blocks, a head; `tiles` > 1 runs the MLPs through TiledMLP
    and the head's loss through TiledFusedLogitsLoss (each tile's summed loss over the token
    count: its weights get their gradients inside the forward, so the loss it returns is
    the one backpropagated, not scaled after)."""

    def __init__(self, tiles: int):
        super().__init__()
        self.tiles = tiles
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(tiles) for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        if self.tiles == 1:
            return F.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1))

        def loss_fn(head, x, y):  # each tile's share of the mean: the loss is final here
            return F.cross_entropy(head(x), y, reduction="sum") / targets.numel()

        return _tiling().TiledFusedLogitsLoss.apply(loss_fn, self.head, x, targets, None,
                                                    self.tiles, list(self.head.parameters()),
                                                    "sum")


def _data(rank, gas):
    generator = torch.Generator().manual_seed(10 + rank)
    return [torch.randint(0, VOCAB, (2, SEQ + 1), generator=generator)
            for _ in range(STEPS * gas)]


def _train_tiled(rank, world, stage, gas):
    import zero

    torch.manual_seed(0)
    model = TiledLM(tiles=3)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
              "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 144,  # head: a unit
                                    "stage3_param_persistence_threshold": 0}}
    engine, *_ = zero.initialize(model=model, config=config)
    for tokens in _data(rank, gas):
        engine.backward(engine(tokens[:, :-1], tokens[:, 1:]))
        engine.step()
    with zero.GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _reference(world, gas):
    """The untiled model in one process. The head's gradients are taken in the tiled loss's
    forward, so the engine's 1/gas reaches the rest of the model only (as in DeepSpeed): the
    reference gives the head gas times its share too."""
    torch.manual_seed(0)
    model = TiledLM(tiles=1)
    for param in model.head.parameters():
        param.register_hook(lambda grad: grad * gas)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    data = [_data(rank, gas) for rank in range(world)]
    for step in range(STEPS):
        for micro in range(step * gas, (step + 1) * gas):
            for rank in range(world):
                tokens = data[rank][micro]
                (model(tokens[:, :-1], tokens[:, 1:]) / (world * gas)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("gas", [1, 2])
def test_a_tiled_model_trains_like_the_untiled_one_at_every_stage(stage, gas):
    """gas 2: the loss's weight gradients, taken in the forward before any backward is
    open, reach the engine when the backward opens (at stages 0-1 the accumulation
    buffer's)."""
    expected = _reference(2, gas)
    for weights in run_distributed(_train_tiled, world_size=2, args=(stage, gas),
                                   timeout=120):
        for name, value in expected.items():
            assert torch.allclose(weights[name], value, atol=2e-6, rtol=1e-4), \
                (name, (weights[name] - value).abs().max().item())
