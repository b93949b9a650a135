"""Short Ulysses runs (sequence parallelism) tests/test_sequence_parallel.py compares with the
real DeepSpeed 0.19.8: a small causal LM whose attention is DistributedAttention over the
sequence group, each rank feeding its piece of every sequence, trained with the config of the
case. Shared by make.py (DeepSpeed writes expected.pt: rank 0's losses, the first step's
gradients as safe_get_full_grad reads them, the final fp32 weights) and the test (zero, the
same script). The groups come from DeepSpeed's parallel_state_sp as the mpu (as Ulysses for
Hugging Face and Megatron-DeepSpeed pass one), or, in the "mesh" case, from the config's
sequence_parallel_size beside data_parallel_size, where DeepSpeed 0.19.8 shards and reduces
over the data dimension alone: a group's ranks never add their gradients and drift apart
(make.py records rank 1's weights too)."""
import importlib

import torch
import torch.distributed.nn.functional  # noqa: F401 - the gathered loss
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, SEQ, MICRO, GAS, STEPS = 32, 16, 4, 8, 2, 2, 3
SIZE = 2  # sequence_parallel_size


def config(stage: int, **extra) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500}, **extra}


STAGE3 = {"stage": 3, "reduce_bucket_size": 500, "stage3_param_persistence_threshold": 0}
CASES = {  # name -> (how the groups are made, each rank's loss, config)
    "stage0": ("mpu", "mean", config(0)),
    "stage1": ("mpu", "mean", config(1)),
    "stage2": ("mpu", "gathered", config(2)),
    "stage3": ("mpu", "mean", config(3, zero_optimization=STAGE3)),
    "stage3-gathered": ("mpu", "gathered", config(3, zero_optimization=STAGE3)),
    "stage3-bf16": ("mpu", "gathered", config(3, zero_optimization=STAGE3, bf16={"enabled": True})),
    "stage2-mesh": ("mesh", "mean", config(2, sequence_parallel_size=SIZE, data_parallel_size=1)),
}


class LocalAttention(nn.Module):
    """Causal attention on [batch, seq, heads, dim]: the whole sequence, some heads."""

    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)  # a key bias has no gradient but noise
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.attn = LocalAttention()

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        ctx = self.attn(q, k, v) if isinstance(self.attn, LocalAttention) else \
            self.attn(q, k, v, batch_dim_idx=0)
        x = x + self.out(ctx.reshape(b, s, DIM).to(x.dtype))
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """Tokens [batch, seq piece] at positions [start, ...) -> next-token logits."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens, start=0):
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def samples(replicas: int) -> torch.Tensor:
    """[steps, gas, replicas, micro, SEQ + 1] tokens."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (STEPS, GAS, replicas, MICRO, SEQ + 1), generator=generator)


def piece_loss(logits, targets, kind: str, group):
    """This rank's loss: the mean over its piece ("mean"), or the mean over the whole
    sequences gathered differentiably over the group as the Hugging Face Trainer does
    ("gathered", its deepspeed_sp_compute_loss)."""
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
    if kind == "mean":
        return loss
    losses = torch.distributed.nn.functional.all_gather(loss, group=group)
    tokens = torch.distributed.nn.functional.all_gather(
        torch.tensor(float(targets.numel()), device=targets.device), group=group)
    return sum(l * t for l, t in zip(losses, tokens)) / sum(tokens)


def train(deepspeed, name: str):
    """Trains case `name` with `deepspeed` (the real one, or zero.compat.deepspeed): the
    engine, this rank's losses, and the first step's gradients (safe_get_full_grad at the
    boundary)."""
    groups = importlib.import_module(deepspeed.__name__ + ".utils.groups")
    layer = importlib.import_module(deepspeed.__name__ + ".sequence.layer")
    via, kind, config = CASES[name]
    mpu = None
    if via == "mpu":
        mpu = importlib.import_module(deepspeed.__name__ +
                                      ".runtime.sequence_parallel.parallel_state_sp")
        mpu.initialize_sequence_parallel(SIZE)
    engine, *_ = deepspeed.initialize(model=make_model(), config=config, mpu=mpu)
    group, size = groups._get_sequence_parallel_group(), groups._get_sequence_parallel_world_size()
    piece = groups._get_sequence_parallel_rank()
    replica = torch.distributed.get_rank() // size
    for block in engine.module.blocks:  # attention over the group; it holds no parameters
        block.attn = layer.DistributedAttention(block.attn, group, 2, 1)
    length, data = SEQ // size, samples(torch.distributed.get_world_size() // size)
    losses, grads = [], None
    for step in range(STEPS):
        for micro in range(GAS):
            tokens = data[step, micro, replica].to(engine.device)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            cut = slice(piece * length, (piece + 1) * length)
            loss = piece_loss(engine(inputs[:, cut], start=piece * length), targets[:, cut],
                              kind, group)
            engine.backward(loss)
            losses.append(loss.item())
            if step == 0 and micro == GAS - 1:
                grads = {name: deepspeed.utils.safe_get_full_grad(p).float().clone()
                         for name, p in engine.module.named_parameters()}
            engine.step()
    return engine, losses, grads
