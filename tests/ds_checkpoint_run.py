"""The run behind tests/deepspeed_checkpoints/: a small GPT trained 3 steps by the real
DeepSpeed 0.19.8 on 2 ranks and saved, then 2 steps more. make.py runs it under DeepSpeed
(build/ds-venv); test_deepspeed_checkpoint.py continues the same run in zero from the saved
checkpoint and compares. Both take model, config and data from here."""
from __future__ import annotations

import os

import torch

from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepspeed_checkpoints")
MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=2, n_head=2, n_embd=16)
MICRO_BATCH = 2
WORLD = 2           # DeepSpeed's ranks
SAVED_AT = 3        # optimizer steps before the save
MORE = 2            # steps after it
CLIENT_STATE = {"epoch": 7, "note": "saved by DeepSpeed"}
# name: (stage, precision)
RUNS = {"stage1-fp32": (1, "fp32"), "stage2-fp32": (2, "fp32"), "stage3-fp32": (3, "fp32"),
        "stage2-bf16": (2, "bf16"), "stage3-bf16": (3, "bf16")}
# (DeepSpeed refuses fp16 on its CPU accelerator: "Type fp16 is not supported on your device")


def make_model() -> TinyGPT:
    torch.manual_seed(0)
    model = TinyGPT(MODEL)
    model.register_buffer("seen_steps", torch.zeros(1))  # a persistent buffer to carry over
    return model


def config(stage: int, precision: str, world: int = WORLD) -> dict:
    """The DeepSpeed config of the run; at another world size the same global batch (the
    ranks' micro-batches become accumulation steps)."""
    gas = WORLD // world
    result = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * world,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": 20, "warmup_num_steps": 4}},
        "zero_optimization": {"stage": stage},
    }
    if stage == 3:  # every parameter partitioned, none kept whole
        result["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if precision == "bf16":
        result["bf16"] = {"enabled": True}
    return result


def train(engine, rank: int, world: int, first: int, steps: int) -> list[float]:
    """Optimizer steps first..first+steps-1; step s uses the WORLD micro-batches
    2s, 2s+1 (rank r of WORLD ranks takes 2s+r; one rank takes them as accumulation steps).
    Returns each step's mean loss over the global batch."""
    import torch.distributed as dist

    data = synthetic_batches(MODEL, MICRO_BATCH, (first + steps) * WORLD, seed=1)
    gas = WORLD // world
    losses = []
    for step in range(first, first + steps):
        total = torch.zeros(1)
        for micro in range(gas):
            tokens, targets = data[step * WORLD + micro * world + rank]
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        engine.module.seen_steps += 1
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    return losses
