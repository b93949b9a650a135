"""Engine behaviour beyond parity: fp16 overflow agreement, exact resume, memory formulas,
no_sync, client optimizers, the DeepSpeed-shaped namespace."""
import os

import pytest
import torch

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict


# ---- fp16: an overflow on one rank skips the step on every rank ---------------------------

def _fp16_overflow(rank, world, stage):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(stage, gas=1,
                                                                    precision="fp16"))
    scales, params_before, params_after = [], None, None

    def poison(step, loss):
        # Step 2 on rank 1 only: an infinite loss, so only rank 1's gradients overflow.
        return loss * float("inf") if (step == 2 and rank == 1) else loss

    for step in range(4):
        if step == 2:
            params_before = training.parameters_of(engine.module)
        training.train_engine(engine, rank, world, 1, 1, first_step=step, on_step=poison)
        if step == 2:
            params_after = training.parameters_of(engine.module)
            assert engine.get_global_grad_norm().item() == float("inf")  # as DeepSpeed's
        scales.append(engine.optimizer.cur_scale)
    unchanged = all(torch.equal(params_before[k], params_after[k]) for k in params_before)
    return engine.skipped_steps, engine.global_steps, engine.applied_steps, scales, unchanged


@pytest.mark.parametrize("stage", [1, 2])
def test_fp16_overflow_on_one_rank_skips_the_step_on_all_ranks(stage):
    results = run_distributed(_fp16_overflow, 2, args=(stage,), timeout=120)
    for skipped, global_steps, applied, scales, unchanged in results:
        assert (skipped, global_steps, applied) == (1, 4, 3)
        assert unchanged  # the skipped step left every parameter alone
        assert scales[2] == scales[1] / 2  # hysteresis 1: the scale halves at once
    assert results[0][3] == results[1][3]


def _fp16_sum_past_range(rank, world, stage):
    """Each rank's scaled gradient is 40 x 1024 = 40960, finite in fp16; their sum 81920 is
    not, their mean is. (DeepSpeed divides before the sum.)"""
    import zero

    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "fp16": {"enabled": True, "initial_scale_power": 10, "hysteresis": 1},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    engine.backward(engine(torch.full((1, 4), 40.0, dtype=torch.float16)).float().sum())
    engine.step()
    return engine.was_step_applied(), engine.optimizer.cur_scale, \
        engine.get_global_grad_norm().item()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_an_fp16_mean_whose_sum_passes_fp16s_range_is_no_overflow(stage):
    """The ranks' gradients were summed in fp16 and divided after: a sum past 65504 was an
    overflow no rank had, the step skipped and the scale halved (DeepSpeed applies it)."""
    for applied, scale, norm in run_distributed(_fp16_sum_past_range, 2, args=(stage,)):
        assert applied and scale == 1024
        assert norm == pytest.approx(80.0)  # the 4 weights' mean gradient, 40 each


# ---- checkpoints: save at step k, resume in fresh processes, identical result -------------

def _run_with_checkpoint(rank, world, stage, save_dir, phase):
    import zero

    config = training.engine_config(stage, gas=2)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    if phase == "uninterrupted":
        losses = training.train_engine(engine, rank, world, 6, 2)
    elif phase == "first_half":
        losses = training.train_engine(engine, rank, world, 3, 2)
        engine.save_checkpoint(save_dir, client_state={"epoch": 7})
    else:
        path, client_state = engine.load_checkpoint(save_dir)
        assert client_state == {"epoch": 7}, client_state
        assert engine.global_steps == 3
        losses = training.train_engine(engine, rank, world, 3, 2, first_step=3)
    return losses, training.parameters_of(engine.module), engine.get_lr()


@pytest.mark.parametrize("stage", [1, 2])
def test_resume_from_checkpoint_is_bit_for_bit(stage, tmp_path):
    world = 2
    full = run_distributed(_run_with_checkpoint, world, args=(stage, str(tmp_path), "uninterrupted"))
    first = run_distributed(_run_with_checkpoint, world, args=(stage, str(tmp_path), "first_half"))
    second = run_distributed(_run_with_checkpoint, world, args=(stage, str(tmp_path), "resume"))
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert sorted(os.listdir(tmp_path / "global_step3")) == [
        "manifest.json", "model_states.pt", "zero_rank0_optim_states.pt",
        "zero_rank1_optim_states.pt"]
    for rank in range(world):
        assert first[rank][0] + second[rank][0] == full[rank][0]
        assert second[rank][2] == full[rank][2]
        for name, value in full[rank][1].items():
            assert torch.equal(second[rank][1][name], value), name


def _save_twice_and_crash(rank, world, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(1, gas=1))
    training.train_engine(engine, rank, world, 1, 1)
    engine.save_checkpoint(save_dir)
    # A save that dies half way (simulated: a rank's shard write fails) must leave the
    # previous checkpoint and `latest` untouched.
    import zero.checkpoint as checkpoint
    original = checkpoint._atomic_torch_save

    def failing(obj, path):
        if "zero_rank1" in path:
            raise OSError("disk full (simulated)")
        return original(obj, path)

    checkpoint._atomic_torch_save = failing
    training.train_engine(engine, rank, world, 1, 1, first_step=1)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"saving checkpoint global_step2 .* failed \(rank 1: OSError: disk full"):
        engine.save_checkpoint(save_dir)
    return True


def test_a_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    assert run_distributed(_save_twice_and_crash, 2, args=(str(tmp_path),)) == [True, True]
    assert (tmp_path / "latest").read_text() == "global_step1"
    assert not (tmp_path / "global_step2").exists()
    result = run_distributed(_run_with_checkpoint_load_only, 2, args=(str(tmp_path),))
    assert result[0] == 1


def _run_with_checkpoint_load_only(rank, world, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(1, gas=1))
    engine.load_checkpoint(save_dir)
    return engine.global_steps


# ---- memory: the accounting registry reproduces the ZeRO formulas exactly ----------------

def _memory(rank, world, stage, precision):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(stage, precision=precision))
    training.train_engine(engine, rank, world, 2, 2)
    report = engine.memory_report()
    groups = range(engine.core.group_count)
    buckets = [as_dict(engine.core.group_bucket_info(g)) for g in groups]
    return report, sum(engine.core.group_numel(g) for g in groups), buckets


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_engine_owned_bytes_equal_the_zero_formula(stage, world):
    report, psi, buckets = run_distributed(_memory, world, args=(stage, "bf16"))[0]
    b = 2  # bf16 parameters and gradients; fp32 master and Adam state
    expected = {
        0: {"param": 2 * psi, "gradient": 2 * psi, "fp32_master": 4 * psi,
            "optimizer_state": 8 * psi},
        1: {"param": 2 * psi, "gradient": 2 * psi, "fp32_master": 4 * psi // world,
            "optimizer_state": 8 * psi // world},
        2: {"param": 2 * psi, "gradient": 2 * psi // world, "fp32_master": 4 * psi // world,
            "optimizer_state": 8 * psi // world},
    }[stage]
    categories = report["categories"]
    for name, value in expected.items():
        assert categories[name]["peak"] == value, name
        assert categories[name]["expected"] == value, name
    # Stage 2's gradient shard holds memory from the first gradient of a window to the step.
    released = expected["gradient"] if stage == 2 else 0
    assert categories["gradient"]["current"] == expected["gradient"] - released
    formula = {0: 16 * psi, 1: 4 * psi + 12 * psi // world, 2: 2 * psi + 14 * psi // world}[stage]
    assert report["model_state_bytes"] == formula
    assert report["model_state_formula"] == {0: "16Ψ", 1: "4Ψ + 12Ψ/N", 2: "2Ψ + 14Ψ/N"}[stage]
    bucket = categories.get("bucket", {"current": 0, "peak": 0})
    assert bucket["current"] == 0  # made per unit in backward, freed once reduced
    assert all(info["buckets"] == 0 and info["bucket_bytes"] == 0 for info in buckets)
    if stage == 0:
        assert bucket["peak"] == 0  # stage 0 all-reduces in place in the gradient buffer
    else:
        # One bucket at a time (overlap_comm is off by default below stage 3, as in
        # DeepSpeed): at its peak, at stage 2 the largest unit and its 1/N output piece, at
        # stage 1 the piece alone (the unit is reduce-scattered out of the gradient buffer).
        # A unit holds at most reduce_bucket_size elements (3000 here) unless one parameter
        # is larger (4096 here), plus padding.
        largest_param = max(p.numel() for p in training.make_model().parameters())
        unit = max(info["max_unit_numel"] for info in buckets)
        assert unit <= max(3000, largest_param) + world * 8
        assert bucket["peak"] == ((unit if stage == 2 else 0) + unit // world) * b
    assert report["total"]["current"] == formula - released
    assert psi % (world if stage else 1) == 0


def test_fp32_training_needs_no_separate_master_copy():
    report, psi, _ = run_distributed(_memory, 2, args=(2, "fp32"))[0]
    assert report["categories"]["fp32_master"]["current"] == 0
    assert report["model_state_bytes"] == 4 * psi + 4 * psi // 2 + 8 * psi // 2


# ---- accumulation and no_sync ---------------------------------------------------------------

def _no_sync(rank, world, stage, gas=2):
    """A micro-step under no_sync(), then one outside it and the step."""
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(stage, gas=gas))
    data = training.batches(world, 1, 2)
    engine.core.reset_comm_stats()
    with engine.no_sync():
        tokens, targets = data[rank]
        engine.backward(engine(tokens, targets))
    during = engine.core.comm_stats().total_bytes
    if gas > 1:
        engine.step()  # not a boundary: nothing to do yet
    tokens, targets = data[world + rank]
    engine.backward(engine(tokens, targets))
    engine.step()
    return during, engine.core.comm_stats().total_bytes > 0, training.parameters_of(engine.module)


def test_no_sync_sends_nothing_and_accumulation_still_matches_the_reference():
    world = 2
    results = run_distributed(_no_sync, world, args=(1,))
    _, ref_params = training.train_reference(world, 1, 2, training.engine_config(1, gas=2))
    for during, after, params in results:
        assert during == 0
        assert after
        for name, expected in ref_params.items():
            assert training.relative_error(params[name], expected) < 1e-5, name


def test_no_sync_at_stage_1_with_one_micro_step_communicates_and_adds_up():
    """With gradient_accumulation_steps 1 stage 1 shards its gradients in backward, so a
    micro-step inside no_sync() is reduced at once (it has no full buffer to wait in); the
    step applies the same accumulated gradients as stage 0, which waits."""
    world = 2
    stage0 = run_distributed(_no_sync, world, args=(0, 1))
    stage1 = run_distributed(_no_sync, world, args=(1, 1))
    for (waited, _, expected), (during, _, params) in zip(stage0, stage1):
        assert waited == 0 and during > 0
        for name, value in expected.items():
            assert training.relative_error(params[name], value) < 1e-5, name


def _no_sync_stage2(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2))
    with pytest.raises(RuntimeError, match="no_sync.* not possible at ZeRO stage 2"):
        with engine.no_sync():
            pass
    return True


def test_no_sync_at_stage_2_explains_why_not():
    assert run_distributed(_no_sync_stage2, 1) == [True]


# ---- client optimizers and SGD ----------------------------------------------------------------

def _client_sgd(rank, world):
    import zero

    model = training.make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    config = training.engine_config(2, gas=1, scheduler=False)
    del config["optimizer"]
    engine, optimizer, _, _ = zero.initialize(model=model, optimizer=sgd, config=config)
    training.train_engine(engine, rank, world, 5, 1)
    return training.parameters_of(engine.module), optimizer.param_groups[0]["momentum"]


def _client_scheduler_warnings(rank, world):
    import warnings

    import zero

    model = training.make_model()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(adamw, lambda step: 1.0 / (1 + step))
    config = training.engine_config(2, gas=1, scheduler=False)
    del config["optimizer"]
    engine, *_ = zero.initialize(model=model, optimizer=adamw, config=config,
                                 lr_scheduler=schedule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training.train_engine(engine, rank, world, 3, 1)
    return [str(w.message) for w in caught], adamw.param_groups[0]["lr"]


def test_a_client_scheduler_steps_after_the_update_without_torchs_order_warning():
    """An Accelerate script's own AdamW and LambdaLR: the engine steps the scheduler after
    its update, so torch's "lr_scheduler.step() before optimizer.step()" warning is wrong
    and is not shown (the client optimizer's own step never runs)."""
    for messages, lr in run_distributed(_client_scheduler_warnings, 2):
        assert not [m for m in messages if "lr_scheduler.step()" in m], messages
        assert lr == pytest.approx(1e-3 / 4)


def test_a_client_sgd_optimizer_is_sharded_and_matches_torch():
    world = 2
    results = run_distributed(_client_sgd, world)
    model = training.make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4,
                          foreach=False)
    data = training.batches(world, 5, 1)
    for step in range(5):
        sgd.zero_grad()
        parts = [data[step * world + r] for r in range(world)]
        model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        sgd.step()
    for params, momentum in results:
        assert momentum == 0.9
        for name, value in training.parameters_of(model).items():
            assert training.relative_error(params[name], value) < 1e-5, name


def _initialize_errors(rank, world):
    import zero

    model = training.make_model()
    messages = []
    for kwargs in (
        {"config": training.engine_config(1), "optimizer": torch.optim.AdamW(model.parameters())},
        {"config": training.engine_config(1),
         "lr_scheduler": torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), 0.1), 1)},
    ):
        try:
            zero.initialize(model=training.make_model(), **kwargs)
            messages.append(None)
        except (ValueError, TypeError) as error:
            messages.append(str(error))
    return messages


def test_initialize_explains_conflicting_pieces():
    both_optimizers, both_schedulers = run_distributed(_initialize_errors, 1)[0]
    assert "remove one of them" in both_optimizers
    assert "scheduler" in both_schedulers and "remove one of them" in both_schedulers


def _without_optimizer(rank, world):
    import zero

    torch.manual_seed(0)
    plain = training.make_model()
    config = {k: v for k, v in training.engine_config(3, stage3_param_persistence_threshold=40)
              .items() if k != "optimizer"}
    # What the HF Trainer's evaluate() before train() hands over: the training config's
    # scheduler, finalized for 0 training steps. Without an optimizer nothing reads it.
    config["scheduler"] = {"type": "WarmupDecayLR",
                           "params": {"total_num_steps": 0, "warmup_num_steps": 0}}
    engine, optimizer, _, scheduler = zero.initialize(model=training.make_model(), config=config)
    tokens, targets = training.batches(world, 1, 1)[rank]
    with torch.no_grad():
        ours, theirs = engine(tokens, targets).item(), plain(tokens, targets).item()
    loss = engine(tokens, targets)
    engine.backward(loss)
    try:
        engine.step()
        refusal = None
    except RuntimeError as error:
        refusal = str(error)
    return ours, theirs, optimizer, scheduler, refusal


def test_initialize_without_an_optimizer_gives_an_engine_for_forward_passes():
    """DeepSpeed's inference engine (the HF Trainer evaluates through one at stage 3 before it
    trains; accelerator.prepare(model) alone builds one): no optimizer is returned, forward
    gathers as usual, step() names what is missing, and a scheduler block that nothing will
    read is not validated (DeepSpeed builds a scheduler only with an optimizer)."""
    for ours, theirs, optimizer, scheduler, refusal in run_distributed(_without_optimizer, 2):
        assert ours == pytest.approx(theirs, rel=1e-6)
        assert optimizer is None and scheduler is None
        assert "without an optimizer" in refusal


# ---- the DeepSpeed-shaped namespace ---------------------------------------------------------

def _deepspeed_script(rank, world, config_path):
    import argparse

    import zero.compat.deepspeed as deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", config_path])
    deepspeed.init_distributed()
    with deepspeed.zero.Init(config_dict_or_path=config_path):
        model = training.make_model()
    engine, optimizer, _, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters())
    losses = training.train_engine(engine, rank, world, 3, engine.gradient_accumulation_steps())
    return losses, deepspeed.comm.get_world_size(), engine.train_batch_size()


def test_a_deepspeed_script_runs_with_only_its_import_changed(tmp_path):
    import json

    config = training.engine_config(3, stage3_param_persistence_threshold=40)
    config["train_batch_size"] = training.MICRO_BATCH * 2 * 2
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    results = run_distributed(_deepspeed_script, 2, args=(str(path),))
    reference_losses, _ = training.train_reference(2, 3, 2, config)
    for losses, world, batch in results:
        assert world == 2 and batch == 8
        assert losses == pytest.approx(reference_losses, rel=1e-5)


class _FloatInputModel(torch.nn.Module):
    """Takes a float feature tensor and integer ids: auto_cast must cast the first only."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, features, ids):
        return (self.linear(features) + self.embed(ids).sum(-1, keepdim=True)).float().pow(2).mean()


def _auto_cast(rank, world, auto_cast):
    import zero

    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "fp16": {"enabled": True, "auto_cast": auto_cast},
              "zero_optimization": {"stage": 2}}
    engine, _, _, _ = zero.initialize(model=_FloatInputModel(), config=config)
    try:
        loss = engine(torch.randn(2, 4), torch.tensor([[1], [2]]))
    except RuntimeError as error:
        return str(error)
    engine.backward(loss)
    engine.step()
    return loss.dtype


def test_fp16_auto_cast_casts_float_inputs_and_leaves_integer_ids():
    """Accelerate adds "auto_cast": true for --fp16 without an fp16 block: fp32 features
    reach the fp16 model as fp16 (without it the Linear refuses them); ids stay integers."""
    assert run_distributed(_auto_cast, 1, args=(True,))[0] == torch.float32
    assert "dtype" in run_distributed(_auto_cast, 1, args=(False,))[0]


def _bytes_of_one_step(rank, world, stage, gas):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(stage, gas=gas))
    training.train_engine(engine, rank, world, 1, gas)  # warm-up (stage 3 learns its order)
    engine.core.reset_comm_stats()
    training.train_engine(engine, rank, world, 1, gas, first_step=1)
    stats = as_dict(engine.core.comm_stats())
    padded = sum(engine.core.group_numel(g) for g in range(engine.core.group_count))
    return stats, padded, engine.dtype.itemsize


@pytest.mark.parametrize("stage, gas", [(1, 1), (1, 2), (2, 1)])
def test_a_stage_1_or_2_step_sends_2_psi(stage, gas):
    """The ZeRO paper's P_os and P_os+g: reduce-scatter the gradients, all-gather the
    parameters: 2Ψ per step per rank (stage 1 used to all-reduce: 3Ψ), with stage 1's
    micro-steps accumulated locally (gas 2) or its gradients sharded in backward (gas 1).
    Scalars (the norm) aside, nothing else moves."""
    for stats, padded, itemsize in run_distributed(_bytes_of_one_step, 2, args=(stage, gas)):
        assert stats["reduce_scatter_bytes"] == padded * itemsize
        assert stats["all_gather_bytes"] == padded * itemsize
        assert stats["all_reduce_bytes"] <= 64  # the global norm
