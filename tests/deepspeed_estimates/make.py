"""Writes expected.json: what DeepSpeed 0.19.8's own memory estimate functions print for
cases.py's calls (no process group needed). From the project root, after
scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_estimates/make.py
"""
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import cases_of, write  # noqa: E402

if __name__ == "__main__":
    import deepspeed

    cases = cases_of("estimates")
    modules = {key: importlib.import_module(name) for key, name in cases.MODULES.items()}
    found = {case[1] + repr(case[2:]): cases.printed(modules, case) for case in cases.CASES}
    write("estimates", {"deepspeed": deepspeed.__version__, "printed": found})
    print("\n".join(line for lines in found.values() for line in lines))
