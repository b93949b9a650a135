"""Writes expected.json: DeepSpeed 0.19.8's own schedules (its runtime/lr_schedules.py) for
cases.py. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD build/ds-venv/bin/python tests/deepspeed_schedules/make.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import cases_of, write  # noqa: E402

cases = cases_of("schedules")

if __name__ == "__main__":
    import deepspeed
    from deepspeed.runtime import lr_schedules

    found = {"deepspeed": deepspeed.__version__}
    for name, (kind, params, optimizer) in cases.CASES.items():
        opt = cases.optimizer(optimizer)
        found[name] = cases.run(getattr(lr_schedules, kind)(opt, **params), opt)
    write("schedules", found, indent=None)
    print({name: values[-1] for name, values in found.items() if name != "deepspeed"})
