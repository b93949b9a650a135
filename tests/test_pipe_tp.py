"""Pipeline stages and tensor parallelism together, on 4 gloo ranks: DeepSpeed's
PipelineModule(topology=PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1)) with
AutoTP cutting each stage's blocks over its tensor pair trains like one process (tied
embedding/head across the stages, fused and separate q/k/v), clipping by the whole model's
gradient norm; its checkpoint (4 parts) loads
back and continues exactly, and exports to the single-process model's state dict. The
topology's sizes and the config must agree."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from distributed_harness import run_distributed
from training import assert_same_states
from tp_models import SEQ, VOCAB, WIDTH, Block
from zero.models.pipe_gpt import EmbeddingPipe, cross_entropy, head_forward, sequential
from zero.models.tiny_gpt import GPTConfig

EMBED = GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=4, n_embd=WIDTH)
HYPER = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
MICRO_BATCH, MICRO_BATCHES, STEPS, CLIP = 2, 2, 3, 0.05


def layers() -> list:
    from zero.pipe import LayerSpec, TiedLayerSpec

    return [TiedLayerSpec("embed", EmbeddingPipe, EMBED, tied_weight_attr="weight"),
            LayerSpec(Block, fused=False), LayerSpec(Block, fused=True),
            LayerSpec(nn.LayerNorm, WIDTH),
            TiedLayerSpec("embed", EmbeddingPipe, EMBED, forward_fn=head_forward,
                          tied_weight_attr="weight")]


def batches(step: int):
    generator = torch.Generator().manual_seed(11)
    data = []
    for _ in range(STEPS * MICRO_BATCHES):
        seq = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=generator)
        data.append((seq[:, :-1], seq[:, 1:]))
    return iter(data[step * MICRO_BATCHES:(step + 1) * MICRO_BATCHES])


def engine_for(autotp_size=None):
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    module = deepspeed.pipe.PipelineModule(
        layers=layers(), topology=PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1),
        loss_fn=cross_entropy, partition_method="type:Block", seed_layers=True)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH,
              "gradient_accumulation_steps": MICRO_BATCHES,
              "optimizer": {"type": "AdamW", "params": HYPER}, "gradient_clipping": CLIP,
              "zero_optimization": {"stage": 1}}
    if autotp_size is not None:
        config["tensor_parallel"] = {"autotp_size": autotp_size}
    return deepspeed.initialize(model=module, config=config)[0]


def params(module) -> dict:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def train_ranks(rank, world, root):
    from zero.tp import ColumnParallelLinear

    engine = engine_for()
    grid = engine.grid
    block = next(m for m in engine.module.modules() if isinstance(m, Block))
    losses, norms = [], []
    for step in range(STEPS):
        if step == 2:
            engine.save_checkpoint(root, tag="two")
        losses.append(engine.train_batch(batches(step)).item())
        norms.append(engine.get_global_grad_norm().item())
    fresh = engine_for(autotp_size=2)
    fresh.load_checkpoint(root)
    resumed = fresh.train_batch(batches(2)).item()
    after, fresh_after = params(engine.module), params(fresh.module)
    with pytest.raises(ValueError) as disagreeing:
        engine_for(autotp_size=4)
    # the 4 parts loaded into the whole model on 4 ranks (ZeRO-1 over all of them)
    import zero

    plain = zero.initialize(model=sequential(layers()), config={
        "train_micro_batch_size_per_gpu": MICRO_BATCH, "optimizer": {"type": "AdamW",
                                                                     "params": HYPER},
        "zero_optimization": {"stage": 1}})[0]
    plain.load_checkpoint(root)
    plain.save_checkpoint(root + "-whole", tag="resaved")
    return {"coord": (grid.get_stage_id(), grid.get_data_parallel_id(),
                      grid.get_tensor_model_parallel_rank(), grid.get_model_parallel_rank()),
            "split": isinstance(block.mlp.up_proj, ColumnParallelLinear),
            "losses": losses, "norms": norms, "resumed": resumed == losses[2] and
            all(torch.equal(after[n], fresh_after[n]) for n in after),
            "error": str(disagreeing.value)}


def reference():
    model = sequential(layers())
    optimizer = torch.optim.AdamW(model.parameters(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                  eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                  foreach=False)
    losses, states, norms = [], [], []
    for step in range(STEPS):
        optimizer.zero_grad()
        total = 0.0
        for tokens, targets in batches(step):
            loss = cross_entropy(model(tokens), targets)
            (loss / MICRO_BATCHES).backward()
            total += loss.item()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        optimizer.step()
        losses.append(total / MICRO_BATCHES)
        states.append({n: v.clone() for n, v in model.state_dict().items()})
    return losses, states, norms


def test_pipeline_2_x_tensor_2_matches_one_process_and_its_checkpoint_exports_whole(tmp_path):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint

    root = str(tmp_path / "ckpt")
    results = run_distributed(train_ranks, 4, args=(root,), timeout=150)
    assert [r["coord"] for r in results] == [(0, 0, 0, 0), (0, 0, 1, 1), (1, 0, 0, 2),
                                             (1, 0, 1, 3)]
    losses, states, norms = reference()
    assert norms[0] > 10 * CLIP  # the clip acted
    for result in results:
        assert result["split"]  # each stage's block was cut by AutoTP
        assert result["losses"] == pytest.approx(losses, rel=1e-5)
        # one norm: blocks' slices once, norms and biases over 2 tensor ranks once, the tied
        # embedding over 2 stages once
        assert result["norms"] == pytest.approx(norms, rel=1e-5)
        assert result["resumed"]
        assert "autotp_size = 4" in result["error"] and "tensor (model) size 2" in result["error"]
    assert_same_states(root, root + "-whole")  # the same master and Adam moments
    exported = get_fp32_state_dict_from_zero_checkpoint(root)
    assert set(exported) == set(states[1])
    for name, value in exported.items():
        expected = states[1][name]
        error = ((value - expected).norm() / expected.norm()).item()
        assert error < 1e-5, (name, error)
