"""DeepSpeed's engine.offload_states() / reload_states() (zero/offload_states.py): between
steps the chosen states leave the device for host memory (the registry counts them there),
the module stays readable, and training goes on exactly as without the round trip, whether
reload_states() is called or the next forward brings back what it needs. On this machine the
device is the CPU: the states move between two host allocations, the same code path as on a
GPU (tests/test_cuda_engine.py measures the GPU memory given back)."""
import pytest
import torch

import training
import zero.offload_states  # noqa: F401  (the ranks read zero.offload_states.offloaded)
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)
STATES = ["optim_states", "hp_params", "lp_params", "lp_grads"]
CATEGORY = {"optim_states": "optimizer_state", "hp_params": "fp32_master",
            "lp_params": "param", "lp_grads": "gradient"}


def _device_bytes(engine) -> dict[str, int]:
    registry = engine.core.registry()
    return {state: registry.usage(category, "device").current
            for state, category in CATEGORY.items()}


def _host_bytes(engine) -> int:
    registry = engine.core.registry()
    return registry.location_usage("host_pinned").current + \
        registry.location_usage("host_pageable").current


def _config(stage, precision):
    """Stage 3 with every parameter partitioned (the test model's are all small)."""
    extra = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}
    return training.engine_config(stage, gas=1, precision=precision, scheduler=False, **extra)


def _sleep_between_steps(rank, world, stage, precision, include, reload):
    import zero

    config = _config(stage, precision)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 2, 1)
    before = training.parameters_of(engine.module)
    device_before, host_before = _device_bytes(engine), _host_bytes(engine)
    engine.offload_states(include=include)
    asleep = {"device": _device_bytes(engine), "host": _host_bytes(engine) - host_before,
              "offloaded": [s.value for s in zero.offload_states.offloaded(engine.core)]}
    readable = training.parameters_of(engine.module) if stage < 3 else before
    if reload:
        engine.reload_states()
    losses += training.train_engine(engine, rank, world, 2, 1, first_step=2)
    return losses, device_before, asleep, _same(readable, before), \
        zero.offload_states.offloaded(engine.core)


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("stage,precision", [(0, "fp32"), (1, "bf16"), (2, "bf16"),
                                             (3, "bf16"), (3, "fp32")])
@pytest.mark.parametrize("reload", [True, False], ids=["reload_states", "on-demand"])
def test_offloaded_states_leave_the_device_and_training_goes_on_unchanged(stage, precision,
                                                                          reload):
    baseline = run_distributed(_plain_run, 2, args=(_config(stage, precision),))[0]
    for losses, before, asleep, readable, after in run_distributed(
            _sleep_between_steps, 2, args=(stage, precision, None, reload)):
        assert losses == baseline  # bit for bit
        assert asleep["offloaded"] == STATES
        for state, bytes_before in before.items():
            assert asleep["device"][state] == 0, state
        moved = sum(before.values())
        assert moved > 0 and asleep["host"] == moved
        assert readable and after == []


def _plain_run(rank, world, config):
    """Four steps without a sleep."""
    return training.resume_and_train(config, rank, world, 0, 4)


def test_only_the_included_states_move():
    for losses, before, asleep, readable, after in run_distributed(
            _sleep_between_steps, 2, args=(2, "bf16", ["optim_states", "hp_params"], False)):
        assert asleep["offloaded"] == ["optim_states", "hp_params"]
        assert asleep["device"]["optim_states"] == asleep["device"]["hp_params"] == 0
        assert asleep["device"]["lp_params"] == before["lp_params"] > 0
        assert asleep["host"] == before["optim_states"] + before["hp_params"]


def _gather_while_asleep(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(3, "bf16"))
    training.train_engine(engine, rank, world, 1, 1)
    engine.offload_states()
    with zero.GatheredParameters(engine.module.parameters()):  # a weight sync to vLLM
        whole = training.parameters_of(engine.module)
    still = [s.value for s in zero.offload_states.offloaded(engine.core)]
    engine.reload_states()
    with zero.GatheredParameters(engine.module.parameters()):
        again = training.parameters_of(engine.module)
    return _same(whole, again), still


def test_a_gather_while_asleep_brings_back_only_the_parameters():
    for same, still in run_distributed(_gather_while_asleep, 2):
        assert same and still == ["optim_states", "hp_params", "lp_grads"]


def _bad_calls(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1))
    errors = []
    for kwargs in ({"device": "nvme"}, {"device": "gpu"}, {"include": ["moments"]}):
        with pytest.raises(ValueError) as info:
            engine.offload_states(**kwargs)
        errors.append(str(info.value))
    engine.offload_states(device="none")  # a warning, nothing moved
    return errors, zero.offload_states.offloaded(engine.core)


def test_bad_arguments_are_named():
    for errors, offloaded in run_distributed(_bad_calls, 2):
        assert "NVMe" in errors[0] and "'gpu'" in errors[1] and "'moments'" in errors[2]
        assert "optim_states" in errors[2] and offloaded == []


def _save_and_destroy_while_asleep(rank, world, save_dir):
    import zero

    config = _config(2, "bf16")
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.offload_states()
    engine.save_checkpoint(save_dir)  # the module's host copies, then the shards
    went_on = training.train_engine(engine, rank, world, 2, 1, first_step=2)
    fresh, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    fresh.load_checkpoint(save_dir)
    resumed = training.train_engine(fresh, rank, world, 2, 1, first_step=2)
    engine.offload_states()
    held = {name: p.data for name, p in engine.module.named_parameters()}  # host views
    values = {name: t.clone() for name, t in held.items()}
    engine.destroy()
    junk = [torch.full_like(t, 7.0) for t in values.values() for _ in range(4)]  # reuse frees
    return went_on, resumed, _same({n: t.clone() for n, t in held.items()}, values), len(junk)


def test_a_checkpoint_saved_asleep_resumes_and_views_outlive_the_engine(tmp_path):
    for went_on, resumed, views_intact, _ in run_distributed(
            _save_and_destroy_while_asleep, 2, args=(str(tmp_path),)):
        assert resumed == went_on
        assert views_intact


def _zero_grad_while_asleep(rank, world, stage):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=_config(stage, "bf16"))
    training.train_engine(engine, rank, world, 1, 1)
    tokens, targets = training.batches(world, 1, 1)[rank]
    engine.backward(engine(tokens, targets))  # gradients, not stepped
    engine.offload_states(include=["lp_grads"])
    before = _grad_sum(engine)
    engine.zero_grad()
    still = [s.value for s in zero.offload_states.offloaded(engine.core)]
    after = _grad_sum(engine)
    engine.reload_states()
    losses = training.train_engine(engine, rank, world, 2, 1, first_step=1)
    return still, before, after, losses


def _grad_sum(engine) -> float:
    return sum(p.grad.abs().sum().item() for p in engine.module.parameters()
               if p.grad is not None)


@pytest.mark.parametrize("stage", [0])
def test_zero_grad_while_asleep_leaves_the_gradients_where_they_are(stage):
    """Stage 0 keeps whole gradients between steps (param.grad views them): zeroed in their
    host copies, not brought back (stages 1-3 hold none between steps)."""
    baseline = run_distributed(_plain_run, 2, args=(_config(stage, "bf16"),))[0]
    for still, before, after, losses in run_distributed(_zero_grad_while_asleep, 2,
                                                         args=(stage,)):
        assert still == ["lp_grads"] and before > 0 and after == 0
        assert losses == baseline[1:3]  # stale gradients would have been added in


def _out_of_host_memory(rank, world, fail):
    """A model of Ψ = 25M: its bf16 parameters (2Ψ bytes) fit under an address-space limit of
    3Ψ above what the process has, one of Adam's fp32 arrays (4Ψ) does not: the parameters
    move first, then the optimizer state's host copy cannot be allocated."""
    import resource

    import zero
    from zero.models.tiny_gpt import GPTConfig

    model = training.make_model(GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2,
                                          n_embd=1024))
    engine, _, _, _ = zero.initialize(model=model, config=_config(1, "bf16"))
    losses = training.train_engine(engine, rank, world, 1, 1)
    result = {}
    if fail:
        before = training.parameters_of(engine.module)
        psi = sum(p.numel() for p in model.parameters())
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (used + 3 * psi, hard))
        result["adam_array_bytes"] = 4 * psi  # the one allocation that must fail
        try:
            engine.offload_states(include=["lp_params", "optim_states"])
        except MemoryError as error:
            result["error"] = str(error)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        result["offloaded"] = zero.offload_states.offloaded(engine.core)
        result["same"] = _same(training.parameters_of(engine.module), before)
    result["losses"] = losses + training.train_engine(engine, rank, world, 2, 1, first_step=1)
    return result


@pytest.mark.skipif(torch.cuda.is_available(), reason="an address-space limit and the CUDA "
                    "driver's reservations do not mix; the states move between host buffers "
                    "on a CPU device, the same rollback")
def test_a_failed_offload_puts_back_what_it_moved():
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard address-space limit is set; the test needs to raise its own")
    failed = run_distributed(_out_of_host_memory, 1, args=(True,), timeout=120)[0]
    plain = run_distributed(_out_of_host_memory, 1, args=(False,), timeout=120)[0]
    assert "offload_states ran out of host memory" in failed["error"]
    # the host copy of Adam's first array failed, after the parameters' had been made
    assert f"of {failed['adam_array_bytes']} bytes" in failed["error"]
    assert failed["offloaded"] == [] and failed["same"]  # the parameters came back
    assert failed["losses"] == plain["losses"]
