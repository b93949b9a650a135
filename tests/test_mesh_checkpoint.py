"""Checkpoints of a model split over pipeline stages or tensor ranks (zero.checkpoint_mesh), on
4 gloo ranks: each part saves under DeepSpeed's names; a fresh engine of the same layout
loads and continues exactly as the uninterrupted run; pipeline stages load at another
data-parallel size; another layout (the whole model, or split again) loads the same master
weights and Adam moments (checkpoint_remesh); zero_to_fp32 puts the parts together into the
unsplit model's state dict (pipeline stages, tensor slices, fused q/k/v blocks and HF GPT-2's
Conv1D layout)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from distributed_harness import run_distributed
from training import assert_same_states, universal_values
from tp_models import SEQ, VOCAB, build_gpt, hf_models
from zero.models.pipe_gpt import cross_entropy, pipe_layers, sequential
from zero.models.tiny_gpt import GPTConfig, synthetic_batches

HYPER = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
MICRO_BATCHES, DATA = 4, 2


def params(module) -> dict:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ---- pipeline: 2 stages x data 2 -------------------------------------------------------------
PIPE_MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=4, n_head=2, n_embd=16)


def pipe_engine(micro_batch: int, tied: bool = True):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(
        layers=pipe_layers(PIPE_MODEL, tied=tied), num_stages=2, loss_fn=cross_entropy,
        partition_method="uniform", seed_layers=True)
    config = {"train_micro_batch_size_per_gpu": micro_batch,
              "gradient_accumulation_steps": MICRO_BATCHES,
              "optimizer": {"type": "AdamW", "params": HYPER},
              "zero_optimization": {"stage": 1, "reduce_bucket_size": 500}}
    return deepspeed.initialize(model=module, config=config)[0]


def pipe_batches(step: int, data_ranks: list[int]):
    """Step `step`'s micro-batches for the data ranks `data_ranks` (two ranks' joined)."""
    batches = synthetic_batches(PIPE_MODEL, 2, 3 * MICRO_BATCHES * DATA, seed=7)
    for k in range(MICRO_BATCHES):
        parts = [batches[(step * MICRO_BATCHES + k) * DATA + d] for d in data_ranks]
        yield torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def pipe_ranks(rank, world, root):
    import zero

    engine = pipe_engine(micro_batch=2)
    mine = [engine.grid.get_data_parallel_id()]
    for step in range(2):
        engine.train_batch(pipe_batches(step, mine))
    engine.save_checkpoint(root, tag="two", client_state={"epoch": 3})
    saved = params(engine.module)
    loss = engine.train_batch(pipe_batches(2, mine)).item()
    fresh = pipe_engine(micro_batch=2)
    _, client = fresh.load_checkpoint(root)
    loaded = same(params(fresh.module), saved)
    fresh_loss = fresh.train_batch(pipe_batches(2, mine)).item()
    continued = same(params(fresh.module), params(engine.module)) and fresh_loss == loss
    # the same model whole on every rank (another layout): the parts joined, resharded over 4
    plain, _, _, _ = zero.initialize(model=sequential(pipe_layers(PIPE_MODEL)), config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": HYPER},
        "zero_optimization": {"stage": 1}})
    _, plain_client = plain.load_checkpoint(root)
    plain.save_checkpoint(root + "-whole", tag="resaved")
    # an untied head: stage 1's part differs, stage 0's fits; every rank raises, none waits
    with pytest.raises(ValueError) as one_part:
        pipe_engine(micro_batch=2, tied=False).load_checkpoint(root)
    return {"one_part": str(one_part.value), "whole": params(plain.module),
            "plain_client": plain_client, "plain_steps": plain.global_steps, "stage": engine.grid.get_stage_id(), "saved": saved, "loss": loss,
            "after": params(engine.module), "loaded": loaded, "continued": continued,
            "client": client, "steps": fresh.global_steps}


def pipe_reload_ranks(rank, world, root):
    """2 stages x data 1: the 4-rank checkpoint resharded over one data rank."""
    engine = pipe_engine(micro_batch=4)
    engine.load_checkpoint(root)
    loss = engine.train_batch(pipe_batches(2, [0, 1])).item()
    return {"stage": engine.grid.get_stage_id(), "loss": loss, "after": params(engine.module)}


def test_pipeline_parts_save_load_reshard_refuse_and_export(tmp_path):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint

    root = str(tmp_path / "pipe")
    results = run_distributed(pipe_ranks, 4, args=(root,), timeout=120)
    assert sorted(os.listdir(os.path.join(root, "two"))) == [
        "manifest.json", "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_01_optim_states.pt"]
    for result in results:
        assert result["loaded"] and result["continued"] and result["steps"] == 3
        assert result["client"] == {"epoch": 3}
        assert result["plain_client"] == {"epoch": 3} and result["plain_steps"] == 2
        assert "with other trainable parameters" in result["one_part"]

    # the same batch as one data rank: the resharded state continues the same training
    reloaded = run_distributed(pipe_reload_ranks, 2, args=(root,), timeout=90)
    for result in reloaded:
        assert result["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)
        expected = results[2 * result["stage"]]["after"]
        for name, value in result["after"].items():
            assert torch.allclose(value, expected[name], rtol=1e-5, atol=1e-6), name

    # both stages' layers in one state dict: stage 0's value of the tied embedding
    exported = get_fp32_state_dict_from_zero_checkpoint(root)
    whole = {**results[2]["saved"], **results[0]["saved"]}
    assert set(exported) == set(sequential(pipe_layers(PIPE_MODEL)).state_dict())
    for name, value in whole.items():
        assert torch.equal(exported[name], value), name
    sequential(pipe_layers(PIPE_MODEL)).load_state_dict(exported, strict=True)
    # loaded whole on 4 ranks: the same weights, and (saved again) the same Adam moments
    for result in results:
        for name, value in result["whole"].items():
            assert torch.equal(value, exported[name]), name
    assert_same_states(root, root + "-whole")


# ---- tensor 2 x data 2 -----------------------------------------------------------------------
TP_STEPS, TP_MICRO = 3, 2


def tp_config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": TP_MICRO, "gradient_accumulation_steps": 2,
            "train_batch_size": TP_MICRO * 2 * DATA, "gradient_clipping": 0.0,  # as tp_reference
            "optimizer": {"type": "AdamW", "params": HYPER},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
            "tensor_parallel": {"autotp_size": 2}}


def tp_batches():
    generator = torch.Generator().manual_seed(5)
    out = []
    for _ in range(TP_STEPS * 2 * DATA):
        seq = torch.randint(0, VOCAB, (TP_MICRO, SEQ + 1), generator=generator)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def tp_engine(stage: int):
    import zero
    from zero.parallel.grid import grid_for
    from zero.tp import VocabParallelEmbedding

    model = build_gpt()
    model.embed = VocabParallelEmbedding.from_embedding(
        model.embed, grid_for(tensor=2).get_tensor_model_parallel_group())
    return zero.initialize(model=model, config=tp_config(stage))[0]


def tp_step(engine, step: int) -> None:
    d, data = engine.grid.get_data_parallel_rank(), tp_batches()
    for k in range(2):
        tokens, targets = data[(step * 2 + k) * DATA + d]
        engine.backward(engine(tokens, targets))
        engine.step()


def tp_ranks(rank, world, root, hf_root):
    import zero

    results = {}
    for stage in (1, 2):
        engine = tp_engine(stage)
        for step in range(2):
            tp_step(engine, step)
        engine.save_checkpoint(f"{root}/stage{stage}", tag="two")
        tp_step(engine, 2)
        fresh = tp_engine(stage)
        fresh.load_checkpoint(f"{root}/stage{stage}")
        tp_step(fresh, 2)
        results[stage] = same(params(fresh.module), params(engine.module))
    # other layouts: the tensor-parallel checkpoint loaded whole on 4 ranks, saved, and that
    # loaded back into tensor 2 x data 2
    whole = {key: value for key, value in tp_config(1).items() if key != "tensor_parallel"}
    plain = zero.initialize(model=build_gpt(),
                            config={**whole, "train_batch_size": TP_MICRO * 2 * world})[0]
    plain.load_checkpoint(f"{root}/stage1")
    plain.save_checkpoint(f"{root}/whole", tag="resaved")
    again = tp_engine(1)
    again.load_checkpoint(f"{root}/whole")
    again.save_checkpoint(f"{root}/again", tag="resaved")
    if "gpt2" in dict(hf_models()):  # HF's Conv1D (weights [in, out]) and a fused c_attn
        one = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
        split = zero.initialize(model=dict(hf_models())["gpt2"], config={
            **tp_config(1), **one, "train_batch_size": DATA})[0]
        split.save_checkpoint(hf_root, tag="converted")
        plain = zero.initialize(model=dict(hf_models())["gpt2"], config={
            **whole, **one, "train_batch_size": world})[0]
        plain.load_checkpoint(hf_root)
        plain.save_checkpoint(hf_root + "-whole", tag="resaved")
        split = zero.initialize(model=dict(hf_models())["gpt2"], config={
            **tp_config(1), **one, "train_batch_size": DATA})[0]
        split.load_checkpoint(hf_root + "-whole")
        split.save_checkpoint(hf_root + "-again", tag="resaved")
    dist.barrier()
    return results


def tp_reference(steps: int) -> dict:
    model, data = build_gpt(), tp_batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                  eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                  foreach=False)
    for step in range(steps):
        optimizer.zero_grad()
        for k in range(2):
            parts = [data[(step * 2 + k) * DATA + d] for d in range(DATA)]
            loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            (loss / 2).backward()
        optimizer.step()
    return model.state_dict()


def test_tensor_parts_load_exactly_and_export_the_unsplit_model(tmp_path):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint
    from zero.checkpoint_to_universal import convert

    root, hf_root = str(tmp_path / "tp"), str(tmp_path / "hf")
    for result in run_distributed(tp_ranks, 4, args=(root, hf_root), timeout=180):
        assert result == {1: True, 2: True}  # continued bitwise after the load
    expected = tp_reference(steps=2)
    for stage in (1, 2):
        exported = get_fp32_state_dict_from_zero_checkpoint(f"{root}/stage{stage}")
        assert list(exported) == list(expected)
        for name, value in exported.items():
            error = ((value - expected[name]).norm() / expected[name].norm()).item()
            assert error < 1e-5, (stage, name, error)
        build_gpt().load_state_dict(exported, strict=True)
    # tensor 2 -> whole -> tensor 2: the same master weights and Adam moments throughout
    assert_same_states(f"{root}/stage1", f"{root}/whole")
    assert_same_states(f"{root}/stage1", f"{root}/again")
    # DeepSpeed's universal checkpoint of the tensor-split one is the whole one's
    split = universal_values(convert(f"{root}/stage1/two", f"{root}/universal/split"))
    whole = universal_values(convert(f"{root}/whole/resaved", f"{root}/universal/whole"))
    assert split.keys() == whole.keys() and len(split) > 3 * len(expected)
    for file, value in whole.items():
        assert torch.equal(split[file], value) if torch.is_tensor(value) else \
            split[file] == value or file == "optimizer_state.pt", file
    models = dict(hf_models())
    if "gpt2" in models:
        original = models["gpt2"].state_dict()
        assert original["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # [in, 3 out]
        for path in (hf_root, hf_root + "-whole", hf_root + "-again"):
            exported = get_fp32_state_dict_from_zero_checkpoint(path)
            assert set(exported) == set(original)
            for name, value in exported.items():
                assert torch.equal(value, original[name]), (path, name)
