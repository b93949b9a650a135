"""Writes expected.json: DeepSpeed 0.19.8's own answers to its engine getters (cases.py) on
one rank of its CPU accelerator. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_getters/make.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import ask_deepspeed, cases_of, write  # noqa: E402

cases = cases_of("getters")


def _answers(rank, world):
    import deepspeed

    return cases.answers(deepspeed.initialize)


if __name__ == "__main__":
    version, found = ask_deepspeed(_answers)
    write("getters", {"deepspeed": version, **found}, indent=1)
    print(sorted(found))
