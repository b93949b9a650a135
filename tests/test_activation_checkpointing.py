"""Activation checkpointing under every ZeRO stage (2 gloo ranks): torch.utils.checkpoint in both
forms and DeepSpeed's deepspeed.checkpointing API, with the tied head/embedding weight inside a
recomputed region, match a single-process reference trained without checkpointing; the memory
report measures the activations it saves."""
import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)

WORLD, STEPS, GAS = 2, 2, 2
# stage 3 without prefetch or reuse: every unit is released after its forward, so each
# recomputation in backward gathers its unit again
STAGE3_REGATHER = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                   "stage3_param_persistence_threshold": 0}


def _config(stage, block=None):
    config = training.engine_config(stage, gas=GAS, **(STAGE3_REGATHER if stage == 3 else {}))
    if block is not None:
        config["activation_checkpointing"] = block
    return config


def _train(rank, world, stage, checkpointing, block=None):
    import zero

    engine, *_ = zero.initialize(model=training.make_model(checkpointing=checkpointing),
                                 config=_config(stage, block))
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    params = {name: value.float() for name, value in engine.module_state_dict().items()}
    engine.destroy()
    return losses, params if rank == 0 else None


def _matches_reference(stage, checkpointing, block=None):
    results = run_distributed(_train, WORLD, args=(stage, checkpointing, block))
    ref_losses, ref_params = training.train_reference(WORLD, STEPS, GAS, _config(stage))
    losses, params = results[0]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for name, expected in ref_params.items():
        assert training.relative_error(params[name], expected) < 1e-5, name


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("checkpointing", ["reentrant", "non_reentrant", "deepspeed",
                                           "deepspeed_non_reentrant"])
def test_checkpointed_training_with_tied_weights_matches_the_reference(stage, checkpointing):
    _matches_reference(stage, checkpointing)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_cpu_checkpointing_and_partition_options_match_the_reference(stage):
    block = {"partition_activations": True, "cpu_checkpointing": True,
             "contiguous_memory_optimization": True, "number_checkpoints": 3}
    _matches_reference(stage, "deepspeed", block)


def _activations(rank, world, checkpointing):
    import zero

    config = _config(2)
    config["memory_report"] = {"every_n_steps": 1}
    engine, *_ = zero.initialize(model=training.make_model(checkpointing=checkpointing),
                                 config=config)
    training.train_engine(engine, rank, world, 1, GAS)
    report = engine.memory_report()
    engine.destroy()
    return report["activations_bytes"]


def test_the_memory_report_measures_the_activations_checkpointing_saves():
    plain = run_distributed(_activations, WORLD, args=(None,))
    checkpointed = run_distributed(_activations, WORLD, args=("deepspeed",))
    for kept, full in zip(checkpointed, plain):
        assert 0 < kept < full / 2  # the blocks' and head's internals are recomputed instead


def test_the_estimator_counts_what_checkpointing_keeps():
    from zero.reports.activations import saved_activation_bytes

    tokens, targets = training.batches(1, 1, 1)[0]
    plain = saved_activation_bytes(training.make_model(), [tokens, targets])
    checkpointed = saved_activation_bytes(training.make_model(checkpointing="reentrant"),
                                          [tokens, targets])
    assert 0 < checkpointed < plain / 2


def _configured(rank, world):
    import zero
    import zero.compat.deepspeed as deepspeed

    before = deepspeed.checkpointing.is_configured()
    engine, *_ = zero.initialize(model=training.make_model(checkpointing="deepspeed"),
                                 config=_config(1, {"cpu_checkpointing": True, "profile": True}))
    from zero.activation_checkpointing import settings

    applied = settings().cpu_checkpointing and settings().profile
    engine.destroy()
    return before, deepspeed.checkpointing.is_configured(), applied


def test_the_config_block_configures_deepspeed_checkpointing_at_initialize():
    for before, after, applied in run_distributed(_configured, WORLD):
        assert (before, after, applied) == (False, True, True)


def test_configure_reads_the_block_and_the_arguments_override_it(tmp_path):
    import json

    import zero.activation_checkpointing as checkpointing

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 1,
                                "activation_checkpointing": {"cpu_checkpointing": True,
                                                             "profile": True}}))
    checkpointing.configure(None, deepspeed_config=str(path), profile=False)
    assert checkpointing.is_configured()
    assert checkpointing.settings().cpu_checkpointing and not checkpointing.settings().profile


def test_configure_refuses_an_mpu_without_a_tensor_group_naming_the_methods():
    import zero.activation_checkpointing as checkpointing
    from zero.parallel.mpu_grid import MpuError

    class Mpu:
        def get_model_parallel_world_size(self):
            return 2

    with pytest.raises(MpuError, match="get_tensor_model_parallel_group/_rank/_world_size"):
        checkpointing.configure(Mpu())


def test_contiguous_memory_without_partitioned_activations_is_a_config_error():
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="activation_checkpointing.contiguous_memory_optimization"):
        load_config({"train_batch_size": 1,
                     "activation_checkpointing": {"contiguous_memory_optimization": True}}, 1)


def test_profile_prints_each_regions_times(capsys):
    import zero.activation_checkpointing as checkpointing

    checkpointing.configure(None, profile=True)
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    checkpointing.checkpoint(layer, x).sum().backward()
    out = capsys.readouterr().out
    assert "time (ms) | checkpoint forward:" in out and "time (ms) | checkpoint recompute:" in out
    checkpointing.configure(None)


def test_non_reentrant_checkpoint_gives_weights_their_gradients_from_inputs_without_one():
    """DeepSpeed's non_reentrant_checkpoint: a region whose input needs no gradient (the
    reentrant form gives its weights none); dropout draws the same in the recomputation."""
    from zero.compat.deepspeed.checkpointing import configure, non_reentrant_checkpoint

    configure(None)  # the defaults, whatever an earlier test in this process configured

    torch.manual_seed(0)
    region = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                                 torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)  # no gradient wanted
    grads = []
    for run in (region, lambda inputs: non_reentrant_checkpoint(region, inputs)):
        region.zero_grad()
        torch.manual_seed(1)
        run(x).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in region.parameters()])
    assert all(g.abs().sum() > 0 for g in grads[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_non_reentrant_checkpoint_refuses_the_options_it_cannot_keep_apart():
    import zero.activation_checkpointing as checkpointing

    checkpointing.configure(None, checkpoint_in_cpu=True)
    try:
        with pytest.raises(NotImplementedError, match="cpu_checkpointing"):
            checkpointing.non_reentrant_checkpoint(torch.nn.Linear(2, 2), torch.randn(1, 2))
    finally:
        checkpointing.configure(None)  # the defaults again


def test_detach_variable_keeps_whether_each_tensor_needs_a_gradient():
    from zero.compat.deepspeed.checkpointing import detach_variable

    wants, plain = torch.randn(2, requires_grad=True) * 2, torch.randn(2)
    out = detach_variable((wants, plain, 3))
    assert out[0].is_leaf and out[0].requires_grad and not out[1].requires_grad
    assert torch.equal(out[0], wants) and out[2] == 3
    with pytest.raises(RuntimeError, match="tuple"):
        detach_variable([wants])


def test_a_non_reentrant_region_recomputes_for_each_backward_through_it():
    """A retained graph's second backward recomputes the region again (the recomputation's
    context is entered once per backward)."""
    from zero.compat.deepspeed.checkpointing import configure, non_reentrant_checkpoint

    configure(None)
    torch.manual_seed(0)
    region = torch.nn.Linear(4, 4)
    loss = non_reentrant_checkpoint(region, torch.randn(3, 4)).pow(2).sum()
    loss.backward(retain_graph=True)
    once = region.weight.grad.clone()
    loss.backward()
    assert torch.allclose(region.weight.grad, 2 * once)
