"""fp16 dynamic loss scaling runs tests/test_loss_scaler_deepspeed.py compares: each an fp16
config block and a sequence of steps that overflow (1) or not (0). Shared by make.py (the
real DeepSpeed's DynamicLossScaler writes expected.json) and the test (zero's scaler)."""

PATTERN = [0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
CASES = {
    "hysteresis-2": ({"initial_scale_power": 8, "loss_scale_window": 3, "hysteresis": 2},
                     PATTERN),
    "hysteresis-1": ({"initial_scale_power": 8, "loss_scale_window": 4, "hysteresis": 1},
                     PATTERN),
    "hysteresis-3-consecutive": ({"initial_scale_power": 6, "loss_scale_window": 2,
                                  "hysteresis": 3, "consecutive_hysteresis": True}, PATTERN),
    "min-scale": ({"initial_scale_power": 3, "loss_scale_window": 5, "hysteresis": 1,
                   "min_loss_scale": 2}, [1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1]),
    "underflow": ({"initial_scale_power": 2, "loss_scale_window": 5, "hysteresis": 1,
                   "min_loss_scale": 1}, [1, 1, 1, 1]),
}
