"""Tensor parallelism composed with ZeRO, on 4 gloo ranks: tensor 2 x data 2 trains a small
GPT (tied vocabulary-parallel embedding/head, AutoTP on its blocks) like a single process on
the global batch, at ZeRO stages 1 and 2, with ZeRO-1 sharding the optimizer state over the
data ranks; initialize() refuses what does not compose, naming it; the mesh's layout and
errors. Layers and AutoTP: test_tp_layers.py."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distributed_harness import run_distributed
from tp_models import SEQ, VOCAB, WIDTH, build_gpt
from zero.parallel import DeviceMesh

MICRO_BATCH, MICRO_BATCHES, DATA, TENSOR, STEPS = 2, 2, 2, 2, 3
HYPER = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def batches():
    generator = torch.Generator().manual_seed(5)
    out = []
    for _ in range(STEPS * MICRO_BATCHES * DATA):
        seq = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=generator)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def gathered(module: nn.Module, group) -> dict:
    """Every parameter whole: split ones all-gathered along their partition_dim (fused q/k/v
    blocks put back in q, k, v order)."""
    from zero.tp import is_split

    size, out = dist.get_world_size(group), {}
    for name, param in module.named_parameters():
        value = param.detach()
        if is_split(param):
            parts = [torch.empty_like(value) for _ in range(size)]
            dist.all_gather(parts, value.contiguous(), group=group)
            dim = param.partition_dim
            fused = 3 if name.endswith("qkv.weight") else 1
            blocks = [p.chunk(fused, dim=dim) for p in parts]
            value = torch.cat([torch.cat([b[i] for b in blocks], dim=dim)
                               for i in range(fused)], dim=dim)
        out[name] = value.clone()
    return out


# ---- training: tensor 2 x data 2 against one process ---------------------------------------
def config(stage: int, clip: float = 0.0, fp16: dict | None = None) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_clipping": clip,
            "fp16": fp16 or {"enabled": False},
            "gradient_accumulation_steps": MICRO_BATCHES,
            "train_batch_size": MICRO_BATCH * MICRO_BATCHES * DATA,  # data ranks only
            "optimizer": {"type": "AdamW", "params": HYPER},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
            "tensor_parallel": {"autotp_size": TENSOR}}


def train_ranks(rank, world, stages, clip=0.0, fp16=None):
    import zero
    from zero.parallel.grid import grid_for
    from zero.tp import VocabParallelEmbedding

    runs = []
    for stage in stages:
        grid = grid_for(tensor=TENSOR)
        model = build_gpt()
        model.embed = VocabParallelEmbedding.from_embedding(
            model.embed, grid.get_tensor_model_parallel_group())
        engine, _, _, _ = zero.initialize(model=model, config=config(stage, clip, fp16))
        assert engine.grid is grid and engine.world_size == DATA
        d, data = grid.get_data_parallel_rank(), batches()
        losses, norms, scales = [], [], []
        for step in range(STEPS):
            for k in range(MICRO_BATCHES):
                tokens, targets = data[(step * MICRO_BATCHES + k) * DATA + d]
                loss = engine(tokens, targets)
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            norms.append(engine.get_global_grad_norm().item())
            scales.append(engine.optimizer.cur_scale)
        report = engine.memory_report()["categories"]["optimizer_state"]["current"]
        consolidated = engine._consolidated_16bit_state_dict()  # Accelerate's get_state_dict
        runs.append({"losses": losses, "norms": norms, "scales": scales,
                     "skipped": engine.skipped_steps, "optimizer_bytes": report,
                     "numel": sum(p.numel() for p in engine.module.parameters()),
                     "whole": gathered(engine.module, grid.get_tensor_model_parallel_group()),
                     "consolidated": consolidated,
                     "local": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
                     "coord": (grid.get_data_parallel_rank(),
                               grid.get_tensor_model_parallel_rank(),
                               grid.get_model_parallel_world_size())})
    return runs


def reference(clip: float = 0.0, norms: list | None = None, steps: int = STEPS,
              micro_batches: int = MICRO_BATCHES):
    """Losses and parameters of one process on the global batches; `steps` x `micro_batches`
    covers batches() (STEPS x MICRO_BATCHES of the data ranks) in another grouping."""
    model, data = build_gpt(), batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                  eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                  foreach=False)
    losses = []  # per micro-batch: the mean of the data ranks' losses
    for step in range(steps):
        optimizer.zero_grad()
        for k in range(micro_batches):
            parts = [data[(step * micro_batches + k) * DATA + d] for d in range(DATA)]
            loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            (loss / micro_batches).backward()
            losses.append(loss.item())
        if clip:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        optimizer.step()
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def assert_matches_reference(runs, clip: float = 0.0):
    norms: list = []
    losses, expected = reference(clip, norms)
    if clip:  # the whole model's norm on every rank: split layers once, whole ones once
        for run in runs:
            assert run["norms"] == pytest.approx(norms, rel=1e-5)
            assert norms[0] > 10 * clip  # the clip acted
    mean = [sum(r["losses"][i] for r in runs[::TENSOR]) / DATA for i in range(len(losses))]
    assert mean == pytest.approx(losses, rel=1e-5)
    assert runs[0]["losses"] == runs[1]["losses"] and runs[2]["losses"] == runs[3]["losses"]
    for rank, run in enumerate(runs):
        assert set(run["whole"]) == set(expected)
        for name, value in run["whole"].items():
            error = ((value - expected[name]).norm() / expected[name].norm()).item()
            assert error < 1e-5, (rank, name, error)
    # not split (norms, row biases, the position table): bitwise equal on the tensor ranks
    for first, second in ((runs[0], runs[1]), (runs[2], runs[3])):
        for name in ("ln_f.weight", "blocks.0.self_attn.o_proj.bias",
                     "blocks.1.mlp.down_proj.bias", "position"):
            assert torch.equal(first["local"][name], second["local"][name]), name


def test_tensor_2_x_data_2_matches_single_process_and_zero_1_shards_state():
    stage0, stage1 = zip(*run_distributed(train_ranks, 4, args=((0, 1),), timeout=90))
    assert [r["coord"] for r in stage1] == [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    assert_matches_reference(stage1)
    for rank, (plain, sharded) in enumerate(zip(stage0, stage1)):
        assert plain["losses"] == pytest.approx(sharded["losses"], rel=1e-5)
        assert plain["optimizer_bytes"] >= 8 * plain["numel"]  # m and v, whole
        # ZeRO-1 over the 2 data ranks of this tensor slice: half (plus shard padding)
        assert 8 * plain["numel"] / 2 <= sharded["optimizer_bytes"] <= \
            8 * plain["numel"] / 2 + 8 * 64, rank
        # each tensor rank holds half of each split weight
        assert sharded["local"]["blocks.0.mlp.up_proj.weight"].shape == (2 * WIDTH, WIDTH)


def test_zero_2_under_tensor_parallelism_matches_single_process():
    runs = [r[0] for r in run_distributed(train_ranks, 4, args=((2,),), timeout=60)]
    assert_matches_reference(runs)
    # the whole model on rank 0 (Accelerate saves it), under the unsplit model's names
    assert all(run["consolidated"] is None for run in runs[1:])
    consolidated, whole = runs[0]["consolidated"], runs[0]["whole"]
    assert set(consolidated) == set(whole)
    for name, value in whole.items():
        assert torch.equal(consolidated[name], value), name


def test_gradient_clipping_clips_by_the_whole_models_norm_over_the_tensor_ranks():
    runs = [r[0] for r in run_distributed(train_ranks, 4, args=((1,), 0.05), timeout=60)]
    assert_matches_reference(runs, clip=0.05)


def test_fp16_under_tensor_parallelism_follows_fp32_and_agrees_on_the_loss_scale():
    losses, _ = reference()
    fp16 = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1}
    runs = [r[0] for r in run_distributed(train_ranks, 4, args=((1,), 0.0, fp16), timeout=60)]
    for run in runs:
        assert run["skipped"] == 0 and run["scales"] == runs[0]["scales"]
        assert run["scales"][-1] > 2.0 ** 8  # grew: no overflow
    mean = [sum(r["losses"][i] for r in runs[::TENSOR]) / DATA for i in range(len(losses))]
    assert mean == pytest.approx(losses, rel=1e-2)
    # 2^24 overflows fp16 gradients: every rank skips the same steps and lowers the scale
    fp16["initial_scale_power"] = 24
    runs = [r[0] for r in run_distributed(train_ranks, 4, args=((1,), 0.0, fp16), timeout=60)]
    assert all((r["skipped"], r["scales"]) == (runs[0]["skipped"], runs[0]["scales"])
               for r in runs) and runs[0]["skipped"] >= 1


# ---- errors that name the sizes ------------------------------------------------------------
def refusal_ranks(rank, world):
    import zero

    errors = []
    for change in ({"zero_optimization": {"stage": 3}}, {"tensor_parallel": {"autotp_size": 3}}):
        try:
            zero.initialize(model=build_gpt(), config={**config(1), **change})
        except (NotImplementedError, ValueError) as error:
            errors.append(str(error))
    import zero.compat.deepspeed as deepspeed
    from zero.tp import ColumnParallelLinear

    without_block = {k: v for k, v in config(1).items() if k != "tensor_parallel"}
    model = deepspeed.tp_model_init(build_gpt(), tp_size=2, dtype=torch.float32)
    engine, _, _, _ = deepspeed.initialize(model=model, config=without_block)
    converted = isinstance(engine.module.blocks[0].mlp.up_proj, ColumnParallelLinear)
    try:
        deepspeed.initialize(model=deepspeed.tp_model_init(build_gpt(), 4, torch.float32),
                             config=config(1))
    except ValueError as error:
        errors.append(str(error))
    return errors, converted, engine.world_size


def test_initialize_refuses_what_does_not_compose_naming_it():
    for errors, converted, data_ranks in run_distributed(refusal_ranks, 4, timeout=60):
        assert converted and data_ranks == 2  # tp_model_init alone turns it on
        assert "autotp_size = 2 in the config but tp_model_init(tp_size=4)" in errors[2]
        assert "stage 3 with tensor parallelism" in errors[0] and "0, 1 or 2" in errors[0]
        assert "tensor_parallel.autotp_size = 3 does not divide the world size 4" in errors[1]
    with pytest.raises(ValueError, match="tensor 3 does not divide the world size 8"):
        DeviceMesh.build(8, tensor=3)
    with pytest.raises(ValueError, match=r"data 2 x tensor 3 = 6 ranks, but the world size is 4"):
        DeviceMesh.build(4, data=2, tensor=3)
    mesh = DeviceMesh.build(8, data=2, tensor=4)
    assert mesh.tensor_parallel_partition() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.data_parallel_partition() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def different_inputs_ranks(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=build_gpt(), config=config(1))
    tokens, targets = batches()[rank]  # a world-sized split: the tensor ranks differ
    with pytest.raises(ValueError) as error:
        engine(tokens, targets)
    return str(error.value)


def test_tensor_ranks_given_different_batches_all_raise_on_the_first_forward():
    for message in run_distributed(different_inputs_ranks, 4, timeout=60):
        assert "tensor-parallel ranks" in message and "different inputs" in message
        assert "get_data_parallel_rank()" in message
