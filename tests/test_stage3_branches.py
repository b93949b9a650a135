"""ZeRO-3 with rank-dependent branches: a module some ranks' batches reach and others' do not
(an expert each rank picks, an optional submodule, an output only some ranks' losses use)
trains as the single-process reference, with no hang: csrc/adapter/backward_reach.h."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from distributed_harness import run_distributed
from zero.stage3 import gather_unit

WORLD = 2
STEPS = 3
WIDTH = 32
CLIP = 1.0


class _ExpertBlock(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        # a unit of its own inside the block's, run first: its backward comes after the
        # block's last gradient, so the block may be released before it starts
        self.first = gather_unit(torch.nn.Linear(WIDTH, WIDTH))
        self.gain = torch.nn.Parameter(torch.ones(WIDTH))  # used first: its gradient comes last
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(experts))
        self.extra = torch.nn.Linear(WIDTH, WIDTH, bias=False)  # (a weight, no 1-D parameter)
        self.out = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, expert, extra, inner_checkpoint=False):
        h = torch.tanh(self.inp(torch.tanh(self.first(x)) * self.gain))
        if inner_checkpoint:  # part of the unit, recomputed in a pass without a unit event
            h = checkpoint(self._middle, h, expert, extra, use_reentrant=True)
        else:
            h = self._middle(h, expert, extra)
        return x + self.out(h)

    def _middle(self, h, expert, extra):
        h = torch.tanh(self.experts[expert](h))
        if extra:
            h = h + torch.tanh(self.extra(h))
        return h


class _ExpertNet(torch.nn.Module):
    """Blocks (stage-3 units) with an extra submodule only rank 0 runs, and with `experts`
    each rank's own expert in their middle (else one expert for all): inside each unit the
    ranks reach different parameters. Without experts rank 0 reaches all of a block's, so
    its reduction is ready mid-backward there and only at the end on rank 1. `reentrant`:
    each block runs under torch's activation checkpoint (use_reentrant as given);
    `inner_checkpoint`: each block's middle (experts, extra) runs under a reentrant one.
    `two_groups`: the optimizer gets the weights and the 1-D parameters as two groups, so
    each block is a unit of two parts, the branch in one of them."""

    def __init__(self, experts: bool, reentrant: bool | None = None,
                 inner_checkpoint: bool = False, two_groups: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.experts = experts
        self.reentrant = reentrant
        self.inner_checkpoint = inner_checkpoint
        self.two_groups = two_groups
        self.embed = torch.nn.Linear(8, WIDTH)
        self.blocks = torch.nn.ModuleList(_ExpertBlock(WORLD if experts else 1) for _ in range(3))
        self.head = torch.nn.Linear(WIDTH, 1)
        self.aux = torch.nn.Linear(WIDTH, 1)

    def forward(self, x, rank):
        x = self.embed(x)
        for block in self.blocks:
            expert = rank if self.experts else 0
            if self.reentrant is None:
                x = block(x, expert, rank == 0, self.inner_checkpoint)
            else:
                x = checkpoint(block, x, expert, rank == 0, use_reentrant=self.reentrant)
        return self.head(x).pow(2).mean(), self.aux(x).pow(2).mean()

    def optimizer_groups(self):
        if not self.two_groups:
            return None
        return [{"params": [p for p in self.parameters() if p.dim() == 2]},
                {"params": [p for p in self.parameters() if p.dim() != 2]}]


def _loss(outputs, rank):
    """Every rank's forward computes the aux output; only rank 0's loss uses it."""
    main, aux = outputs
    return main + aux if rank == 0 else main


def _inputs(rank, step):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def _reference(model):
    """Single process: each step's SGD update is the average of the ranks' gradients, clipped
    by their global norm."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        for rank in range(WORLD):
            (_loss(model(_inputs(rank, step), rank), rank) / WORLD).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(rank, world, model, zero_options, torch_style):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": CLIP,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": 2000,
                                    "overlap_comm": True, **zero_options}}
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.optimizer_groups(),
                                      config=config)
    for step in range(STEPS):
        loss = _loss(engine(_inputs(rank, step).to(engine.device), rank), rank)
        if torch_style:  # DeepSpeed's PyTorch-style backward
            loss.backward()
        else:
            engine.backward(loss)
        engine.step()
    with zero.GatheredParameters(list(engine.module.parameters())):
        return {name: p.detach().cpu() for name, p in engine.module.named_parameters()}


PARTITIONED = {"stage3_param_persistence_threshold": 0}
BOUNDED = {**PARTITIONED, "stage3_prefetch_bucket_size": 10**6,
           "stage3_max_live_parameters": 7000, "stage3_max_reuse_distance": 0}


@pytest.mark.parametrize("model,zero_options,torch_style", [
    ({}, PARTITIONED, False),
    ({}, PARTITIONED, True),
    ({}, {}, False),  # 32x32 weights and the biases stay whole on every rank
    ({"experts": True}, PARTITIONED, False),
    ({"reentrant": False}, PARTITIONED, False),
    # the blocks' parameters are outside the backward's graph until their recomputation
    ({"reentrant": True}, PARTITIONED, False),
    # the middle of each block is not in the backward's graph, and its recomputation has no
    # unit event of its own
    ({"inner_checkpoint": True}, PARTITIONED, False),
    # Prefetching under a bound on live parameters (elements): beside the root and a block's
    # `first`, the next block fits only once the block is released. Released at its last
    # gradient on rank 0 (which runs `extra`) and at its backward's end on rank 1, the ranks
    # would prefetch differently; with two groups, `extra`'s part differs across ranks while
    # the 1-D part, whose `gain` gradient completes the block, does not.
    ({}, BOUNDED, False),
    ({"two_groups": True}, BOUNDED, False),
], ids=["partitioned", "loss.backward", "kept-whole", "experts", "checkpointed",
        "reentrant-checkpointed", "inner-reentrant-checkpoint", "prefetch-bounded",
        "two-groups-prefetch-bounded"])
def test_experts_and_a_submodule_only_some_ranks_reach_train_as_the_reference(
        model, zero_options, torch_style):
    options = {"experts": False, **model}
    expected = _reference(_ExpertNet(**options))
    for weights in run_distributed(_train, WORLD, timeout=60,
                                   args=(_ExpertNet(**options), zero_options, torch_style)):
        for name, value in expected.items():
            assert torch.allclose(weights[name], value, rtol=1e-4, atol=1e-6), name
