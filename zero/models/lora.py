"""LoRA adapters on TinyGPT, as PEFT adds them: every block's Linear layers get a trainable
low-rank update and everything else is frozen (the stage-3 frozen-parameter tests and the
LoRA benchmark configuration train this)."""
from __future__ import annotations

import torch
from torch import nn

from .tiny_gpt import TinyGPT


class LoraLinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update: base(x) + B(A(x))·alpha/r. B starts
    random (PEFT starts it at zero) so that both matrices train from the first step."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0):
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.02)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


def add_lora(model: TinyGPT, rank: int = 4) -> TinyGPT:
    """Freezes the model (embeddings, tied head, norms, every base weight) and gives each
    block's attention and MLP Linear layers a LoRA update of `rank`; returns the model."""
    for param in model.parameters():
        param.requires_grad_(False)
    for block in model.blocks:
        block.attn.qkv = LoraLinear(block.attn.qkv, rank)
        block.attn.proj = LoraLinear(block.attn.proj, rank)
        block.mlp[0] = LoraLinear(block.mlp[0], rank)
        block.mlp[2] = LoraLinear(block.mlp[2], rank)
    return model
