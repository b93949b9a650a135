"""Writes expected.json: the real DeepSpeed 0.19.8's DeepSpeedConfig on cases.py, each at its
data-parallel world size (a stand-in mpu says it). From the project root, after
scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_configs/make.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import ask_deepspeed, cases_of, write  # noqa: E402

cases = cases_of("configs")


def _answers(rank, world):
    from deepspeed.runtime.config import DeepSpeedConfig

    return cases.read_all(DeepSpeedConfig)


def _json(value):
    value = getattr(value, "value", value)  # an enum: its JSON spelling
    if isinstance(value, (list, tuple)):
        return [_json(item) for item in value]
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def _defaults():
    """{block path: {JSON key: DeepSpeed's default}} of DeepSpeed's pydantic config models
    (cases.MODELS), each field under the name a config spells it with (its alias)."""
    import importlib

    from pydantic_core import PydanticUndefined

    found = {}
    for block, (module, name) in cases.MODELS.items():
        model = getattr(importlib.import_module(module), name)
        fields = {}
        for field_name, field in model.model_fields.items():
            default = field.default_factory() if field.default_factory else field.default
            if default is not PydanticUndefined:
                fields[field.alias or field_name] = _json(default)
        found[block] = fields
    return found


if __name__ == "__main__":
    version, found = ask_deepspeed(_answers)
    write("configs", {"deepspeed": version, **found, "defaults": _defaults()}, indent=1)
    print(found["stage3"])
