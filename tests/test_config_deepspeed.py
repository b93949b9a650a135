"""zero's resolved config against the real DeepSpeed 0.19.8's DeepSpeedConfig on the same
JSON (tests/deepspeed_configs/: cases.py, expected.json written by make.py): the batch trio
inferred at each world size, and every default and explicit value read back by its key. An
offload block DeepSpeed leaves absent (device "none") has no values to compare."""
import pytest

from deepspeed_reference import fixture
from distributed_harness import run_distributed
from zero.config import load_config, schema

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


def _read_as_make_py_did(rank, world):
    """Each case through zero's deepspeed.runtime.config.DeepSpeedConfig, in a process group,
    read back as make.py read DeepSpeed's."""
    from zero.compat.deepspeed.runtime.config import DeepSpeedConfig

    return cases.read_all(DeepSpeedConfig)


def test_deepspeeds_config_object_holds_what_the_real_one_holds():
    """`from deepspeed.runtime.config import DeepSpeedConfig` (zero/compat): the batch trio at
    the mpu's data-parallel size, DeepSpeed's attribute names (zero_config.prefetch_bucket_size,
    float16_config.loss_scale, an absent offload block as None, communication_data_type a
    torch dtype) and every value, as the real DeepSpeed 0.19.8 answered."""
    [found] = run_distributed(_read_as_make_py_did, 1)
    for name in cases.CASES:
        for key, expected in EXPECTED[name].items():
            if key not in DELIBERATE:
                assert found[name][key] == expected, (name, key)


# DeepSpeed keys zero does not know yet (each an error naming the key): what is missing
NOT_YET: dict[str, str] = {}


def _blocks() -> dict:
    return {value.path: value for value in vars(schema).values()
            if isinstance(value, schema.Block)}


def test_every_key_of_deepspeeds_config_models_has_deepspeeds_default():
    """Each field of DeepSpeed's pydantic config models (make.py wrote their defaults) is a
    key of zero's schema with the same default; a deprecated spelling is refused naming the
    new key (schema.RENAMED). This found bf16.check_grad_overflow, whose DeepSpeed default
    is true, and stage3_allgather_sequential, which zero did not know."""
    blocks = _blocks()
    for path, fields in EXPECTED["defaults"].items():
        for name, expected in fields.items():
            key = f"{path}.{name}"
            if key in DELIBERATE or key in schema.RENAMED or key in NOT_YET:
                continue
            found = blocks[path].get(name)
            assert found is not None, f"{key}: DeepSpeed's key is unknown to zero"
            if found.kind == schema.BLOCK:
                continue  # a block: its keys are compared as a block of their own
            default = list(found.default) if isinstance(found.default, tuple) else found.default
            assert default == expected, (key, default, expected)
