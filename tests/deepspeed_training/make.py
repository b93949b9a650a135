"""Writes expected.pt: the real DeepSpeed 0.19.8 trains cases.py's runs on 2 ranks of its CPU
accelerator; per run the losses and the final whole fp32 weights, or where DeepSpeed fails
what it raised. From the project root,
after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_training/make.py

Naming cases (make.py NAME...) reruns those alone into the existing expected.pt.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import TESTS, ask_deepspeed, cases_of  # noqa: E402

cases = cases_of("training")


def _run(rank, world, name):
    import deepspeed

    engine, losses = cases.train_case(deepspeed.initialize, rank, name)
    weights = engine._zero3_consolidated_16bit_state_dict() \
        if cases.CASES[name]["zero_optimization"]["stage"] == 3 else engine.module.state_dict()
    if rank != 0:
        return None
    return {"losses": losses, "weights": {k: v.detach().float().clone() for k, v in weights.items()}}


def _failure(error: Exception) -> str:
    """The last line of a rank's traceback: what DeepSpeed raised."""
    return str(error).strip().splitlines()[-1]


if __name__ == "__main__":
    import deepspeed

    path = os.path.join(TESTS, "deepspeed_training", "expected.pt")
    names = sys.argv[1:] or list(cases.CASES)
    found = torch.load(path) if sys.argv[1:] else {}
    for name in names:
        try:
            version, run = ask_deepspeed(_run, cases.WORLD, args=(name,))
        except Exception as error:  # noqa: BLE001 - recorded: zero must not fail there
            version, run = deepspeed.__version__, {"failed": _failure(error)}
        found[name] = {"deepspeed": version, **run}
    torch.save(found, path)
    print({name: found[name].get("losses", found[name].get("failed")) for name in names})
