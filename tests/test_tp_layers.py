"""zero.tp's layers and AutoTP on 4 gloo ranks: each layer against its torch counterpart
(nn.Linear, nn.Embedding, F.cross_entropy), forward and backward, at tensor 2 and 4; AutoTP
on an HF-style stand-in and on tiny real HF models (Llama with GQA, GPT-2) leaves the
outputs unchanged, and refuses, naming it, a size that does not divide."""
from __future__ import annotations

import copy
import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from distributed_harness import run_distributed
from tp_models import HEADS, SEQ, VOCAB, WIDTH, StandIn, close, hf_models


# ---- each layer against its torch counterpart, tensor 2 and 4 ----------------------------
def linear_checks(group, rank, size) -> list[str]:
    """The names of the checks that failed (empty: all passed)."""
    from zero.tp import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(1)
    linear, x, probe = nn.Linear(16, 24), torch.randn(3, 5, 16), torch.randn(3, 5, 24)
    x.requires_grad_(True)
    (linear(x) * probe).sum().backward()
    failed = []
    for gather in (True, False):
        layer = ColumnParallelLinear.from_linear(linear, group, gather_output=gather)
        x2 = x.detach().clone().requires_grad_(True)
        y = layer(x2)
        want = probe if gather else probe.chunk(size, dim=-1)[rank]
        (y * want).sum().backward()
        expected = linear(x).detach() if gather else linear(x).detach().chunk(size, -1)[rank]
        if not (close(y, expected) and close(x2.grad, x.grad)
                and close(layer.weight.grad, linear.weight.grad.chunk(size, 0)[rank])
                and close(layer.bias.grad, linear.bias.grad.chunk(size, 0)[rank])):
            failed.append(f"column gather_output={gather}")
    for parallel_input in (False, True):
        layer = RowParallelLinear.from_linear(linear, group, input_is_parallel=parallel_input)
        x2 = x.detach().clone().requires_grad_(True)
        y = layer(x2.chunk(size, dim=-1)[rank] if parallel_input else x2)
        (y * probe).sum().backward()
        grad = x.grad.chunk(size, dim=-1)[rank] if parallel_input else x.grad
        mine = x2.grad.chunk(size, dim=-1)[rank] if parallel_input else x2.grad
        if not (close(y, linear(x).detach()) and close(mine, grad)
                and close(layer.weight.grad, linear.weight.grad.chunk(size, 1)[rank])
                and close(layer.bias.grad, linear.bias.grad)):
            failed.append(f"row input_is_parallel={parallel_input}")
    return failed


def vocab_checks(group, rank, size) -> list[str]:
    from zero.tp import VocabParallelEmbedding, vocab_parallel_cross_entropy

    torch.manual_seed(2)
    failed = []
    embedding = nn.Embedding(VOCAB, 8, padding_idx=3)
    tokens, probe = torch.randint(0, VOCAB, (4, 6)), torch.randn(4, 6, 8)
    tokens[0, 0] = 3
    (embedding(tokens) * probe).sum().backward()
    layer = VocabParallelEmbedding.from_embedding(embedding, group)
    out = layer(tokens)
    (out * probe).sum().backward()
    if not (close(out, embedding(tokens).detach())
            and close(layer.weight.grad, embedding.weight.grad.chunk(size, 0)[rank])):
        failed.append("embedding")
    logits = (torch.randn(5, 7, VOCAB) * 3).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (5, 7))
    targets[1, :3] = -100
    for reduction in ("mean", "sum", "none"):
        local = logits.detach().chunk(size, dim=-1)[rank].clone().requires_grad_(True)
        loss = vocab_parallel_cross_entropy(local, targets, group, reduction=reduction)
        expected = F.cross_entropy(logits.transpose(1, 2), targets, reduction=reduction)
        logits.grad = None
        (expected * (2.0 if reduction == "none" else 1.0)).sum().backward()
        (loss * (2.0 if reduction == "none" else 1.0)).sum().backward()
        if not (close(loss, expected.detach())
                and close(local.grad, logits.grad.chunk(size, dim=-1)[rank])):
            failed.append(f"cross_entropy {reduction}")
    return failed


def layer_ranks(rank, world):
    from zero.parallel.grid import grid_for

    results = {}
    for size in (2, 4):
        grid = grid_for(tensor=size)
        group, tp_rank = grid.get_tensor_model_parallel_group(), grid.get_tensor_model_parallel_rank()
        results[size] = linear_checks(group, tp_rank, size) + vocab_checks(group, tp_rank, size)
    return results


def test_each_layer_matches_torch_forward_and_backward_at_tensor_2_and_4():
    for rank, results in enumerate(run_distributed(layer_ranks, 4, timeout=60)):
        assert results == {2: [], 4: []}, rank


# ---- AutoTP --------------------------------------------------------------------------------
def outputs_equal(model, converted, x) -> bool:
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = model(x1), converted(x2)
    y1.square().sum().backward()
    y2.square().sum().backward()
    return close(y1, y2) and close(x1.grad, x2.grad)


def auto_tp_ranks(rank, world):
    from zero.parallel.grid import grid_for
    from zero.tp import TensorParallelSplitError, auto_tp

    out = {}
    for size in (2, 4):
        group = grid_for(tensor=size).get_tensor_model_parallel_group()
        torch.manual_seed(4)
        model, x = StandIn(), torch.randn(2, SEQ, WIDTH)
        converted = copy.deepcopy(model)
        names = auto_tp(converted, group)
        out[size] = (names, outputs_equal(model, converted, x),
                     converted.layers[0].self_attn.num_heads,
                     type(converted.layers[1].self_attn.qkv).__name__)
    group = grid_for(tensor=4).get_tensor_model_parallel_group()
    models, errors = hf_models(), []
    for bad in [StandIn(hidden=30)] + [copy.deepcopy(m) for n, m in models if n == "llama"]:
        before = copy.deepcopy(bad.state_dict())
        try:
            auto_tp(bad, group)
        except TensorParallelSplitError as error:
            unchanged = all(torch.equal(before[k], v) for k, v in bad.state_dict().items())
            errors.append((str(error), unchanged))
    tokens = torch.randint(0, VOCAB, (2, SEQ))
    group = grid_for(tensor=2).get_tensor_model_parallel_group()
    hf = {}
    for name, model in models:
        converted = copy.deepcopy(model)
        names = auto_tp(converted, group)
        with torch.no_grad():
            hf[name] = (len(names), close(model(tokens).logits, converted(tokens).logits))
    return out, errors, hf


def test_auto_tp_converts_hf_style_blocks_and_refuses_what_does_not_divide():
    for rank, (out, errors, hf) in enumerate(run_distributed(auto_tp_ranks, 4, timeout=90)):
        names, equal, heads, fused = out[2]
        assert names == [f"layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj",
                                                               "o_proj")] + \
            ["layers.0.mlp.up_proj", "layers.0.mlp.down_proj",
             "layers.1.self_attn.qkv", "layers.1.self_attn.o_proj",
             "layers.1.mlp.up_proj", "layers.1.mlp.down_proj"], rank
        assert equal and heads == HEADS // 2 and fused == "ColumnParallelLinear"
        assert out[4][1] and out[4][2] == HEADS // 4
        message, unchanged = errors[0]
        assert "layers.0.mlp.up_proj.out_features = 30" in message and "4" in message
        assert unchanged
        # the set-up installs transformers: the real HF models are converted whenever it is there
        assert bool(hf) == (importlib.util.find_spec("transformers") is not None)
        if hf:
            assert hf["llama"] == (2 * 7, True)  # q, k, v, o, gate, up, down per layer
            assert hf["gpt2"] == (2 * 4, True)   # c_attn, c_proj; c_fc, c_proj per layer
            message, unchanged = errors[1]   # 2 key/value heads over 4 ranks
            assert "k_proj" in message and "2 heads" in message and unchanged


