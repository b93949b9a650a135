"""zero's fp16 dynamic loss scaler against the real DeepSpeed 0.19.8's DynamicLossScaler
built from the same fp16 block (tests/deepspeed_loss_scale/: cases.py, expected.json written
by make.py): the scale after every step of an overflow pattern, hysteresis and its
consecutive refill, the scale window, the floor, and the error at the floor."""
import pytest

from deepspeed_reference import fixture
from zero.config import load_config
from zero.loss_scaler import LossScaleUnderflowError, from_config

cases, EXPECTED = fixture("loss_scale")


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_the_scale_follows_deepspeeds(name):
    assert EXPECTED["deepspeed"] == "0.19.8"
    fp16, pattern = cases.CASES[name]
    block = load_config({"train_micro_batch_size_per_gpu": 1,
                         "fp16": {"enabled": True, **fp16}}, world_size=1).fp16
    scaler = from_config(loss_scale=block.loss_scale, initial_scale_power=block.initial_scale_power,
                         loss_scale_window=block.loss_scale_window, hysteresis=block.hysteresis,
                         consecutive_hysteresis=block.consecutive_hysteresis,
                         min_loss_scale=block.min_loss_scale)
    scales = [scaler.loss_scale]
    for overflow in pattern:
        try:
            scaler.update_scale(bool(overflow))
        except LossScaleUnderflowError:
            scales.append("raise")
            break
        scales.append(scaler.loss_scale)
    assert scales == EXPECTED[name]


def test_the_optimizers_scale_reads_and_sets_as_deepspeeds():
    """DeepSpeed's ZeRO optimizers carry the scale in use as `cur_scale` / `loss_scale`, both
    settable; engine.loss_scale() is the config's value (0: dynamic)."""
    from zero.optimizer import OptimizerSpec, ZeroOptimizer

    scaler = from_config(initial_scale_power=8)
    spec = OptimizerSpec("adam", {"lr": 1e-3}, decoupled_weight_decay=True)
    optimizer = ZeroOptimizer(spec, [], scaler)
    assert optimizer.cur_scale == optimizer.loss_scale == 256
    optimizer.loss_scale = 64
    assert scaler.loss_scale == 64 and optimizer.cur_scale == 64
    # scripts read optimizer.loss_scaler.cur_scale and optimizer.dynamic_loss_scale
    assert optimizer.loss_scaler is scaler and optimizer.dynamic_loss_scale
    without = ZeroOptimizer(spec, [])
    assert without.cur_scale == 1.0
    assert without.loss_scaler.cur_scale == 1.0 and not without.dynamic_loss_scale
    with pytest.raises(ValueError, match="without fp16"):
        without.cur_scale = 2.0
