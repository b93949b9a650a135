"""Writes expected.json: DeepSpeed 0.19.8's own schedules (its runtime/lr_schedules.py) for
cases.py. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD build/ds-venv/bin/python tests/deepspeed_schedules/make.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cases  # noqa: E402

if __name__ == "__main__":
    import deepspeed
    from deepspeed.runtime import lr_schedules

    found = {"deepspeed": deepspeed.__version__}
    for name, (kind, params, optimizer) in cases.CASES.items():
        opt = cases.optimizer(optimizer)
        found[name] = cases.run(getattr(lr_schedules, kind)(opt, **params), opt)
    with open(os.path.join(HERE, "expected.json"), "w") as out:
        json.dump(found, out, indent=None, sort_keys=True)
        out.write("\n")
    print({name: values[-1] for name, values in found.items() if name != "deepspeed"})
