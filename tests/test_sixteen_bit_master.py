"""DeepSpeed's bf16_master_weights_and_grads and bf16_optimizer_states (fp16_master_weights_and_grads
alike): the 16-bit parameters are the master, with no fp32 copy, and with bf16_optimizer_states
Adam's moments are bf16 too, as when DeepSpeed steps them with torch's AdamW over bf16 tensors.

Stages 1-3 on 2 ranks track that single-process reference (a bf16 model, torch.optim.AdamW),
closer than the fp32-master engine does; an update below bf16's resolution is lost, as on a
bf16 model, where an fp32 master keeps it; the memory report has no master and half the
moments; the offloaded step keeps a bf16 master (host, NVMe); a checkpoint resumes the run;
pipeline stages keep one too; bad combinations are refused naming the key."""
import json

import pytest
import torch

import training
from distributed_harness import RankFailed, run_distributed

STEPS = 12
WORLD = 2


def _config(stage, states=True, precision="bf16", **zero_extra):
    if stage == 3:  # the test model's parameters partitioned, not kept whole
        zero_extra.setdefault("stage3_param_persistence_threshold", 0)
    config = training.engine_config(stage, precision=precision, **zero_extra)
    if precision == "bf16":
        config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=states)
    else:
        config["fp16"]["fp16_master_weights_and_grads"] = True
    return config


def _fp32_master(config):
    return dict(config, bf16={"enabled": True})


def _train(rank, world, config, steps=STEPS):
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_optimizer_state

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, steps, config["gradient_accumulation_steps"])
    report = engine.memory_report()
    assert engine.bf16_master_weights_and_gradients() == bool(
        config.get("bf16", {}).get("bf16_master_weights_and_grads"))  # DeepSpeed's getters
    assert engine.bf16_optimizer_states() == bool(config.get("bf16", {}).get("bf16_optimizer_states"))
    assert engine.fp16_master_weights_and_gradients() == ("fp16" in config)
    weight = engine.module.blocks[0].mlp[0].weight
    moment = safe_get_full_optimizer_state(weight, "exp_avg")
    with zero.GatheredParameters(list(engine.module.parameters())):  # stage 3: whole
        params = training.parameters_of(engine.module)
    return (losses, params,
            {name: row["current"] for name, row in report["categories"].items()},
            report["numel"], moment)


def _bf16_reference(world, steps, config):
    """Single process, the global batch, the bf16 model and torch's fused AdamW over its bf16
    tensors (bf16 moments, each element updated in fp32 and stored once, as zero's CPU step
    and DeepSpeed's fused optimizers do), clipping and the scheduler: (losses, parameters)."""
    from zero.schedulers import build_scheduler

    model = training.make_model().to(torch.bfloat16)
    hyper = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=hyper["lr"], betas=tuple(hyper["betas"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"], fused=True)
    scheduler = None
    if "scheduler" in config:
        scheduler = build_scheduler(config["scheduler"]["type"],
                                    dict(config["scheduler"]["params"]), optimizer)
    gas = config["gradient_accumulation_steps"]
    losses = training.reference_steps(model, optimizer, training.batches(world, steps, gas),
                                      world, steps, gas, config["gradient_clipping"], scheduler)
    return losses, training.parameters_of(model)


def _loss_error(losses, reference):
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def test_one_rank_steps_exactly_as_torch_fused_adamw_on_the_bf16_model():
    """gradient_accumulation_steps 1, no clipping: the same bf16 gradients, and the fused CPU
    step over bf16 master and moments is torch's fused AdamW bit for bit."""
    config = _config(1, gas=1, clip=0.0, scheduler=False)
    _one_rank_equals(config, lambda: _bf16_reference(1, STEPS, config))


def _one_rank_equals(config, reference):
    """One rank of `config` against reference() run here on one thread (the rank's: the
    matmuls' sums follow the thread count): every loss and weight equal."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref_losses, ref_params = reference()
    finally:
        torch.set_num_threads(threads)
    losses, params, *_ = run_distributed(_train, 1, args=(config,), timeout=120)[0]
    assert losses == ref_losses
    for name, expected in ref_params.items():
        assert torch.equal(params[name], expected), name


def _rounding_reference(steps, config):
    """One process: the bf16 model's gradients step an fp32 copy of its weights with torch's
    fused AdamW (fp32 moments), and the result is rounded to bf16 for the model and for the
    next step: a bf16 master with fp32 moments, each element stored once."""
    model = training.make_model().to(torch.bfloat16)
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    hyper = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(master, lr=hyper["lr"], betas=tuple(hyper["betas"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"], fused=True)
    losses = []
    for tokens, targets in training.batches(1, steps, 1):
        model.zero_grad()
        loss = model(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        for weight, param in zip(master, model.parameters()):
            weight.grad = param.grad.float()
        optimizer.step()
        with torch.no_grad():
            for weight, param in zip(master, model.parameters()):
                param.copy_(weight)
                weight.copy_(param)
    return losses, training.parameters_of(model)


def test_one_rank_with_fp32_moments_steps_as_fused_adamw_rounding_the_weights():
    config = _config(1, states=False, gas=1, clip=0.0, scheduler=False)
    _one_rank_equals(config, lambda: _rounding_reference(STEPS, config))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stages_track_torch_adamw_on_the_bf16_model(stage):
    """Stated tolerance: every loss within 3e-4 of the reference's, and closer to it than the
    fp32-master engine's; each parameter within 5% relative L2 (bf16 rounding, compounded)."""
    config = _config(stage)
    ref_losses, ref_params = _bf16_reference(WORLD, STEPS, config)
    results = run_distributed(_train, WORLD, args=(config,), timeout=240)
    fp32_master = run_distributed(_train, WORLD, args=(_fp32_master(config),), timeout=240)[0]
    for losses, params, current, numel, moment in results:
        assert _loss_error(losses, ref_losses) < 3e-4
        assert _loss_error(losses, ref_losses) < _loss_error(fp32_master[0], ref_losses)
        for name, expected in ref_params.items():
            assert training.relative_error(params[name], expected) < 5e-2, name
        # no master; Adam's two moments in 2 bytes each, over this rank's shard
        assert current.get("fp32_master", 0) == 0
        assert current["optimizer_state"] == 2 * 2 * numel // WORLD
        assert torch.equal(moment, moment.bfloat16().float())  # (read back as fp32)
    assert ref_losses[-1] < ref_losses[0] - 0.1  # the reference learned
    for _, params, *_ in results[1:]:
        for name in params:
            assert torch.equal(params[name], results[0][1][name]), name


def _moved(before, after, smallest):
    """How many elements of magnitude >= smallest changed."""
    return sum(int(((b.abs() >= smallest) & (a != b)).sum()) for b, a in
               ((before[name], after[name]) for name in before))


@pytest.mark.parametrize("states", [True, False])
def test_an_update_below_bf16_resolution_is_lost_as_on_a_bf16_model(states):
    """lr 1e-5 without weight decay: an AdamW update of a weight >= 2**-6 (whose bf16 spacing
    is 2**-13, 1.2e-4) is at most a few lr, below half the spacing, so a bf16 master rounds
    every update away, on one step and on twelve; an fp32 master adds them up until the bf16
    parameter moves."""
    config = _config(2, states=states, scheduler=False)
    config["optimizer"]["params"].update(lr=1e-5, weight_decay=0.0)
    before = training.parameters_of(training.make_model().to(torch.bfloat16))
    sixteen = run_distributed(_train, WORLD, args=(config,), timeout=120)[0][1]
    fp32_master = run_distributed(_train, WORLD, args=(_fp32_master(config),), timeout=120)[0][1]
    assert _moved(before, sixteen, 2 ** -6) == 0
    assert _moved(before, fp32_master, 2 ** -6) > 100


@pytest.mark.parametrize("stage,device,states", [(2, "cpu", False), (3, "nvme", True),
                                                 (3, "cpu", True)])
def test_the_offloaded_step_keeps_a_bf16_master(tmp_path, stage, device, states):
    """ZeRO-Offload with a 16-bit master (DeepSpeed requires offload for it unless the states
    are bf16 too): the host or NVMe keeps a bf16 master, the moments in bf16 or fp32, and the
    run tracks the one on the device."""
    offload = {"device": device, "pin_memory": False}
    if device == "nvme":
        offload["nvme_path"] = str(tmp_path)
    config = _config(stage, states=states, offload_optimizer=offload)
    on_device = _config(stage, states=states)
    losses, _, current, numel, _ = run_distributed(_train, WORLD, args=(config, 6),
                                                   timeout=240)[0]
    expected = run_distributed(_train, WORLD, args=(on_device, 6), timeout=240)[0][0]
    assert losses == pytest.approx(expected, rel=1e-3)
    assert current["fp32_master"] == 2 * numel // WORLD  # bf16, host or NVMe
    assert current["optimizer_state"] == (2 if states else 4) * 2 * numel // WORLD


def _resume(rank, world, config, first, steps, load_dir, save_dir):
    return training.resume_and_train(config, rank, world, first, steps, load_dir, save_dir)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_resumes_the_run(tmp_path, stage):
    config = _config(stage, scheduler=False)
    whole = run_distributed(_resume, WORLD, args=(config, 0, 6, None, None))[0]
    run_distributed(_resume, WORLD, args=(config, 0, 3, None, str(tmp_path)))
    resumed = run_distributed(_resume, WORLD, args=(config, 3, 3, str(tmp_path), None))[0]
    assert resumed == whole[3:]


def test_fp16_master_weights_train_with_loss_scaling():
    config = _config(2, precision="fp16")
    losses, _, current, numel, moment = run_distributed(_train, WORLD, args=(config,),
                                                        timeout=240)[0]
    assert losses[-1] < losses[0] - 0.1
    assert current.get("fp32_master", 0) == 0
    assert current["optimizer_state"] == 4 * 2 * numel // WORLD  # fp32 moments
    assert not torch.equal(moment, moment.half().float())


@pytest.mark.parametrize("bf16,stage,message", [
    ({"enabled": True, "bf16_optimizer_states": True}, 2,
     "bf16.bf16_optimizer_states = true: requires bf16_master_weights_and_grads"),
    ({"enabled": False, "bf16_master_weights_and_grads": True}, 2,
     "bf16.bf16_master_weights_and_grads = true: keeps state in the bf16 parameters' dtype but "
     "bf16.enabled is false"),
    ({"enabled": True, "bf16_master_weights_and_grads": True}, 0,
     "is only supported with ZeRO stage 1, 2 or 3"),
])
def test_bad_combinations_are_refused_naming_the_key(bf16, stage, message):
    from zero.config import ConfigError, load_config

    config = training.engine_config(stage)
    config["bf16"] = bf16
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(config, world_size=WORLD)


def _external(rank, world):
    import zero

    model = training.make_model()
    config = dict(_config(2), zero_allow_untested_optimizer=True)
    del config["optimizer"]
    zero.initialize(model=model, config=config,
                    optimizer=torch.optim.RMSprop(model.parameters(), lr=1e-3))


def test_an_external_optimizer_is_refused_on_every_rank():
    with pytest.raises(RankFailed) as failed:
        run_distributed(_external, WORLD, timeout=60)
    assert "steps an fp32 master" in str(failed.value)


def _save(rank, world, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=_config(2, scheduler=False))
    training.train_engine(engine, rank, world, 2, 2)
    engine.save_checkpoint(save_dir)
    return training.parameters_of(engine.module)


def test_the_fp32_export_of_a_bf16_master_checkpoint_is_the_weights(tmp_path):
    """zero_to_fp32 on such a checkpoint: fp32 tensors, the bf16 master (the weights) widened."""
    from zero.compat.deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    weights = run_distributed(_save, WORLD, args=(str(tmp_path),))[0]
    exported = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert set(exported) == set(weights) | {"head.weight"}  # (tied to the token embedding)
    for name, value in exported.items():
        assert value.dtype == torch.float32, name
        assert torch.equal(value, weights[name.replace("head.", "token_embedding.")]), name


def _fp32_optimizer_states_off(rank, world, client, nvme_path):
    import zero
    from zero.compat.deepspeed.ops.adam import DeepSpeedCPUAdam

    config = _config(2, states=False, scheduler=False, offload_optimizer={"device": "cpu"})
    model = training.make_model()
    optimizer = None
    if client:
        del config["optimizer"]
        optimizer = DeepSpeedCPUAdam(model.parameters(), lr=1e-3, fp32_optimizer_states=False)
    else:
        config["optimizer"]["params"]["fp32_optimizer_states"] = False
    engine, _, _, _ = zero.initialize(model=model, optimizer=optimizer, config=config)
    training.train_engine(engine, rank, world, 1, config["gradient_accumulation_steps"])
    report = engine.memory_report()
    return report["categories"]["optimizer_state"]["current"], report["numel"]


@pytest.mark.parametrize("client", [False, True])
def test_cpu_adams_fp32_optimizer_states_false_keeps_16_bit_moments(client):
    """DeepSpeed's DeepSpeedCPUAdam(fp32_optimizer_states=False), from the config's optimizer
    params or a client optimizer: with a bf16 master offloaded its moments are bf16."""
    state, numel = run_distributed(_fp32_optimizer_states_off, WORLD, args=(client, ""),
                                   timeout=120)[0]
    assert state == 2 * 2 * numel // WORLD


def _pipeline(rank, world, master16):
    import zero.compat.deepspeed as deepspeed
    from test_pipe import HYPER, MICRO_BATCH, MICRO_BATCHES, MODEL, STEPS, data
    from zero.models.pipe_gpt import cross_entropy, pipe_layers

    module = deepspeed.pipe.PipelineModule(layers=pipe_layers(MODEL), num_stages=world,
                                           loss_fn=cross_entropy, seed_layers=True)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH,
              "gradient_accumulation_steps": MICRO_BATCHES,
              "optimizer": {"type": "AdamW", "params": HYPER},
              "zero_optimization": {"stage": 1},
              "bf16": {"enabled": True, "bf16_master_weights_and_grads": master16,
                       "bf16_optimizer_states": master16}}
    engine, _, _, _ = deepspeed.initialize(model=module, config=config)
    batches = iter(data()[:STEPS * MICRO_BATCHES])
    losses = [engine.train_batch(batches).item() for _ in range(STEPS)]
    current = {k: v["current"] for k, v in engine.memory_report()["categories"].items()}
    return losses, current


def test_pipeline_stages_keep_a_bf16_master():
    """2 pipeline stages, ZeRO-1 inside each: each stage keeps its bf16 weights as the master
    and bf16 moments, and trains as the fp32-master pipeline does to bf16 tolerance."""
    sixteen = run_distributed(_pipeline, 2, args=(True,), timeout=120)
    fp32_master = run_distributed(_pipeline, 2, args=(False,), timeout=120)
    for (losses, current), (expected, with_master) in zip(sixteen, fp32_master):
        assert losses == pytest.approx(expected, rel=1e-2)
        assert current.get("fp32_master", 0) == 0 and with_master["fp32_master"] > 0
        assert current["optimizer_state"] * 2 == with_master["optimizer_state"]


def test_the_estimate_prices_fp32_optimizer_states_false_by_offload_option():
    """DeepSpeedCPUAdam's switch halves the moments only where the optimizer is offloaded: the
    estimate's rows for one config follow the engine's rule option by option."""
    from zero.reports import estimate as est

    config = _config(2, states=False)
    config["optimizer"]["params"]["fp32_optimizer_states"] = False
    setup, _ = est.setup_from_config(config, world_size=WORLD)
    shapes = est.shapes_from_count(10_000_000)
    rows = {e.option.name: e.categories["optimizer_state"]["bytes"]
            for e in est.estimate_all(shapes, setup)}
    assert rows["stage 2 + offload optimizer"] * 2 == rows["stage 2"]


def _client_fp32_states(rank, world):
    import zero
    from zero.compat.deepspeed.ops.adam import DeepSpeedCPUAdam

    model = training.make_model()
    config = _config(2, offload_optimizer={"device": "cpu"})
    del config["optimizer"]
    zero.initialize(model=model, config=config, optimizer=DeepSpeedCPUAdam(model.parameters()))


def test_a_client_cpu_adam_with_fp32_moments_is_refused_with_bf16_states_offloaded():
    with pytest.raises(RankFailed) as failed:
        run_distributed(_client_fp32_states, WORLD, timeout=60)
    assert "built with fp32_optimizer_states=True" in str(failed.value)


def _model_states(capsys, *flags):
    from zero.reports import cli

    assert cli.main(["estimate", "--params", "1e8", "--world-size", "4", "--precision", "bf16",
                     "--json", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    stage2 = next(o for o in out["options"] if o["option"] == "stage 2")
    return {name: stage2["categories"][name]["bytes"] for name in ("fp32_master", "optimizer_state")}


def test_zero_mem_estimate_flags_for_the_sixteen_bit_master(capsys):
    default = _model_states(capsys)
    master = _model_states(capsys, "--sixteen-bit-master")
    both = _model_states(capsys, "--sixteen-bit-master", "--sixteen-bit-states")
    assert master == {"fp32_master": 0, "optimizer_state": default["optimizer_state"]}
    assert both == {"fp32_master": 0, "optimizer_state": default["optimizer_state"] // 2}
    assert default["fp32_master"] == default["optimizer_state"] // 2  # 4 and 8 bytes
    from zero.reports import cli  # fp16: DeepSpeed's bf16_optimizer_states is bf16 only

    assert cli.main(["estimate", "--params", "1e8", "--precision", "fp16",
                     "--sixteen-bit-master", "--sixteen-bit-states"]) == 2
    assert "need precision bf16" in capsys.readouterr().err
