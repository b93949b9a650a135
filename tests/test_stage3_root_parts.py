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

    def __init__(self, checkpointing=None):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = Backbone()
        self.v_head = nn.Linear(WIDTH, 1, bias=False)
        self.checkpointing = checkpointing  # None, "reentrant", "non_reentrant": the value head

    def forward(self, ids):  # (the pairwise loss; not called here)
        raise AssertionError("the forward is not called in these tests")

    def forward_value(self, ids):
        hidden = self.backbone(ids)
        if self.checkpointing is None:
            return self.v_head(hidden).squeeze(-1)
        return torch.utils.checkpoint.checkpoint(
            self.v_head, hidden, use_reentrant=self.checkpointing == "reentrant").squeeze(-1)

    def score(self, hidden):
        return self.v_head(hidden).squeeze(-1)


def _batch(step, rank):
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(100 * step + rank))


def _loss(values):
    return (values - 1.0).pow(2).mean()


def _saved_unit_bytes(engine, ids):
    """The forward through forward_value, and the bytes of the root unit's buffer (anything of
    its size or more) that the tensors autograd saved still point at."""
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr(), id(storage)] = storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        values = engine.forward_value(ids)
    root_bytes = 4 * (50 * WIDTH + 2 * WIDTH + WIDTH)  # embedding, final norm, value head
    return values, sum(s.nbytes() for s in saved.values() if s.nbytes() >= root_bytes)


def _train(rank, world, checkpointing):
    import zero

    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = zero.initialize(model=Critic(checkpointing), config=config)
    with torch.no_grad():  # experience: the value head and TRL's score, without the forward
        first = engine.forward_value(_batch(0, rank))
        scored = engine.score(getattr(engine, "backbone")(_batch(0, rank)))
    held = 0
    for step in range(STEPS):
        values, saved = _saved_unit_bytes(engine, _batch(step, rank))
        held = max(held, saved)
        engine.backward(_loss(values))
        engine.step()
    gathered = sum(p.numel() for p in engine.module.parameters())
    state = engine.module_state_dict()
    return first, scored, gathered, held, state if rank == 0 else None


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


@pytest.mark.parametrize("checkpointing", [None, "reentrant", "non_reentrant"])
def test_a_critic_trained_through_forward_value_matches_torch(checkpointing):
    """Also with the value head checkpointed (recomputed in backward, where the root unit is
    gathered for it); between forward and backward no gathered root unit is kept alive by what
    autograd saved (its buffer is freed in place, and filled again by backward's gather)."""
    results = run_distributed(_train, 2, args=(checkpointing,))
    first, expected = _reference(2)
    for rank, (values, scored, gathered, held, _) in enumerate(results):
        torch.testing.assert_close(values, first[rank])
        torch.testing.assert_close(scored, first[rank])
        assert gathered == 0  # every partitioned parameter let go after each call
        assert held == 0
    for name, value in results[0][4].items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)
