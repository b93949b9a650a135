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
