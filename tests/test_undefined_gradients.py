"""A gradient autograd delivers as None on some ranks (a custom autograd function returning
None for a weight, or for an input whose graph holds weights) is a zero gradient there, as
under DDP: every stage trains as the single-process reference. Stages 1-3 used to stop with
"reported ready without a gradient" (csrc/adapter/grad_reducer.cpp)."""
import pytest
import torch

from distributed_harness import run_distributed

WORLD = 2
STEPS = 3
WIDTH = 16


class _MaybeNone(torch.autograd.Function):
    """x @ w.T, whose backward returns None for `w` or for `x` as told."""

    @staticmethod
    def forward(ctx, x, w, drop):
        ctx.save_for_backward(x, w)
        ctx.drop = drop
        return x @ w.t()

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad_x = None if ctx.drop == "input" else grad @ w
        grad_w = None if ctx.drop == "weight" else grad.t() @ x
        return grad_x, grad_w, None


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.weight = torch.nn.Parameter(torch.randn(WIDTH, WIDTH) * 0.1)

    def forward(self, x, drop):
        return torch.tanh(_MaybeNone.apply(torch.tanh(self.inp(x)), self.weight, drop))


class _Net(torch.nn.Module):
    """Three blocks (stage-3 units); the last one drops a gradient on rank 1 only. Dropping its
    input's cuts every earlier weight off that rank's backward (None all the way down)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x, drop):
        for i, block in enumerate(self.blocks):
            x = block(x, drop if i == len(self.blocks) - 1 else None)
        return self.head(x).pow(2).mean()


def _drop(rank, dropped):
    return dropped if rank == 1 else None


def _inputs(rank, step, micro):
    seed = 100 * step + 10 * micro + rank
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))


def _reference(dropped, gas):
    """Single process: each step's SGD update is the average of the ranks' micro-batch
    gradients, a None counting as zero."""
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(gas):
            for rank in range(WORLD):
                loss = model(_inputs(rank, step, micro), _drop(rank, dropped))
                (loss / (WORLD * gas)).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(rank, world, dropped, stage, gas, torch_style):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 500,
                                    "overlap_comm": True}}
    if stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine, _, _, _ = zero.initialize(model=_Net(), config=config)
    for step in range(STEPS):
        for micro in range(gas):
            loss = engine(_inputs(rank, step, micro), _drop(rank, dropped))
            if torch_style:  # DeepSpeed's PyTorch-style backward: the engine divides the grads
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()
    with zero.GatheredParameters(list(engine.module.parameters())):
        return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


@pytest.mark.parametrize("torch_style", [False, True], ids=["engine.backward", "loss.backward"])
@pytest.mark.parametrize("dropped", ["weight", "input"])
@pytest.mark.parametrize("stage,gas", [(0, 1), (1, 1), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_a_gradient_none_on_one_rank_counts_as_zero(dropped, stage, gas, torch_style):
    expected = _reference(dropped, gas)
    for weights in run_distributed(_train, WORLD, timeout=60,
                                   args=(dropped, stage, gas, torch_style)):
        for name, value in expected.items():
            assert torch.allclose(weights[name], value, rtol=1e-4, atol=1e-6), name
