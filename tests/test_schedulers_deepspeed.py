"""zero's learning-rate schedules against the real DeepSpeed 0.19.8's on the same configs
(tests/deepspeed_schedules/: cases.py, expected.json written by make.py with DeepSpeed's
runtime/lr_schedules.py): every group's lr, and OneCycle's momentum or betas, after
construction and after each of 40 steps, equal to rounding."""
import pytest

from deepspeed_reference import fixture
from zero.schedulers import build_scheduler

cases, EXPECTED = fixture("schedules")


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
