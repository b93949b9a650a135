"""zero's learning-rate schedules against the real DeepSpeed 0.19.8's on the same configs
(tests/deepspeed_schedules/: cases.py, expected.json written by make.py with DeepSpeed's
runtime/lr_schedules.py): every group's lr, and OneCycle's momentum or betas, after
construction and after each of 40 steps, equal to rounding."""
import json
import os
import sys

import pytest

from zero.schedulers import build_scheduler

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepspeed_schedules")
sys.path.insert(0, HERE)
import cases  # noqa: E402

with open(os.path.join(HERE, "expected.json")) as _file:
    EXPECTED = json.load(_file)


def _flat(values):
    out = []
    for value in values:
        if isinstance(value, list):
            out.extend(_flat(value))
        else:
            out.append(value)
    return out


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_the_schedule_is_deepspeeds(name):
    assert EXPECTED["deepspeed"] == "0.19.8"
    kind, params, optimizer = cases.CASES[name]
    opt = cases.optimizer(optimizer)
    found = cases.run(build_scheduler(kind, dict(params), opt), opt)
    expected = EXPECTED[name]
    for step, (got, want) in enumerate(zip(found, expected)):
        assert _flat(got) == pytest.approx(_flat(want), rel=1e-12, abs=1e-15), (name, step)
    assert len(found) == len(expected)
