"""Stage 3: a model's parts called without its forward (zero/stage3_root_parts.py). DeepSpeed-
Chat's critic trains through `engine.forward_value(...)`, which calls the backbone and the
value head directly; TRL scores with the backbone and `model.score(...)`. The root unit's
modules (embedding, final norm, value head) gather it for their own call; training that way
matches single-process PyTorch."""
import pytest
import torch
from torch import nn

from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)
STEPS = 4
WIDTH = 32


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, WIDTH)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(3))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, ids):
        hidden = self.embed(ids)
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        return self.norm(hidden)


class Critic(nn.Module):
    """DeepSpeed-Chat's RewardModel in outline: forward is the pairwise loss (unused here);
    forward_value runs the backbone and the value head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = Backbone()
        self.v_head = nn.Linear(WIDTH, 1, bias=False)

    def forward(self, ids):  # (the pairwise loss; not called here)
        raise AssertionError("the forward is not called in these tests")

    def forward_value(self, ids):
        return self.v_head(self.backbone(ids)).squeeze(-1)

    def score(self, hidden):
        return self.v_head(hidden).squeeze(-1)


def _batch(step, rank):
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(100 * step + rank))


def _loss(values):
    return (values - 1.0).pow(2).mean()


def _train(rank, world):
    import zero

    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = zero.initialize(model=Critic(), config=config)
    with torch.no_grad():  # experience: the value head and TRL's score, without the forward
        first = engine.forward_value(_batch(0, rank))
        scored = engine.score(getattr(engine, "backbone")(_batch(0, rank)))
    for step in range(STEPS):
        engine.backward(_loss(engine.forward_value(_batch(step, rank))))
        engine.step()
    gathered = sum(p.numel() for p in engine.module.parameters())
    state = engine.module_state_dict()
    return first, scored, gathered, state if rank == 0 else None


def _reference(world):
    model = Critic()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    with torch.no_grad():
        first = [model.forward_value(_batch(0, rank)) for rank in range(world)]
    for step in range(STEPS):
        optimizer.zero_grad()
        # each rank's mean loss, averaged over the ranks (the engine's gradient average)
        sum(_loss(model.forward_value(_batch(step, rank))) for rank in range(world)).div(world) \
            .backward()
        optimizer.step()
    return first, model.state_dict()


def test_a_critic_trained_through_forward_value_matches_torch():
    results = run_distributed(_train, 2)
    first, expected = _reference(2)
    for rank, (values, scored, gathered, _) in enumerate(results):
        torch.testing.assert_close(values, first[rank])
        torch.testing.assert_close(scored, first[rank])
        assert gathered == 0  # every partitioned parameter let go after each call
    for name, value in results[0][3].items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)
