"""Adagrad and Lion, DeepSpeed's other ZeRO optimizers, on every stage: they train like the
single-process reference (torch.optim.Adagrad; the torch Lion of deepspeed.ops.lion), offload
to CPU memory and NVMe bit for bit, checkpoint at one world size and stage and resume at
another, come from the config or as the script's own optimizer object, and are counted by the
memory report and the estimator (one fp32 array each: 4 bytes per element, not Adam's 8)."""
import copy

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
    config["optimizer"] = copy.deepcopy(OPTIMIZERS[name])
    return config


def _train_each(rank, world, configs):
    import zero

    runs = []
    for config in configs:
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        losses = training.train_engine(engine, rank, world, STEPS, GAS)
        weights = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
        state = engine.memory_report()["categories"]["optimizer_state"]
        runs.append((losses, weights, (state["current"], state["expected"])))
        engine.destroy()
    return runs


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_stage_matches_the_single_process_reference(name):
    ref_losses, ref_params = training.train_reference(2, STEPS, GAS, _config(name, 0))
    configs = [_config(name, stage) for stage in range(4)]
    for stage, (losses, params, (state_bytes, formula_bytes)) in enumerate(
            run_distributed(_train_each, 2, args=(configs,))[0]):
        assert losses == pytest.approx(ref_losses, rel=1e-5), stage
        for key, expected in ref_params.items():
            assert training.relative_error(params[key], expected) < 1e-5, (stage, key)
        # one fp32 array per element (4Ψ/N), counted, as the report's formula says
        psi = sum(p.numel() for p in training.make_model().parameters())
        assert state_bytes == formula_bytes, stage
        assert 4 * psi / (2 if stage else 1) <= state_bytes < 4.1 * psi / (2 if stage else 1), stage
    assert ref_losses[-1] < ref_losses[0] - 0.02  # the reference learned: the check can fail


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_offloaded_steps_equal_the_device_step(name, tmp_path):
    """CPU offload (stage 2; stage 3 with half of each shard offloaded, or with the parameters
    offloaded too) and NVMe give the device step's parameters exactly (the host step runs the
    same update, chunk by chunk). That the update is the right one: the reference test above
    and DeepSpeed's own CPU Lion and Adagrad (tests/test_training_deepspeed.py)."""
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    cpu = {"device": "cpu"}
    configs = [_config(name, 2), _config(name, 2, offload_optimizer=cpu),
               _config(name, 2, offload_optimizer=nvme, sub_group_size=5000),
               _config(name, 3), _config(name, 3, offload_optimizer={"device": "cpu",
                                                                     "ratio": 0.5}),
               _config(name, 3, offload_optimizer=cpu, offload_param=cpu)]
    device2, cpu2, nvme2, device3, half3, params3 = run_distributed(_train_each, 2,
                                                                    args=(configs,))[0]
    for (losses, params, _), (base_losses, base_params, _) in [
            (cpu2, device2), (nvme2, device2), (half3, device3), (params3, device3)]:
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


def _initial_sums(rank, world, offload):
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_optimizer_state

    extra = {"offload_optimizer": offload} if offload else {}
    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=_config("adagrad", 3, **extra))
    return [safe_get_full_optimizer_state(p, "sum") for p in engine.module.parameters()]


@pytest.mark.parametrize("where", ["device", "cpu", "nvme"])
def test_adagrads_sum_starts_at_the_initial_accumulator_value(where, tmp_path):
    """As torch fills it when the optimizer is built: before the first step, on every rank,
    wherever the state lives."""
    offload = None if where == "device" else {"device": where, "nvme_path": str(tmp_path)} \
        if where == "nvme" else {"device": where}
    for sums in run_distributed(_initial_sums, 2, args=(offload,)):
        assert sums and all(torch.equal(s, torch.full_like(s, 0.1)) for s in sums)


def _resume(rank, world, name, stage, gas, first, steps, load_dir, save_dir):
    import zero

    config = _config(name, stage)
    config["gradient_accumulation_steps"] = gas
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    return training.load_train_save(engine, rank, world, gas, first, steps, load_dir, save_dir)


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


CLIENTS = {"torch.optim.Adagrad": "adagrad", "DeepSpeedCPUAdagrad": "adagrad",
           "FusedLion": "lion", "DeepSpeedCPULion": "lion"}


def _client_optimizer(rank, world, client_name):
    import zero
    from zero.compat.deepspeed.ops import adagrad, lion

    name = CLIENTS[client_name]
    config = _config(name, 2)
    hyper = dict(config.pop("optimizer")["params"])
    model = training.make_model()
    if client_name == "torch.optim.Adagrad":
        client = torch.optim.Adagrad(model.parameters(), **hyper)
    elif client_name == "DeepSpeedCPUAdagrad":
        del hyper["lr_decay"], hyper["initial_accumulator_value"]  # not its arguments
        client = adagrad.DeepSpeedCPUAdagrad(model.parameters(), **hyper)
    else:
        client = getattr(lion, client_name)(model.parameters(), **hyper)
    engine, _, _, _ = zero.initialize(model=model, config=config, optimizer=client)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    return losses, engine.optimizer_name(), len(client.state)


@pytest.mark.parametrize("client_name", sorted(CLIENTS))
def test_the_scripts_own_optimizer_object_trains_the_same(client_name):
    """As the config's optimizer, and the client's own (torch's Adagrad builds its whole
    unsharded state at once) is dropped: the engine keeps it, sharded."""
    name = CLIENTS[client_name]
    config = _config(name, 2)
    if client_name == "DeepSpeedCPUAdagrad":
        config["optimizer"]["params"] = {"lr": 0.05, "weight_decay": 1e-3}
    (config_run, _, _), = run_distributed(_train_each, 2, args=([config],))[0]
    losses, optimizer_name, client_state = run_distributed(_client_optimizer, 2,
                                                           args=(client_name,))[0]
    assert losses == config_run
    assert optimizer_name == client_name.split(".")[-1]
    assert client_state == 0


def _optimizer_callable(rank, world):
    import zero

    config = _config("adagrad", 2)
    hyper = dict(config.pop("optimizer")["params"])
    model = training.make_model()
    built = []

    def build(params):  # DeepSpeed's DeepSpeedOptimizerCallable
        built.append(params)
        return torch.optim.Adagrad(params, **hyper)

    engine, _, _, _ = zero.initialize(model=model, config=config, optimizer=build,
                                      model_parameters=(p for p in model.parameters()))
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    given = [id(p) for p in built[0]] if len(built) == 1 else None
    return losses, engine.optimizer_name(), given == [id(p) for p in model.parameters()]


def test_an_optimizer_callable_builds_the_optimizer_over_model_parameters():
    """initialize(optimizer=callable) calls it once with model_parameters (a generator here,
    handed over as a list) and trains as the config's optimizer. It used to be ignored: no
    optimizer, lr 0, the weights never moved."""
    (config_run, _, _), = run_distributed(_train_each, 2, args=([_config("adagrad", 2)],))[0]
    losses, optimizer_name, given = run_distributed(_optimizer_callable, 2)[0]
    assert losses == config_run
    assert optimizer_name == "Adagrad" and given


def test_an_optimizer_that_is_neither_an_optimizer_nor_a_callable_is_named():
    from zero.param_groups import built_by_callable

    model = training.make_model()
    with pytest.raises(TypeError, match="torch.optim.Optimizer or a callable.*not dict"):
        built_by_callable({"type": "Adam"}, model, None)
    with pytest.raises(TypeError, match="callable passed to initialize.. returned list"):
        built_by_callable(lambda params: params, model, None)


def test_deepspeeds_lion_class_steps_outside_an_engine_too():
    """deepspeed.ops.lion's classes are working torch optimizers: one step by hand."""
    from zero.compat.deepspeed.ops.lion import DeepSpeedCPULion

    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = DeepSpeedCPULion([param], lr=0.1, betas=(0.5, 0.9), weight_decay=0.5)
    param.grad = torch.tensor([1.0, -1.0, 0.0])
    optimizer.step()
    # p * (1 - lr * wd) - lr * sign(0.5 m + 0.5 g), m = 0; sign(0) = 0: the last only decays
    assert torch.allclose(param.detach(), torch.tensor([0.95 - 0.1, -1.9 + 0.1, 2.85]))
    # m = 0.9 m + 0.1 g
    assert torch.allclose(optimizer.state[param]["exp_avg"], torch.tensor([0.1, -0.1, 0.0]))
    param.grad = torch.tensor([-0.15, 0.05, 1.0])
    optimizer.step()
    # direction sign(0.5 m + 0.5 g) = sign([-0.025, -0.025, 0.5]): beta1 mixes, not beta2
    # (0.9 m + 0.1 g = [0.075, -0.085, ...] would turn the first), and the second follows the
    # momentum against its own gradient; m then 0.9 m + 0.1 g
    assert torch.allclose(param.detach(), torch.tensor([0.85 * 0.95 + 0.1, -1.8 * 0.95 + 0.1,
                                                       2.85 * 0.95 - 0.1]))
    assert torch.allclose(optimizer.state[param]["exp_avg"],
                          torch.tensor([0.075, -0.085, 0.1]))


@pytest.mark.parametrize("block,message", [
    ({"type": "OneBitLamb", "params": {}}, "OneBitLamb"),
    ({"type": "Lamb", "params": {"min_coeff": 2.0, "max_coeff": 1.0}}, "optimizer.params.min_coeff"),
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
    assert est.state_arrays(setup) == ["master", {"adagrad": "sum", "lion": "exp_avg"}[name]]
