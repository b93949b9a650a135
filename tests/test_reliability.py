"""Jobs that go wrong end promptly on every rank with a message naming the cause, and never
put a NaN into the weights: non-finite gradients, a backward that bypassed the engine, ranks
started with different configs or models."""
import dataclasses
import math

import pytest
import torch

import training
from distributed_harness import run_distributed

TIMEOUT = 60  # every case must end well within this (in practice: seconds)


def _nan_at_step(rank, world, stage, precision, policy):
    import zero

    config = training.engine_config(stage, gas=1, precision=precision, scheduler=False)
    config["nonfinite_gradients"] = policy
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    before_nan = {}

    def poison(step, loss):  # rank 1's loss is NaN at step 1 only
        if step == 1:
            before_nan.update(training.parameters_of(engine.module))
            if rank == 1:
                return loss * float("nan")
        return loss

    try:
        losses = training.train_engine(engine, rank, world, 3, 1, on_step=poison)
    except FloatingPointError as error:
        return {"raised": str(error)}
    after = training.parameters_of(engine.module)
    return {"losses": losses, "skipped": engine.skipped_steps, "applied": engine.applied_steps,
            "finite": all(torch.isfinite(p).all().item() for p in after.values()),
            "moved": any(not torch.equal(after[k], before_nan[k]) for k in after)}


@pytest.mark.parametrize("stage,precision", [(2, "bf16"), (2, "fp32"), (3, "bf16"), (1, "fp32")])
def test_a_nan_gradient_on_one_rank_skips_the_step_on_every_rank(stage, precision):
    results = run_distributed(_nan_at_step, 2, args=(stage, precision, "skip"), timeout=TIMEOUT)
    for result in results:
        assert result["skipped"] == 1 and result["applied"] == 2
        assert result["finite"], "a NaN reached the weights"
        assert result["moved"], "the steps after the skipped one must still train"
        assert math.isfinite(result["losses"][2])


def test_nonfinite_gradients_raise_names_the_option_on_every_rank():
    results = run_distributed(_nan_at_step, 2, args=(2, "bf16", "raise"), timeout=TIMEOUT)
    for result in results:
        assert "not finite" in result["raised"] and "nonfinite_gradients" in result["raised"]


def _plain_backward(rank, world, stage):
    import zero

    config = training.engine_config(stage, gas=1, scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    tokens, targets = training.batches(world, 1, 1)[rank]
    before = training.parameters_of(engine.module)
    engine(tokens, targets).backward()  # bypasses engine.backward
    try:
        engine.step()
    except RuntimeError as error:
        after = training.parameters_of(engine.module)
        return str(error), all(torch.equal(after[k], before[k]) for k in after)
    return None, False


@pytest.mark.parametrize("stage", [0, 2])
def test_step_after_plain_loss_backward_is_an_error_naming_engine_backward(stage):
    for message, untouched in run_distributed(_plain_backward, 2, args=(stage,), timeout=TIMEOUT):
        assert message is not None and "engine.backward(loss)" in message
        assert untouched


def _started_apart(rank, world, change):
    import zero
    from zero.agreement import StartupMismatch

    config = training.engine_config(2, gas=1, scheduler=False)
    model_config = training.MODEL
    if rank == 1:
        if change == "lr":
            config["optimizer"]["params"]["lr"] = 0.5
        elif change == "stage":
            config["zero_optimization"]["stage"] = 3
        elif change == "model":
            model_config = dataclasses.replace(training.MODEL, n_embd=48)
    try:
        zero.initialize(model=training.make_model(model_config), config=config)
    except StartupMismatch as error:
        return str(error)
    return None


@pytest.mark.parametrize("change,named", [
    ("lr", "config optimizer.params.lr"),
    ("stage", "config zero_optimization.stage"),
    ("model", "parameter "),
])
def test_ranks_started_with_different_configs_or_models_stop_naming_the_difference(change, named):
    for message in run_distributed(_started_apart, 2, args=(change,), timeout=TIMEOUT):
        assert message is not None, "the mismatch was not caught"
        assert named in message and "rank 0" in message and "rank 1" in message
