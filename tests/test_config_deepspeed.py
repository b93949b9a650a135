"""zero's resolved config against the real DeepSpeed 0.19.8's DeepSpeedConfig on the same
JSON (tests/deepspeed_configs/: cases.py, expected.json written by make.py): the batch trio
inferred at each world size, and every default and explicit value read back by its key. An
offload block DeepSpeed leaves absent (device "none") has no values to compare."""
import pytest

from deepspeed_reference import fixture
from zero.config import load_config

cases, EXPECTED = fixture("configs")
# Where zero differs on purpose (docs/CONFIG.md says why)
DELIBERATE = {"zero_optimization.offload_param.max_in_cpu":
              "zero's own meaning and default 0 (the schema's max_in_cpu description)"}


def _read(config, key):
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_the_resolved_config_is_deepspeeds(name):
    assert EXPECTED["deepspeed"] == "0.19.8"
    raw, world = cases.CASES[name]
    config = load_config(dict(raw), world_size=world)
    for key, expected in EXPECTED[name].items():
        block = key.rsplit(".", 1)[0]
        if block.endswith(("offload_optimizer", "offload_param")) and \
                EXPECTED[name][f"{block}.device"] == "none" and not key.endswith(".device"):
            continue  # DeepSpeed keeps no block to read
        if key not in DELIBERATE:
            assert _read(config, key) == expected, (name, key)
