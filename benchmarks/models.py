"""What the benchmarks train: TinyGPT at the sizes given on the command line, the same weights
(seed 0) and the same data (a stream per rank) for every configuration, and AdamW with the
same hyperparameters on every side: zero's engine config, torch.optim.AdamW and zero's CPU
Adam kernel. zero is imported inside the functions, after the script has chosen which zero it
measures (benchmarks/under_test.py)."""
from __future__ import annotations

ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def gpt_config(sizes):
    """GPTConfig from vocab, block, n_layer, n_head, n_embd (argparse args or a dict)."""
    from zero.models.tiny_gpt import GPTConfig

    a = sizes if isinstance(sizes, dict) else vars(sizes)
    return GPTConfig(vocab_size=a["vocab"], block_size=a["block"], n_layer=a["n_layer"],
                     n_head=a["n_head"], n_embd=a["n_embd"])


def seeded_model(gpt, lora: bool = False):
    """TinyGPT with the weights every configuration starts from; with `lora`, frozen but for
    rank-8 LoRA adapters on every block's Linear layers (zero.models.lora, as PEFT adds
    them)."""
    import torch
    from zero.models.lora import add_lora
    from zero.models.tiny_gpt import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(gpt)
    return add_lora(model, rank=8) if lora else model


def rank_batches(gpt, micro_batch: int, count: int, rank: int) -> list:
    """`count` (tokens, targets) micro-batches: rank r's data, the same for every config."""
    from zero.models.tiny_gpt import synthetic_batches

    return synthetic_batches(gpt, micro_batch, count, seed=1000 + rank)


def count_params(model) -> int:
    """Ψ: distinct parameters (the tied head counts once)."""
    return sum(p.numel() for p in model.parameters())


def torch_adamw(params, **implementation):
    """torch.optim.AdamW with ADAMW's hyperparameters (fused=..., foreach=... passed on)."""
    import torch

    return torch.optim.AdamW(params, lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]),
                             eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                             **implementation)


def engine_config(micro_batch: int, clip: float, zero_optimization: dict,
                  bf16: bool = False) -> dict:
    """zero's (DeepSpeed-format) config: one micro-batch per step, AdamW, gradient clipping."""
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": dict(ADAMW)},
        "zero_optimization": zero_optimization,
    }
    if bf16:
        config["bf16"] = {"enabled": True}
    return config

