"""Adagrad and Lion, DeepSpeed's other ZeRO optimizers, on every stage: they train like the
single-process reference (torch.optim.Adagrad; the torch Lion of deepspeed.ops.lion), offload
to CPU memory and NVMe bit for bit, checkpoint at one world size and stage and resume at
another, come from the config or as the script's own optimizer object, and are counted by the
memory report and the estimator (one fp32 array each: 4 bytes per element, not Adam's 8)."""
import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(240)
STEPS, GAS = 6, 2
OPTIMIZERS = {
    "adagrad": {"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 1e-3, "lr_decay": 0.01,
                                              "initial_accumulator_value": 0.1}},
    "lion": {"type": "Lion", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1}},
}


def _config(name, stage, precision="fp32", **zero_extra):
    if stage == 3:
        zero_extra.setdefault("stage3_param_persistence_threshold", 10)
    config = training.engine_config(stage, gas=GAS, precision=precision, **zero_extra)
    config["optimizer"] = OPTIMIZERS[name]
    return config


def _train_each(rank, world, configs):
    import zero

    runs = []
    for config in configs:
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        losses = training.train_engine(engine, rank, world, STEPS, GAS)
        weights = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
        runs.append((losses, weights,
                     engine.memory_report()["categories"]["optimizer_state"]["current"]))
        engine.destroy()
    return runs


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_stage_matches_the_single_process_reference(name):
    ref_losses, ref_params = training.train_reference(2, STEPS, GAS, _config(name, 0))
    configs = [_config(name, stage) for stage in range(4)]
    for stage, (losses, params, state_bytes) in enumerate(
            run_distributed(_train_each, 2, args=(configs,))[0]):
        assert losses == pytest.approx(ref_losses, rel=1e-5), stage
        for key, expected in ref_params.items():
            assert training.relative_error(params[key], expected) < 1e-5, (stage, key)
        assert state_bytes > 0, stage  # one fp32 array per element, counted
    assert ref_losses[-1] < ref_losses[0] - 0.02  # the reference learned: the check can fail


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_offloaded_steps_equal_the_device_step(name, tmp_path):
    """CPU offload (stage 2; stage 3 with half of each shard offloaded) and NVMe give the
    device step's parameters exactly (the host step runs the same update, chunk by chunk)."""
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    configs = [_config(name, 2), _config(name, 2, offload_optimizer={"device": "cpu"}),
               _config(name, 2, offload_optimizer=nvme, sub_group_size=5000),
               _config(name, 3), _config(name, 3, offload_optimizer={"device": "cpu",
                                                                     "ratio": 0.5})]
    device2, cpu2, nvme2, device3, half3 = run_distributed(_train_each, 2, args=(configs,))[0]
    for (losses, params, _), (base_losses, base_params, _) in [
            (cpu2, device2), (nvme2, device2), (half3, device3)]:
        assert losses == base_losses
        for key, value in base_params.items():
            assert torch.equal(params[key], value), key


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_bf16_tracks_the_fp32_reference(name):
    """bf16 parameters and gradients, fp32 master and state: losses within 1% of the fp32
    reference after 6 steps."""
    ref_losses, _ = training.train_reference(2, STEPS, GAS, _config(name, 0))
    (losses, _, _), = run_distributed(_train_each, 2, args=([_config(name, 2, "bf16")],))[0]
    assert losses == pytest.approx(ref_losses, rel=1e-2)


def _resume(rank, world, name, stage, gas, first, steps, load_dir, save_dir):
    import zero

    config = _config(name, stage)
    config["gradient_accumulation_steps"] = gas
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    if load_dir:
        engine.load_checkpoint(load_dir)
        assert engine.global_steps == first
    losses = training.train_engine(engine, rank, world, steps, gas, first_step=first)
    if save_dir:
        engine.save_checkpoint(save_dir)
    return losses


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_checkpoint_resumes_at_another_world_size_and_stage(name, tmp_path):
    """Saved by 2 ranks at stage 1, resumed by 1 rank at stage 3 (twice the accumulation: the
    same global batch): the state arrays are resharded and the run goes on unchanged."""
    saved = 3
    whole = run_distributed(_resume, 2, args=(name, 1, 1, 0, STEPS, None, None))[0]
    run_distributed(_resume, 2, args=(name, 1, 1, 0, saved, None, str(tmp_path)))
    resumed = run_distributed(_resume, 1, args=(name, 3, 2, saved, STEPS - saved,
                                                str(tmp_path), None))[0]
    assert resumed == pytest.approx(whole[saved:], rel=1e-5)


def _client_optimizer(rank, world, name):
    import zero
    from zero.compat.deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from zero.compat.deepspeed.ops.lion import FusedLion

    config = _config(name, 2)
    hyper = dict(config.pop("optimizer")["params"])
    model = training.make_model()
    if name == "adagrad":
        client = torch.optim.Adagrad(model.parameters(), **hyper)
    else:
        client = FusedLion(model.parameters(), **hyper)
    engine, optimizer, _, _ = zero.initialize(model=model, config=config, optimizer=client)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    ds_cpu = DeepSpeedCPUAdagrad(torch.nn.Linear(2, 2).parameters(), lr=0.1, weight_decay=0.5)
    return losses, engine.optimizer_name(), ds_cpu.defaults["weight_decay"]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_scripts_own_optimizer_object_trains_the_same(name):
    (config_run, _, _), = run_distributed(_train_each, 2, args=([_config(name, 2)],))[0][:1]
    losses, optimizer_name, weight_decay = run_distributed(_client_optimizer, 2,
                                                           args=(name,))[0]
    assert losses == config_run
    assert optimizer_name == {"adagrad": "Adagrad", "lion": "FusedLion"}[name]
    assert weight_decay == 0.5


def test_deepspeeds_lion_class_steps_outside_an_engine_too():
    """deepspeed.ops.lion's classes are working torch optimizers: one step by hand."""
    from zero.compat.deepspeed.ops.lion import DeepSpeedCPULion

    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = DeepSpeedCPULion([param], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    param.grad = torch.tensor([0.5, -0.25, 0.0])
    optimizer.step()
    # p * (1 - lr * wd) - lr * sign(0.1 * g); sign(0) = 0 leaves the last one decayed only
    assert torch.allclose(param.detach(), torch.tensor([0.95 - 0.1, -1.9 + 0.1, 2.85]))
    assert torch.allclose(optimizer.state[param]["exp_avg"], torch.tensor([0.005, -0.0025, 0.0]))


@pytest.mark.parametrize("block,message", [
    ({"type": "Lamb", "params": {}}, "Lamb"),
    ({"type": "Adagrad", "params": {"amsgrad": True}}, "optimizer.params.amsgrad"),
    ({"type": "Lion", "params": {"betas": [0.9, 1.5]}}, "optimizer.params.betas"),
])
def test_config_errors_name_the_key(block, message):
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config({"train_batch_size": 2, "optimizer": block}, world_size=1)


def test_types_match_case_insensitively_as_in_deepspeed():
    from zero.config import load_config

    for written, canonical in [("adagrad", "Adagrad"), ("LION", "Lion")]:
        config = load_config({"train_batch_size": 2, "optimizer": {"type": written}}, world_size=1)
        assert config.optimizer.type == canonical
    lion = load_config({"train_batch_size": 2, "optimizer": {"type": "Lion"}}, world_size=1)
    assert lion.optimizer.decoupled_weight_decay is True
    assert dict(lion.optimizer.params)["betas"] == (0.9, 0.999)  # DeepSpeed's FusedLion default


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_estimate_reads_the_optimizer_from_the_config(name):
    """zero-mem sizes the state from the config's type: one fp32 array, 4 bytes per element
    (Adam's two are 8). That the estimate equals the engine's bytes: tests/test_estimate.py."""
    from zero.reports import estimate as est

    setup, _ = est.setup_from_config(_config(name, 2), world_size=2)
    assert setup.optimizer == name
    assert est.OPTIMIZER_STATE_BYTES[name] == 4 == est.OPTIMIZER_STATE_BYTES["adam"] // 2
    assert est.state_arrays(setup) == ["master", {"adagrad": "sum", "lion": "exp_avg"}[name]]
