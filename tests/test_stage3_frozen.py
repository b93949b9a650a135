"""ZeRO-3 with frozen parameters (a LoRA model: the base frozen, the adapters trained): the
frozen base is partitioned and gathered with its units like the rest, keeps no gradients,
master or optimizer state, trains like single-process PyTorch, checkpoints whole, and the
estimate counts its shard exactly."""
import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS = 6
GAS = 2
PERSISTENCE = 40  # elements: the LoRA matrices (128+) partition, the norms' 32 stay whole


def _config(precision="fp32", **extra):
    return training.engine_config(3, gas=GAS, precision=precision,
                                  stage3_param_persistence_threshold=PERSISTENCE, **extra)


def _engine(init: bool = False, precision="fp32", **extra):
    import zero

    config = _config(precision, **extra)
    if init:  # built partitioned, then frozen: zero.Init's shards are adopted
        with zero.Init(config_dict_or_path=config):
            model = training.make_model(lora=True)
    else:
        model = training.make_model(lora=True)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


def _train(rank, world, init):
    engine = _engine(init)
    trained = {id(p) for group in engine.groups for p in group.params}
    frozen = [p for p in engine.module.parameters() if not p.requires_grad]
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    released = {name: p.numel() == 0 for name, p in engine.module.named_parameters()
                if not p.requires_grad}
    state = engine.module_state_dict()
    return (losses, engine.core.frozen_group_count, any(id(p) in trained for p in frozen),
            released, {k: v.float() for k, v in state.items()} if rank == 0 else None)


@pytest.mark.parametrize("init", [False, True], ids=["whole", "zero.Init"])
def test_a_lora_model_trains_like_torch_with_its_frozen_base_partitioned(init):
    config = _config()
    ref_losses, ref_params = training.train_reference(2, STEPS, GAS, config, lora=True)
    initial = training.parameters_of(training.make_model(lora=True))
    results = run_distributed(_train, 2, args=(init,), timeout=240)
    for losses, frozen_groups, frozen_in_optimizer, released, _ in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert frozen_groups == 1 and not frozen_in_optimizer
        # every frozen parameter above the persistence threshold is partitioned: outside
        # forward and backward no rank holds it whole (the norms and biases stay whole)
        assert released == {name: value.numel() > PERSISTENCE
                            for name, value in initial.items() if "lora_" not in name}
    state = results[0][4]
    for name, expected in ref_params.items():
        assert training.relative_error(state[name], expected) < 1e-5, name
        if "lora_" not in name:  # frozen: exactly as built
            assert torch.equal(state[name], initial[name]), name
        else:
            assert not torch.equal(state[name], initial[name]), name  # it trained


def _layout_losses(rank, world, extra):
    return training.train_engine(_engine(**extra), rank, world, STEPS, GAS)


@pytest.mark.parametrize("world,extra,env", [
    (4, {"zero_hpz_partition_size": 2, "stage3_max_reuse_distance": 0},
     {"LOCAL_WORLD_SIZE": "2"}),
    (4, {"mics_shard_size": 2}, {}),
    (2, {"offload_param": {"device": "cpu", "pin_memory": False}}, {}),
], ids=["hpZ", "MiCS", "offload-param"])
def test_the_frozen_group_trains_like_torch_under_hpz_mics_and_offload_param(world, extra, env):
    """The frozen group takes the partitioned groups' layouts: hpZ's secondary copies (kept
    across steps: frozen values never change), MiCS's shard groups, a host shard."""
    ref_losses, _ = training.train_reference(world, STEPS, GAS, _config(), lora=True)
    for losses in run_distributed(_layout_losses, world, args=(extra,), env=env, timeout=240):
        assert losses == pytest.approx(ref_losses, rel=1e-5)


def _measure(rank, world, precision, extra):
    engine = _engine(precision=precision, **extra)
    training.train_engine(engine, rank, world, 1, GAS)
    report = engine.memory_report()
    return {name: entry["peak"] for name, entry in report["categories"].items()}, \
        {name: entry["expected"] for name, entry in report["categories"].items()
         if "expected" in entry}, report["frozen_numel"], report["model_state_formula"]


@pytest.mark.parametrize("precision,extra", [
    ("bf16", {}),
    ("fp32", {"offload_param": {"device": "cpu", "pin_memory": False}}),
], ids=["bf16", "fp32-offload-param"])
def test_the_frozen_base_costs_its_shard_alone_and_the_estimate_counts_it(precision, extra):
    from zero.reports import estimate as est

    world = 2
    peak, expected, frozen_numel, formula = run_distributed(
        _measure, world, args=(precision, extra), timeout=120)[0]
    setup, stage = est.setup_from_config(_config(precision, **extra), world)
    estimate = est.estimate(est.shapes_from_module(training.make_model(lora=True)), setup, stage)
    model = training.make_model(lora=True)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    b = setup.param_bytes
    assert 0.9 * (frozen - 32 * 6) <= frozen_numel <= frozen + 64  # padded units, norms whole
    assert estimate.frozen_numel == frozen_numel
    assert formula.endswith(f"frozen: {b}Ψ/N")
    # the frozen shard alone: gradients, master and optimizer state follow the trained
    # parameters (a LoRA model's few), nothing of the frozen base
    assert peak["param"] == expected["param"] >= b * frozen_numel // world
    assert peak["gradient"] <= b * (trainable + 64 * 8)
    assert peak["optimizer_state"] <= 8 * (trainable + 64 * 8)
    for category in ("param", "gradient", "fp32_master", "optimizer_state"):
        assert estimate.categories[category]["bytes"] == peak.get(category, 0), category
    if extra:  # offload_param: the frozen shard is in host memory with the trained one
        assert estimate.categories["param"]["by_location"]["host"] >= b * frozen_numel // world
    measured = peak["gathered_param"]
    assert abs(estimate.categories["gathered_param"]["bytes"] - measured) <= 0.05 * measured


def _resume(rank, world, save_dir, phase):
    """full: 4 steps; first: 2, saved; second: loaded, 2 more; load: loaded only."""
    first, steps, load_dir, to_dir = {"full": (0, 4, None, None), "first": (0, 2, None, save_dir),
                                      "second": (2, 2, save_dir, None),
                                      "load": (2, 0, save_dir, None)}[phase]
    engine = _engine()
    losses = training.load_train_save(engine, rank, world, GAS, first, steps, load_dir, to_dir)
    state = engine.module_state_dict()
    return losses, state if rank == 0 else None


def test_a_lora_checkpoint_resumes_bit_for_bit_and_loads_at_another_world_size(tmp_path):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint

    saved = training.check_resume_bit_for_bit(_resume, 2, str(tmp_path))[0][1]
    one_rank = run_distributed(_resume, 1, args=(str(tmp_path), "load"))[0][1]
    exported = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    for name, value in saved.items():
        assert torch.equal(one_rank[name], value), name
        assert torch.equal(exported[name], value.float()), name


def _adapters_only(rank, world, save_dir, strict):
    """Two steps saved without the frozen parameters (the HF Trainer's PEFT save), loaded into
    a fresh engine of the same model, two more steps; or the strict load's error."""
    engine = _engine()
    training.train_engine(engine, rank, world, 2, GAS)
    engine.save_checkpoint(save_dir, exclude_frozen_parameters=True)
    fresh = _engine()
    if strict:  # every rank names what is missing
        from zero.checkpoint import CheckpointError

        with pytest.raises(CheckpointError, match="missing keys.*token_embedding.weight"):
            fresh.load_checkpoint(save_dir)
        return None
    fresh.load_checkpoint(save_dir, load_module_strict=False)
    return training.train_engine(fresh, rank, world, 2, GAS, first_step=2)


def test_a_checkpoint_without_the_frozen_base_resumes_from_the_rebuilt_model(tmp_path):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint

    full = run_distributed(_resume, 2, args=(str(tmp_path / "full"), "full"))
    resumed = run_distributed(_adapters_only, 2, args=(str(tmp_path / "a"), False))
    assert [losses for losses in resumed] == [losses[2:] for losses, _ in full]
    saved = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "a"))
    assert saved and all("lora_" in name or p.requires_grad
                         for name, p in training.make_model(lora=True).named_parameters()
                         if name in saved)
    assert "token_embedding.weight" not in saved and "blocks.0.attn.qkv.base.weight" not in saved
    assert run_distributed(_adapters_only, 2, args=(str(tmp_path / "b"), True)) == [None, None]


def _sleep_between_steps(rank, world):
    straight = training.train_engine(_engine(), rank, world, 2, GAS)
    engine = _engine()
    losses = training.train_engine(engine, rank, world, 1, GAS)
    engine.offload_states()
    on_device = engine.core.registry().usage("param", "device").current
    losses += training.train_engine(engine, rank, world, 1, GAS, first_step=1)
    return straight, losses, on_device


def test_offload_states_moves_the_frozen_shard_too():
    for straight, losses, on_device in run_distributed(_sleep_between_steps, 2, timeout=120):
        assert on_device == 0  # the frozen group's shard left the device with the rest
        assert losses == straight


def _adapters_whole(rank, world):
    import zero

    # every adapter (at most 512 elements) whole, the base layers (1,024 and up) partitioned
    config = training.engine_config(3, gas=GAS, stage3_param_persistence_threshold=600)
    engine, _, _, _ = zero.initialize(model=training.make_model(lora=True), config=config)
    training.train_engine(engine, rank, world, 1, GAS)
    report = engine.memory_report()
    return report["stage"], report["model_state_formula"], [g.stage for g in engine.groups]


def test_with_every_adapter_kept_whole_the_report_still_says_stage_3():
    stage, formula, groups = run_distributed(_adapters_whole, 2, timeout=120)[0]
    assert groups == [1]  # the adapters: one stage-1 group
    assert stage == 3
    assert formula == "persistent: 8Ψ + 8Ψ/N + frozen: 4Ψ/N"


QUANTIZED = {"zero_quantized_nontrainable_weights": True}


def _frozen_order(model) -> list:
    """The frozen parameters the engine partitions, in its frozen group's order (the model's)."""
    unique = {id(p): p for p in model.parameters()}
    return [p for p in unique.values() if not p.requires_grad and p.numel() > PERSISTENCE]


def _quantized_values(layout, world: int) -> list[torch.Tensor]:
    """Each frozen parameter as the engine keeps it: its unit's flat buffer (padded, fp32)
    cut into the ranks' pieces, each piece through the int8 code and back."""
    from zero import _C

    params = _frozen_order(training.make_model(lora=True))
    full = torch.zeros(layout.full_numel)
    for i, param in enumerate(params):
        start = layout.param_offset(i)
        full[start:start + param.numel()] = param.detach().reshape(-1)
    for u in range(layout.unit_count):
        piece = layout.unit(u).shard_numel
        for r in range(world):
            start = layout.full_offset(u) + r * piece
            values = full[start:start + piece]
            values.copy_(_C.dequantize_int8(_C.quantize_int8(values.clone()), piece))
    return [full[layout.param_offset(i):layout.param_offset(i) + p.numel()].view_as(p)
            for i, p in enumerate(params)]


def _quantized(rank, world, steps):
    engine = _engine(**QUANTIZED)
    losses = training.train_engine(engine, rank, world, steps, GAS)
    layout = engine.core.frozen_group_layout(0)
    expected = _quantized_values(layout, world)
    fresh = training.make_model(lora=True)
    names = {id(p): n for n, p in fresh.named_parameters()}
    frozen = [names[id(p)] for p in _frozen_order(fresh)]
    state = engine.module_state_dict()
    report = engine.memory_report()
    engine.optimizer.quantize_nontrainable_params()  # DeepSpeed-Chat's call: nothing left to do
    adapter = engine.module.blocks[0].attn.qkv.lora_a.weight
    adapter.requires_grad_(False)  # frozen after the layout: named
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv\.lora_a\.weight"):
        engine.optimizer.quantize_nontrainable_params()
    adapter.requires_grad_(True)
    exact = [torch.equal(state[name], value) for name, value in zip(frozen, expected)] \
        if rank == 0 else None  # (the whole state dict is rank 0's)
    return (losses, exact,
            report["categories"]["param"]["peak"], report["categories"]["param"]["expected"],
            report["model_state_formula"])


def test_quantized_frozen_weights_are_the_int8_code_of_each_ranks_piece():
    """zero_quantized_nontrainable_weights: the frozen shard is kept as int8 blocks, so the
    base model the adapters train on is each rank's piece rounded once, exactly; the adapters
    still train (the losses follow the unquantized run's closely), and the report and the
    estimate count the packed bytes."""
    from zero.reports import estimate as est

    plain = run_distributed(_train, 2, args=(False,), timeout=120)[0][0]
    results = run_distributed(_quantized, 2, args=(STEPS,), timeout=120)
    exact = results[0][1]
    # per block its 4 base weights and mlp[0]'s bias (128); both embeddings
    assert all(exact) and len(exact) == 5 * training.MODEL.n_layer + 2
    for losses, _, measured, expected, formula in results:
        assert losses == pytest.approx(plain, rel=2e-3) and losses != plain
        assert measured == expected
        assert formula.endswith("frozen: 1Ψ/N")
    setup, stage = est.setup_from_config(_config(**QUANTIZED), 2)
    estimate = est.estimate(est.shapes_from_module(training.make_model(lora=True)), setup, stage)
    assert estimate.categories["param"]["bytes"] == results[0][2]
    plain_estimate = est.estimate(est.shapes_from_module(training.make_model(lora=True)),
                                  est.setup_from_config(_config(), 2)[0], 3)
    frozen_fp32 = 4 * estimate.frozen_numel // 2
    saved = plain_estimate.categories["param"]["bytes"] - estimate.categories["param"]["bytes"]
    assert 0.7 * frozen_fp32 < saved < 0.76 * frozen_fp32  # fp32 -> int8 + scales: ~3/4 less


def _quantized_under_init(rank, world):
    engine = _engine(init=True, **QUANTIZED)  # zero.Init's parameters are zero's own class
    return training.train_engine(engine, rank, world, 2, GAS)


def test_quantized_frozen_weights_of_a_model_built_under_zero_init():
    """DeepSpeed-Chat's --enable_mixed_precision_lora builds its actor under zero.Init (through
    HfDeepSpeedConfig): its frozen base was refused as "already a quantized code"."""
    built = run_distributed(_quantized_under_init, 2, timeout=120)[0]
    whole = run_distributed(_quantized, 2, args=(2,), timeout=120)[0][0]
    assert built == pytest.approx(whole, rel=1e-6)


def _edited_under_hpz(rank, world):
    import zero.compat.deepspeed as deepspeed

    engine = _engine(**QUANTIZED, zero_hpz_partition_size=2, stage3_max_reuse_distance=0)
    training.train_engine(engine, rank, world, 1, GAS)  # each unit's hpZ copy is made
    weight = engine.module.blocks[0].mlp[0].base.weight  # a partitioned frozen weight
    with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
        edit = torch.linspace(-1, 1, weight.numel()).view_as(weight)
        if rank == 0:
            with torch.no_grad():
                weight.copy_(edit)
    with deepspeed.zero.GatheredParameters([weight]):
        from_copies = weight.detach().clone()  # within the hpZ group, from its copies
    engine.offload_states()
    engine.reload_states()  # the copies are dropped
    with deepspeed.zero.GatheredParameters([weight]):
        from_shards = weight.detach().clone()  # from every rank's packed piece
    return torch.equal(from_copies, from_shards), torch.equal(from_shards, edit)


def test_an_edit_of_quantized_frozen_weights_reads_the_same_from_hpz_copies_and_shards():
    """A commit under hpZ used to leave the edit's exact values in the secondary copies while
    the shards kept its int8 code: gathers gave the one or the other depending on whether the
    copies were still there."""
    for same, exact in run_distributed(_edited_under_hpz, 4, timeout=120):
        assert same and not exact


def _quantized_on_nvme(rank, world, path):
    with pytest.raises(ValueError, match="zero_quantized_nontrainable_weights with "
                                         "offload_param.device \"nvme\""):
        _engine(**QUANTIZED, offload_param={"device": "nvme", "nvme_path": path})
    return True


def lora_model():
    """zero-mem's --model factory: the LoRA test model."""
    return training.make_model(lora=True)


def test_quantized_frozen_weights_on_nvme_are_refused_naming_both_keys(tmp_path, capsys):
    import json
    import os

    from zero.reports import cli
    from zero.reports import estimate as est

    assert run_distributed(_quantized_on_nvme, 2, args=(str(tmp_path),), timeout=60) == [True] * 2
    config = _config(**QUANTIZED, offload_param={"device": "nvme", "nvme_path": str(tmp_path)})
    setup, stage = est.setup_from_config(config, 2)
    with pytest.raises(est.EstimateError, match="zero_quantized_nontrainable_weights"):
        est.estimate(est.shapes_from_module(training.make_model(lora=True)), setup, stage)
    path = tmp_path / "ds_config.json"  # zero-mem's table: the NVMe rows do not run, and why
    path.write_text(json.dumps(config))
    factory = os.path.abspath(__file__) + ":lora_model"
    assert cli.main(["estimate", "--model", factory, "--config", str(path),
                     "--world-size", "2"]) == 0
    text = capsys.readouterr().out
    assert "stage 3 + offload params (NVMe) does not run: zero_optimization." \
        "zero_quantized_nontrainable_weights" in text
    assert "frozen (stage 3 partitions them" in text and "1Ψf/N" in text


class _Codes(torch.nn.Parameter):
    """A parameter class of its own holding an already-quantized code (as bitsandbytes'
    Params4bit does, stored in a float dtype)."""


def _odd_frozen(rank, world):
    import zero

    model = training.make_model(lora=True)
    model.int_codes = torch.nn.Parameter(torch.arange(4096, dtype=torch.int32),
                                         requires_grad=False)
    engine, _, _, _ = zero.initialize(model=model, config=_config())
    training.train_engine(engine, rank, world, 1, GAS)
    whole = engine.module.int_codes.numel()  # integer: the model's own, never partitioned
    model = training.make_model(lora=True)
    model.float_codes = _Codes(torch.randn(4096), requires_grad=False)
    with pytest.raises(ValueError, match="float_codes .*already a quantized code"):
        zero.initialize(model=model, config=_config(**QUANTIZED))
    return whole


def test_integer_frozen_codes_stay_whole_and_quantized_codes_are_not_quantized_again():
    assert run_distributed(_odd_frozen, 2, timeout=120) == [4096, 4096]


def _released_during_backward(rank, world):
    """An untied GPT with its embeddings frozen: the root unit holds the frozen embeddings
    and the trainable head. Seen from a later gradient of backward (blocks.0's): the head is
    released once its gradients are in, the frozen part of the root stays to the end."""
    import dataclasses

    import zero

    model = training.make_model(dataclasses.replace(training.MODEL, tie_embeddings=False),
                                freeze_position_embedding=True)
    model.token_embedding.weight.requires_grad_(False)
    config = _config(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    seen = []
    head, embedding = engine.module.head.weight, engine.module.token_embedding.weight
    engine.module.blocks[0].attn.qkv.weight.register_post_accumulate_grad_hook(
        lambda _: seen.append((head.numel(), embedding.numel())))
    training.train_engine(engine, rank, world, 2, GAS)
    return seen


def test_a_units_trainable_parts_go_when_their_gradients_are_in_its_frozen_part_stays():
    for seen in run_distributed(_released_during_backward, 2, timeout=120):
        assert len(seen) == 2 * GAS
        assert all(head == 0 and embedding > 0 for head, embedding in seen), seen
