"""The memory estimate and report of a model split over pipeline stages or tensor ranks: each
rank's part (its stage's layers, AutoTP's linears cut to its slice) estimated with N = its
data-parallel ranks equals what the engine's registry measures on 4 gloo ranks, byte for
byte; the reports say where each rank sits, `zero-mem report` lists Ψ per part, and the
command line takes --pipeline-stages / --tensor-parallel."""
from __future__ import annotations

import json

import pytest
import torch

from distributed_harness import run_distributed
from tp_models import build_gpt
from zero.models.pipe_gpt import cross_entropy, pipe_layers
from zero.models.tiny_gpt import GPTConfig, synthetic_batches
from zero.reports import estimate as est

MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=4, n_head=2, n_embd=16)
MODEL_STATES = ("param", "gradient", "fp32_master", "optimizer_state")


def measured(engine) -> dict:
    report = engine.memory_report()
    # model states at their peak (stage 2's gradient shard is given back between steps)
    return {"categories": {name: report["categories"][name]["peak"] for name in MODEL_STATES},
            "mesh": report["mesh"], "numel": report["numel"]}


def pipeline_ranks(rank, world, precision, reports):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(layers=pipe_layers(MODEL), num_stages=2,
                                           loss_fn=cross_entropy, partition_method="uniform")
    engine = deepspeed.initialize(model=module, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": precision == "bf16"}, "zero_optimization": {"stage": 1},
        "memory_report": {"path": reports, "every_n_steps": 1}})[0]
    engine.train_batch(iter(synthetic_batches(MODEL, 2, 2, seed=1)))
    return measured(engine)


def tensor_ranks(rank, world):
    import zero

    engine = zero.initialize(model=build_gpt(), config={
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}})[0]
    # one step (the same batch everywhere: a tensor group's ranks must see the same one), so
    # the gradient shards (one micro-step per step: sharded) have held their memory
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    engine.backward(engine(tokens, tokens))
    engine.step()
    return measured(engine)


def estimated(shapes, precision: str, data: int, gas: int) -> dict:
    setup = est.Setup(world_size=data, precision=precision, gradient_accumulation_steps=gas)
    estimate = est.estimate(shapes, setup, 1)
    return {name: estimate.categories[name]["bytes"] for name in MODEL_STATES}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_each_pipeline_stage_is_estimated_as_the_engine_measures_it(tmp_path, precision):
    from zero.reports import render
    from zero.reports.table import format_table

    reports = str(tmp_path / "memory.jsonl")
    results = run_distributed(pipeline_ranks, 4, args=(precision, reports), timeout=90)
    parts = est.mesh_parts(pipe_layers(MODEL), est.MeshSizes.of(4, 2, 1), "uniform", "pipe_gpt")
    assert [part.layers for part in parts] == [(0, 4), (4, 7)]
    for rank, result in enumerate(results):
        stage = rank // 2
        assert result["mesh"] == {"pipe": 2, "data": 2, "tensor": 1, "stage": stage,
                                  "data_rank": rank % 2, "tensor_rank": 0}
        assert result["categories"] == estimated(parts[stage].shapes, precision, data=2,
                                                 gas=2), rank
    assert results[0]["numel"] != results[2]["numel"]
    table = format_table(render.load([str(tmp_path)]).last_reports())
    assert (f"mesh pipe 2 x data 2 x tensor 1, Ψ per part (stage 0 tensor 0: "
            f"{results[0]['numel']:,}, stage 1 tensor 0: {results[2]['numel']:,})") in table
    assert "rank 3 (stage 1, tensor 0)" in table


def test_each_tensor_slice_is_estimated_as_the_engine_measures_it():
    results = run_distributed(tensor_ranks, 4, timeout=90)
    model = build_gpt()
    [part] = est.mesh_parts(model, est.MeshSizes.of(4, 1, 2), "parameters", "GPT")
    whole = sum(p.numel() for p in model.parameters())
    assert part.shapes.trainable_numel < whole  # the blocks' linears are halved
    for result in results:
        assert result["mesh"]["tensor"] == 2 and result["mesh"]["data"] == 2
        assert result["categories"] == estimated(part.shapes, "fp32", data=2, gas=1)


def test_the_command_line_estimates_each_part_and_names_bad_sizes(tmp_path, capsys):
    pytest.importorskip("transformers")
    from zero.reports.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}))
    args = ["estimate", "--hf-config", str(config), "--world-size", "8", "--stage", "1"]
    assert main(args + ["--json"]) == 0
    whole = json.loads(capsys.readouterr().out)["model"]["trainable_numel"]
    assert main(args + ["--tensor-parallel", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"] == {"pipe": 1, "data": 4, "tensor": 2, "world_size": 8}
    [part] = out["parts"]
    # q/k/v/o and the MLP's three linears are halved; embeddings, norms and the head are not
    model = est.model_from_hf_config(str(config))
    linears = sum(m.weight.numel() for name, m in model.named_modules()
                  if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"))
    assert part["model"]["trainable_numel"] == whole - linears // 2
    assert part["options"][1]["stage"] == 1 and part["options"][1]["numel"] > 0
    assert main(args + ["--tensor-parallel", "2"]) == 0
    assert "mesh: pipe 1 x data 4 x tensor 2 = 8 ranks" in capsys.readouterr().out
    # a config written for the mesh: its batch keys count the 4 data ranks
    ds_config = tmp_path / "ds_config.json"
    ds_config.write_text(json.dumps({
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "data_parallel_size": 4,
        "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}}))
    assert main(args + ["--config", str(ds_config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mesh"]["data"] == 4
    assert main(args + ["--tensor-parallel", "3"]) == 2
    assert "tensor 3 does not divide the world size 8" in capsys.readouterr().err
    assert main(args + ["--pipeline-stages", "2"]) == 2
    assert "list of layers" in capsys.readouterr().err


def test_the_command_line_cuts_a_layer_list_into_stages_and_lists_what_the_engine_builds(
        tmp_path, capsys):
    from zero.reports.cli import main

    factory = tmp_path / "layers.py"
    factory.write_text(
        "from zero.models.pipe_gpt import pipe_layers\n"
        "from zero.models.tiny_gpt import GPTConfig\n\n"
        "def layers():\n"
        "    return pipe_layers(GPTConfig(vocab_size=61, block_size=8, n_layer=4, n_head=2, "
        "n_embd=16))\n")
    args = ["estimate", "--model", f"{factory}:layers", "--world-size", "4",
            "--pipeline-stages", "2", "--partition-method", "uniform"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"] == {"pipe": 2, "data": 2, "tensor": 1, "world_size": 4}
    parts = est.mesh_parts(pipe_layers(MODEL), est.MeshSizes.of(4, 2, 1), "uniform", "pipe_gpt")
    assert [p["layers"] for p in out["parts"]] == [[0, 4], [4, 7]]
    for part, expected in zip(out["parts"], parts):
        assert part["model"]["trainable_numel"] == expected.shapes.trainable_numel
        # the embedding is tied over both stages: ZeRO-2 is not built, stage 3 never is
        assert {option["stage"] for option in part["options"]} == {0, 1}
        # the tied weight counts 1/2 in the norm: an engine group of its own
        assert len(expected.shapes.groups) == 2
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "==== pipeline stage 1 of 2 ====" in text and "ZeRO stages built with model " \
        "parallelism: 0, 1" in text
