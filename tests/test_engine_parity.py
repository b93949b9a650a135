"""ZeRO stages 0, 1, 2 on 1, 2 and 4 ranks train exactly like single-process PyTorch
(AdamW, clipping, a scheduler, gradient accumulation) on the concatenated global batch."""
import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS = 20
GAS = 2


def _train(rank, world, stage, precision, freeze):
    import zero

    model = training.make_model(freeze_position_embedding=freeze)
    config = training.engine_config(stage, gas=GAS, precision=precision)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    return losses, training.parameters_of(engine.module)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_fp32_matches_single_process_adamw(stage, world):
    config = training.engine_config(stage, gas=GAS)
    ref_losses, ref_params = training.train_reference(world, STEPS, GAS, config,
                                                      freeze_position_embedding=True)
    results = run_distributed(_train, world, args=(stage, "fp32", True), timeout=240)
    for losses, params in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for name, expected in ref_params.items():
            assert training.relative_error(params[name], expected) < 1e-5, name
    # Every rank ends with the same full model, and the frozen parameter never moved.
    for _, params in results[1:]:
        for name in params:
            assert torch.equal(params[name], results[0][1][name])
    assert torch.equal(results[0][1]["position_embedding.weight"],
                       training.parameters_of(training.make_model())["position_embedding.weight"])
    assert ref_losses[-1] < ref_losses[0] - 0.2  # the model actually learned


@pytest.mark.parametrize("stage", [1, 2])
def test_bf16_tracks_the_fp32_reference(stage):
    """bf16 params and grads with fp32 master weights. Stated tolerance: losses within 2% of
    the fp32 reference, each parameter tensor within 5% relative L2 after 20 steps (bf16
    keeps 8 mantissa bits, 0.4% per rounding; Adam compounds it)."""
    world = 2
    config = training.engine_config(stage, gas=GAS)
    ref_losses, ref_params = training.train_reference(world, STEPS, GAS, config)
    results = run_distributed(_train, world, args=(stage, "bf16", False), timeout=240)
    for losses, params in results:
        assert losses == pytest.approx(ref_losses, rel=2e-2)
        for name, expected in ref_params.items():
            assert training.relative_error(params[name], expected) < 5e-2, name


def _train_one_micro_step(rank, world):
    import zero

    model = training.make_model(freeze_position_embedding=True)
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(1, gas=1))
    losses = training.train_engine(engine, rank, world, STEPS, 1)
    report = engine.memory_report()
    psi = sum(engine.core.group_numel(g) for g in range(engine.core.group_count))
    return (losses, training.parameters_of(engine.module), report["categories"]["gradient"],
            report["model_state_formula"], psi)


@pytest.mark.parametrize("world", [2, 4])
def test_stage_1_with_one_micro_step_shards_its_gradients(world):
    """gradient_accumulation_steps 1 leaves stage 1 nothing to accumulate: its gradients go
    into each rank's shard in backward, as at stage 2 (4Ψ/N bytes from the first gradient to
    the step, none between steps, no full buffer), and it still trains exactly like the
    single-process reference."""
    config = training.engine_config(1, gas=1)
    ref_losses, ref_params = training.train_reference(world, STEPS, 1, config,
                                                      freeze_position_embedding=True)
    for losses, params, gradient, formula, psi in run_distributed(
            _train_one_micro_step, world, timeout=240):
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for name, expected in ref_params.items():
            assert training.relative_error(params[name], expected) < 1e-5, name
        assert gradient["peak"] == gradient["expected"] == 4 * psi // world
        assert gradient["current"] == 0
        assert formula == "4Ψ + 12Ψ/N"  # fp32: parameters 4Ψ, gradients 4Ψ/N, Adam 8Ψ/N

