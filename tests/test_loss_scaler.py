"""Loss scalers: expected scale sequences are written out by hand from
DeepSpeed's rules (halve after hysteresis is spent; grow when
``cur_iter - last_overflow_iter - 1`` is a positive multiple of the window)."""

import pytest
import torch

from zero.loss_scaler import (DynamicLossScaler, LossScaleUnderflowError, StaticLossScaler, from_config,
                              has_inf_or_nan)

O, C = True, False  # overflow / clean step


def scales(scaler, pattern):
    """Loss scale after each update in ``pattern``."""
    out = []
    for overflow in pattern:
        scaler.update_scale(overflow)
        out.append(scaler.loss_scale)
    return out


def test_defaults():
    s = DynamicLossScaler()
    assert (s.loss_scale, s.scale_factor, s.scale_window, s.min_scale, s.delayed_shift) == (2**16, 2.0, 1000, 1, 1)
    assert (s.cur_iter, s.last_overflow_iter, s.consecutive_hysteresis) == (0, -1, False)
    assert s.dynamic and s.raise_error_at_min_scale


def test_every_overflow_halves_without_hysteresis():
    s = DynamicLossScaler(init_scale=1024, delayed_shift=1)
    assert scales(s, [O, O, O]) == [512, 256, 128]
    assert (s.cur_iter, s.last_overflow_iter) == (3, 2)


def test_hysteresis_delays_the_first_drop_and_is_not_refilled_by_it():
    s = DynamicLossScaler(init_scale=1024, delayed_shift=3)
    assert scales(s, [O, O, O, O]) == [1024, 1024, 512, 256]
    assert s.cur_hysteresis == 1


def test_growth_needs_window_plus_one_clean_steps_then_window_each():
    s = DynamicLossScaler(init_scale=8, scale_window=3)
    assert scales(s, [C] * 10) == [8, 8, 8, 16, 16, 16, 32, 32, 32, 64]


def test_growth_window_restarts_after_overflow():
    s = DynamicLossScaler(init_scale=64, scale_window=2)
    # overflow at iter 1; growth when iter - 1 - 1 is a positive multiple of 2: iters 4, 6
    assert scales(s, [C, O, C, C, C, C, C]) == [64, 32, 32, 32, 64, 64, 128]
    assert s.last_overflow_iter == 1


def test_growth_refills_hysteresis():
    s = DynamicLossScaler(init_scale=64, scale_window=2, delayed_shift=2)
    assert scales(s, [O, O, C, C, C]) == [64, 32, 32, 32, 64]
    assert s.cur_hysteresis == 2
    assert scales(s, [O, O]) == [64, 32]


def test_consecutive_hysteresis_refills_on_every_clean_step():
    alternating = [O, C] * 4
    refilled = DynamicLossScaler(init_scale=64, scale_window=100, delayed_shift=2, consecutive_hysteresis=True)
    assert scales(refilled, alternating) == [64] * 8
    assert refilled.cur_hysteresis == 2
    plain = DynamicLossScaler(init_scale=64, scale_window=100, delayed_shift=2)
    assert scales(plain, alternating) == [64, 64, 32, 32, 16, 16, 8, 8]


def test_min_scale_clamps_then_raises_with_fix():
    s = DynamicLossScaler(init_scale=8, min_scale=3)
    assert scales(s, [O, O]) == [4, 3]  # 4 / 2 = 2 is clamped up to 3
    with pytest.raises(LossScaleUnderflowError, match=r"min_loss_scale=3.*Fix"):
        s.update_scale(True)


def test_min_scale_without_raise_stays_at_floor_and_keeps_counting():
    s = DynamicLossScaler(init_scale=4, min_scale=1, raise_error_at_min_scale=False)
    assert scales(s, [O, O, O, O]) == [2, 1, 1, 1]
    assert (s.cur_iter, s.last_overflow_iter) == (4, 3)


def test_state_round_trip_continues_identically():
    pattern_a = [C, O, O, C, C, C, O]
    continuation = [C, C, C, O, C, C, C, C, O, O]
    a = DynamicLossScaler(init_scale=256, scale_window=2, delayed_shift=2)
    scales(a, pattern_a)
    state = a.state_dict()
    b = DynamicLossScaler(init_scale=256, scale_window=2, delayed_shift=2)
    b.load_state_dict(state)
    assert b.state_dict() == state
    for overflow in continuation:
        a.update_scale(overflow)
        b.update_scale(overflow)
        assert b.state_dict() == a.state_dict()


def test_load_keeps_current_config_and_rejects_incomplete_state():
    a = DynamicLossScaler(init_scale=4, min_scale=4)
    b = DynamicLossScaler(init_scale=64, min_scale=1)
    b.load_state_dict(a.state_dict())
    assert (b.loss_scale, b.min_scale) == (4, 1)
    b.update_scale(True)  # new, lower floor lets training continue
    assert b.loss_scale == 2
    with pytest.raises(ValueError, match="cur_hysteresis"):
        b.load_state_dict({"cur_scale": 1, "cur_iter": 0, "last_overflow_iter": -1})


@pytest.mark.parametrize("kwargs, name", [
    ({"delayed_shift": 0}, "hysteresis"),
    ({"scale_window": 0}, "loss_scale_window"),
    ({"min_scale": 0}, "min_loss_scale"),
    ({"init_scale": 2, "min_scale": 4}, "min_loss_scale"),
    ({"scale_factor": 1.0}, "scale_factor"),
])
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DynamicLossScaler(**kwargs)


def test_static_scaler_never_changes():
    s = StaticLossScaler(128.0)
    assert not s.dynamic
    assert scales(s, [O, C, O]) == [128.0] * 3
    s.load_state_dict({"cur_scale": 4.0})
    assert s.loss_scale == 128.0
    assert s.scale_loss(torch.tensor(2.0)).item() == 256.0


def test_from_config():
    dyn = from_config()  # DeepSpeed fp16 defaults
    assert isinstance(dyn, DynamicLossScaler)
    assert (dyn.loss_scale, dyn.scale_window, dyn.delayed_shift, dyn.min_scale) == (65536, 1000, 2, 1)
    tuned = from_config(0, initial_scale_power=8, loss_scale_window=50, hysteresis=4, consecutive_hysteresis=True,
                        min_loss_scale=2)
    assert (tuned.loss_scale, tuned.scale_window, tuned.delayed_shift, tuned.min_scale,
            tuned.consecutive_hysteresis) == (256, 50, 4, 2, True)
    static = from_config(loss_scale=512)
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 512
    with pytest.raises(ValueError, match="loss_scale"):
        from_config(loss_scale=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_has_inf_or_nan(dtype):
    x = torch.ones(100, dtype=dtype)
    assert not has_inf_or_nan(x)
    for bad in (float("inf"), float("-inf"), float("nan")):
        y = x.clone()
        y[37] = bad
        assert has_inf_or_nan(y)


def test_has_inf_or_nan_edge_cases():
    big = torch.full((4,), 3e38)  # finite, but the fp32 sum overflows
    assert not has_inf_or_nan(big)
    assert has_inf_or_nan(torch.tensor([float("inf"), float("-inf")]))  # sum is NaN
    assert not has_inf_or_nan(torch.empty(0))
    assert not has_inf_or_nan(torch.arange(5))
