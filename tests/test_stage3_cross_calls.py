"""ZeRO-3: a module of one gather unit called inside another unit's forward (a layer shared
across blocks, a block's submodule called from the root's forward) trains as the
single-process reference without register_external_parameter, as under DeepSpeed:
zero/stage3_cross_calls.py."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from distributed_harness import run_distributed

WORLD = 2
STEPS = 3
WIDTH = 16


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Linear(WIDTH, WIDTH)
        self.own = torch.nn.Linear(WIDTH, WIDTH)
        self.extra = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, lend=None):
        shared = self.shared if lend is None else lend.shared  # another block's layer
        return torch.tanh(self.own(torch.tanh(shared(x))))


class _Net(torch.nn.Module):
    """Three blocks (stage-3 units): block 1 runs block 0's `shared` (`borrow_later`: block 0
    runs block 1's, before block 1 itself runs); the root's forward runs block 2's `extra`.
    `checkpointed`: block 1 is recomputed in backward (non-reentrant)."""

    def __init__(self, checkpointed=False, borrow_later=False):
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.borrow_later = borrow_later
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x):
        if self.borrow_later:
            x = self.blocks[1](self.blocks[0](x, lend=self.blocks[1]))
        elif self.checkpointed:
            x = checkpoint(self.blocks[1], self.blocks[0](x), self.blocks[0], use_reentrant=False)
        else:
            x = self.blocks[1](self.blocks[0](x), lend=self.blocks[0])
        x = self.blocks[2](x)
        x = x + torch.tanh(self.blocks[2].extra(x))
        return self.head(x).pow(2).mean()


def _inputs(rank, step):
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(10 * step + rank))


def _reference(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        for rank in range(WORLD):
            (model(_inputs(rank, step)) / WORLD).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(rank, world, model, zero_options):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    **zero_options}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    lender = engine.module.blocks[1 if model.borrow_later else 0].shared
    hooked = [len(lender._forward_pre_hooks)]
    for step in range(STEPS):
        engine.backward(engine(_inputs(rank, step).to(engine.device)))
        engine.step()
        hooked.append(len(lender._forward_pre_hooks))
    with zero.GatheredParameters(list(engine.module.parameters())):
        weights = {name: p.detach().cpu() for name, p in engine.module.named_parameters()}
    return weights, hooked


REGATHER = {"stage3_max_reuse_distance": 0}  # each unit released after each use


@pytest.mark.parametrize("model,zero_options", [
    ({}, {}),
    ({}, {**REGATHER, "stage3_prefetch_bucket_size": 10**6}),  # prefetched in recorded order
    ({"borrow_later": True}, REGATHER),
    ({"checkpointed": True}, REGATHER),
], ids=["default", "regathered-prefetched", "borrow-later", "checkpointed"])
def test_a_module_called_from_another_units_forward_trains_as_the_reference(model,
                                                                            zero_options):
    expected = _reference(_Net(**model))
    for weights, hooked in run_distributed(_train, WORLD, timeout=60,
                                           args=(_Net(**model), zero_options)):
        for name, value in expected.items():
            assert torch.allclose(weights[name], value, rtol=1e-4, atol=1e-6), name
        # a hook on the shared layer for the first forward only
        assert hooked == [1] + [0] * STEPS, hooked
