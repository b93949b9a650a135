"""Writes expected.pt: the real DeepSpeed 0.19.8 trains cases.py's runs on 2 ranks of its CPU
accelerator; per run the losses and the final whole fp32 weights. From the project root,
after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_training/make.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import TESTS, cases_of  # noqa: E402
from distributed_harness import run_distributed  # noqa: E402

cases = cases_of("training")


def _rank(rank, world, name):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = cases.CASES[name]
    model = cases.make_model()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                           model_parameters=cases.parameter_groups(model))
    losses = cases.train(engine, rank, config)
    weights = engine._zero3_consolidated_16bit_state_dict() if config["zero_optimization"][
        "stage"] == 3 else engine.module.state_dict()
    if rank != 0:
        return None
    return {"deepspeed": deepspeed.__version__, "losses": losses,
            "weights": {k: v.detach().float().clone() for k, v in weights.items()}}


if __name__ == "__main__":
    found = {name: run_distributed(_rank, cases.WORLD, args=(name,), timeout=600)[0]
             for name in cases.CASES}
    torch.save(found, os.path.join(TESTS, "deepspeed_training", "expected.pt"))
    print({name: run["losses"] for name, run in found.items()})
