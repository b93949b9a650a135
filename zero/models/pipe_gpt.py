"""The small GPT of tiny_gpt.py as a list of pipeline layers (zero.pipe / deepspeed.pipe):
a tied token embedding (TiedLayerSpec "embed": the input embedding and the output head share
its weight), the transformer blocks, the final norm, the head, and the loss function.

`sequential(layers)` builds the same layers in one process, with the same per-layer seeds a
PipelineModule(seed_layers=True) uses, as the single-process reference of tests and
benchmarks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .tiny_gpt import Block, GPTConfig

BASE_SEED = 1234  # DeepSpeed's PipelineModule base_seed


class EmbeddingPipe(nn.Module):
    """Token + position embedding; `weight` is the token embedding (the tied weight)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(config.vocab_size, config.n_embd) * 0.02)
        self.position = nn.Parameter(torch.randn(config.block_size, config.n_embd) * 0.02)

    def forward(self, tokens):
        return F.embedding(tokens, self.weight) + self.position[:tokens.shape[1]]


def head_forward(embedding: EmbeddingPipe, x):
    """The output head: the token embedding's weight as the projection (tied)."""
    return x @ embedding.weight.t()


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def pipe_layers(config: GPTConfig, tied: bool = True) -> list:
    """The model as layer specs: [embedding, blocks..., final norm, head]."""
    from zero.pipe import LayerSpec, TiedLayerSpec

    head = (TiedLayerSpec("embed", EmbeddingPipe, config, forward_fn=head_forward,
                          tied_weight_attr="weight") if tied
            else LayerSpec(nn.Linear, config.n_embd, config.vocab_size, bias=False))
    return ([TiedLayerSpec("embed", EmbeddingPipe, config, tied_weight_attr="weight")]
            + [LayerSpec(Block, config) for _ in range(config.n_layer)]
            + [LayerSpec(nn.LayerNorm, config.n_embd), head])


class Sequential(nn.Module):
    """All layers in one process, built as a PipelineModule builds a stage (tied specs share
    one module) and named as it names them ("<layer index>.<name>",
    "tied_modules.<key>.<name>")."""

    def __init__(self, layers: list, base_seed: int = BASE_SEED):
        super().__init__()
        from zero.pipe.module import build_stage

        built = build_stage(layers, 0, len(layers),
                            seed=lambda index: torch.manual_seed(base_seed + index))
        self.tied_modules = nn.ModuleDict(built.tied)
        for index, module in built.owned:
            self.add_module(str(index), module)
        self.funcs = built.forward_funcs

    def forward(self, x):
        for func in self.funcs:
            x = func(x)
        return x


def sequential(layers: list, base_seed: int = BASE_SEED) -> Sequential:
    return Sequential(layers, base_seed)
