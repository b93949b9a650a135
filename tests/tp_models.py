"""The small models the tensor-parallel tests share: an HF-style GPT written plainly
(q/k/v/o and up/down names; a tied token embedding/head that runs vocabulary-parallel once
the embedding is a zero.tp.VocabParallelEmbedding), a stand-in of two HF decoder blocks, and
tiny real HF models when transformers is importable."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 8


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


class Attention(nn.Module):
    def __init__(self, width=WIDTH, heads=HEADS, fused=False):
        super().__init__()
        self.num_heads, self.head_dim = heads, width // heads
        if fused:
            self.qkv = nn.Linear(width, 3 * width, bias=False)
        else:
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(width, width, bias=False)
                                                     for _ in range(3))
        self.o_proj = nn.Linear(width, width)

    def forward(self, x):
        batch, time, _ = x.shape
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (t.view(batch, time, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    def __init__(self, width=WIDTH, hidden=4 * WIDTH):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, fused=False, hidden=4 * WIDTH):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.self_attn, self.mlp = Attention(fused=fused), MLP(hidden=hidden)

    def forward(self, x):
        x = x + self.self_attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token embedding tied to the output head. Once `embed` is a VocabParallelEmbedding the
    head and the loss run vocabulary-parallel too."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        nn.init.normal_(self.embed.weight, std=0.1)
        self.position = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block(fused=i % 2 == 1) for i in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, tokens, targets):
        from zero.tp import VocabParallelEmbedding, column_parallel_linear, \
            vocab_parallel_cross_entropy

        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if isinstance(self.embed, VocabParallelEmbedding):
            logits = column_parallel_linear(x, self.embed.weight, None, self.embed.group)
            return vocab_parallel_cross_entropy(logits, targets, self.embed.group)
        logits = x @ self.embed.weight.t()
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def build_gpt():
    torch.manual_seed(0)
    return GPT()



class StandIn(nn.Module):
    """Two HF-style decoder blocks: separate q/k/v, then a fused qkv; an MLP of up/down."""

    def __init__(self, hidden=4 * WIDTH):
        super().__init__()
        self.layers = nn.ModuleList([Block(fused=False, hidden=hidden),
                                     Block(fused=True, hidden=hidden)])
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)  # left whole

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def hf_models():
    """Tiny real HF models (random weights, no download), or [] without transformers."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    except ImportError:
        return []
    torch.manual_seed(3)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=2, n_head=4,
                                      n_positions=SEQ, bos_token_id=0, eos_token_id=0))
    return [("llama", llama.eval()), ("gpt2", gpt2.eval())]
