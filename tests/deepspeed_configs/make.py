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


class _DataParallel:
    def __init__(self, world):
        self.world = world

    def get_data_parallel_world_size(self):
        return self.world


def _answers(rank, world):
    from deepspeed.runtime.config import DeepSpeedConfig

    found = {}
    for name, (config, data_parallel) in cases.CASES.items():
        resolved = DeepSpeedConfig(dict(config), mpu=_DataParallel(data_parallel))
        values = {}
        for key, read in cases.DEEPSPEED.items():
            value = read(resolved)
            values[key] = getattr(value, "value", value) if value is not None else None
        found[name] = values
    return found


if __name__ == "__main__":
    version, found = ask_deepspeed(_answers)
    write("configs", {"deepspeed": version, **found}, indent=1)
    print(found["stage3"])
