"""DeepSpeed's convert_zero_checkpoint_to_fp32_state_dict and zero_to_fp32.py on zero's
checkpoints: torch and safetensors files, sharded with Hugging Face's index, tied weights
stored once, written from the files alone; bad input named before anything is loaded."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import training
from distributed_harness import run_distributed, subprocess_env

pytestmark = pytest.mark.timeout(300)


def _train_and_save(rank, world, stage, save_dir):
    import zero

    config = training.engine_config(stage, gas=1, scheduler=False,
                                     **({"stage3_param_persistence_threshold": 10}
                                        if stage == 3 else {}))
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    state = engine.module_state_dict()  # fp32 training: the master weights, gathered on rank 0
    return {k: v.clone() for k, v in state.items()} if rank == 0 else None


@pytest.fixture(scope="module", params=[2, 3])
def saved(request, tmp_path_factory):
    """(checkpoint dir, the engine's gathered weights) after training at the given stage."""
    save_dir = tmp_path_factory.mktemp(f"stage{request.param}")
    weights = run_distributed(_train_and_save, 2, args=(request.param, str(save_dir)))[0]
    return str(save_dir), weights


def test_the_bin_export_loads_strictly_into_the_plain_model_and_equals_the_engine(saved, tmp_path):
    from zero.compat.deepspeed import utils

    save_dir, weights = saved
    written = utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path)
    assert written == ["pytorch_model.bin"]
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    model = training.make_model()
    model.load_state_dict(state, strict=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name  # bit for bit
    # tied weights: one tensor under both names
    assert state["head.weight"].data_ptr() == state["token_embedding.weight"].data_ptr()


@pytest.mark.parametrize("safe", [False, True])
def test_a_sharded_export_has_the_index_and_no_shard_over_the_limit(saved, tmp_path, safe):
    from safetensors.torch import load_file

    from zero.checkpoint_export import (convert_zero_checkpoint_to_fp32_state_dict,
                                        get_fp32_state_dict_from_zero_checkpoint)

    save_dir, _ = saved
    limit = 20_000
    written = convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path, max_shard_size="20KB",
                                                         safe_serialization=safe)
    stem = "model" if safe else "pytorch_model"
    index_name = f"{stem}.safetensors.index.json" if safe else f"{stem}.bin.index.json"
    shards = written[:-1]
    assert written[-1] == index_name and len(shards) > 2
    assert shards[0] == f"{stem}-00001-of-{len(shards):05d}." + ("safetensors" if safe else "bin")
    index = json.loads((tmp_path / index_name).read_text())
    expected = get_fp32_state_dict_from_zero_checkpoint(save_dir)
    loaded = {}
    for shard in shards:
        part = load_file(tmp_path / shard) if safe else torch.load(tmp_path / shard,
                                                                   weights_only=True)
        tensors = {t.data_ptr(): t for t in part.values()}
        assert len(tensors) == 1 or sum(t.numel() * t.element_size()
                                        for t in tensors.values()) <= limit, shard
        assert all(index["weight_map"][name] == shard for name in part)
        loaded.update(part)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for n, t in expected.items() if n != "head.weight")
    # safetensors cannot alias: the tied head is stored once, under its first name
    assert set(loaded) == set(expected) - ({"head.weight"} if safe else set())
    for name, value in loaded.items():
        assert torch.equal(value, expected[name]), name


def test_the_script_beside_the_checkpoint_exports_without_a_process_group(saved, tmp_path):
    from safetensors.torch import load_file

    save_dir, weights = saved
    env = subprocess_env()
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(save_dir, "zero_to_fp32.py"), save_dir,
                           str(out), "--safe_serialization"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    state = load_file(out / "model.safetensors")
    for name, value in state.items():
        assert torch.equal(value, weights[name]), name


def test_a_bad_shard_size_names_the_value(saved, tmp_path):
    from zero.checkpoint_export import convert_zero_checkpoint_to_fp32_state_dict

    with pytest.raises(ValueError, match="max_shard_size='5 gigs'"):
        convert_zero_checkpoint_to_fp32_state_dict(saved[0], tmp_path, max_shard_size="5 gigs")


def test_a_newer_format_version_is_refused_naming_the_file(saved, tmp_path):
    import shutil

    from zero import checkpoint_files
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint

    copy = tmp_path / "copy"
    shutil.copytree(saved[0], copy)
    tag = (copy / "latest").read_text().strip()
    model_file = copy / tag / "model_states.pt"
    state = torch.load(model_file, weights_only=False)
    state["format_version"] = 99
    torch.save(state, model_file)
    os.remove(copy / tag / "manifest.json")  # as if written without one
    with pytest.raises(checkpoint_files.CorruptCheckpoint,
                       match=r"model_states.pt is in checkpoint format 99.*reads format 1"):
        get_fp32_state_dict_from_zero_checkpoint(str(copy))


def _load_into_a_wider_model(rank, world, save_dir):
    import zero

    config = training.engine_config(2, gas=1, scheduler=False)
    wider = dataclasses.replace(training.MODEL, n_embd=48)
    engine, _, _, _ = zero.initialize(model=training.make_model(wider), config=config)
    before = {k: v.clone() for k, v in engine.module_state_dict().items()}
    try:
        engine.load_checkpoint(save_dir)
    except ValueError as error:
        after = engine.module_state_dict()
        untouched = all(torch.equal(before[k], after[k]) for k in before)
        return str(error), untouched
    return None, None


def test_a_checkpoint_of_another_model_is_named_and_nothing_is_loaded(saved):
    message, untouched = run_distributed(_load_into_a_wider_model, 2, args=(saved[0],))[1]
    assert message is not None and "model_states.pt is of another model" in message
    assert "token_embedding.weight: saved (97, 32), the model has (97, 48)" in message
    assert untouched


def test_lazy_mode_builds_each_tensor_on_contiguous(saved):
    from zero.checkpoint_export import LazyTensor, get_fp32_state_dict_from_zero_checkpoint

    save_dir, _ = saved
    eager = get_fp32_state_dict_from_zero_checkpoint(save_dir)
    lazy = get_fp32_state_dict_from_zero_checkpoint(save_dir, lazy_mode=True)
    assert list(lazy) == list(eager)
    assert all(isinstance(value, LazyTensor) for value in lazy.values())
    assert lazy["head.weight"] is lazy["token_embedding.weight"]  # tied: one lazy tensor
    for name, value in lazy.items():
        assert (value.shape, value.dtype) == (eager[name].shape, eager[name].dtype), name
        assert torch.equal(value.contiguous(), eager[name]), name


def test_an_output_file_path_writes_that_file(saved, tmp_path):
    """DeepSpeed's older form: `python zero_to_fp32.py . pytorch_model.bin`, or output_file=."""
    from safetensors.torch import load_file

    from zero.checkpoint_export import (convert_zero_checkpoint_to_fp32_state_dict,
                                        get_fp32_state_dict_from_zero_checkpoint, main)

    save_dir, _ = saved
    expected = get_fp32_state_dict_from_zero_checkpoint(save_dir)
    target = tmp_path / "out" / "pytorch_model.bin"
    # one file, whatever max_shard_size says
    assert convert_zero_checkpoint_to_fp32_state_dict(save_dir, target, max_shard_size="1KB") \
        == ["pytorch_model.bin"]
    assert target.is_file() and os.listdir(tmp_path / "out") == ["pytorch_model.bin"]
    state = torch.load(target, weights_only=True)
    assert set(state) == set(expected) and all(torch.equal(state[k], expected[k]) for k in state)
    assert state["head.weight"].data_ptr() == state["token_embedding.weight"].data_ptr()

    assert convert_zero_checkpoint_to_fp32_state_dict(
        save_dir, output_file=str(tmp_path / "weights.pt")) == ["weights.pt"]
    assert set(torch.load(tmp_path / "weights.pt", weights_only=True)) == set(expected)

    main([save_dir, str(tmp_path / "model.safetensors")])  # the suffix picks safetensors
    assert set(load_file(tmp_path / "model.safetensors")) == set(expected) - {"head.weight"}

    with pytest.raises(ValueError, match="safe_serialization writes safetensors but .*x.bin"):
        convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path / "x.bin",
                                                   safe_serialization=True)
    # an existing directory stays a directory, whatever its name
    (tmp_path / "dir.bin").mkdir()
    assert convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path / "dir.bin") == \
        ["pytorch_model.bin"]
    assert (tmp_path / "dir.bin" / "pytorch_model.bin").is_file()


def _train_with_a_frozen_tied_embedding(rank, world, save_dir):
    import zero

    model = training.make_model()
    model.token_embedding.weight.requires_grad_(False)  # also head.weight: the same parameter
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(
        2, gas=1, scheduler=False))
    training.train_engine(engine, rank, world, 1, 1)
    engine.save_checkpoint(save_dir)


def test_a_frozen_tied_weight_is_one_tensor_under_every_name(tmp_path):
    from safetensors.torch import load_file

    from zero.checkpoint_export import (convert_zero_checkpoint_to_fp32_state_dict,
                                        get_fp32_state_dict_from_zero_checkpoint)

    run_distributed(_train_with_a_frozen_tied_embedding, 2, args=(str(tmp_path / "ckpt"),))
    state = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "ckpt"))
    assert state["head.weight"] is state["token_embedding.weight"]
    written = convert_zero_checkpoint_to_fp32_state_dict(str(tmp_path / "ckpt"), tmp_path / "bin")
    exported = torch.load(tmp_path / "bin" / written[0], weights_only=True)
    assert exported["head.weight"].data_ptr() == exported["token_embedding.weight"].data_ptr()
    model = training.make_model()
    model.load_state_dict(exported, strict=True)
    # safetensors cannot alias: the first name only (from_pretrained ties the rest again)
    convert_zero_checkpoint_to_fp32_state_dict(str(tmp_path / "ckpt"), tmp_path / "st",
                                               safe_serialization=True)
    assert "head.weight" not in load_file(tmp_path / "st" / "model.safetensors")
    without = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "ckpt"),
                                                       exclude_frozen_parameters=True)
    assert "head.weight" not in without and "token_embedding.weight" not in without


def _train_hf_gpt2_and_save(rank, world, save_dir):
    import transformers

    import zero

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    config = training.engine_config(3, gas=1, scheduler=False,
                                    stage3_param_persistence_threshold=10)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(2):
        ids = torch.randint(0, 64, (2, 16), generator=generator)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    engine.save_checkpoint(save_dir)
    state = engine.module_state_dict()
    return {k: v.clone() for k, v in state.items()} if rank == 0 else None


def test_the_safetensors_export_of_an_hf_model_loads_with_from_pretrained(tmp_path):
    """A GPT-2 trained at stage 3, exported to sharded safetensors with the HF index: the
    model from_pretrained builds holds the engine's fp32 weights bit for bit (the tied head
    stored once and re-tied)."""
    transformers = pytest.importorskip("transformers")
    from zero.compat.deepspeed.utils.zero_to_fp32 import \
        convert_zero_checkpoint_to_fp32_state_dict

    weights = run_distributed(_train_hf_gpt2_and_save, 2, args=(str(tmp_path / "ckpt"),))[0]
    out = tmp_path / "export"
    written = convert_zero_checkpoint_to_fp32_state_dict(str(tmp_path / "ckpt"), str(out),
                                                         max_shard_size="20KB",
                                                         safe_serialization=True)
    assert len(written) > 1 and (out / "model.safetensors.index.json").exists()
    transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                            n_positions=16).save_pretrained(out)
    model = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    for name, value in model.named_parameters():
        assert torch.equal(value, weights[name]), name
