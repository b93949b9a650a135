"""Writes expected.json: DeepSpeed 0.19.8's own answers to its engine getters (cases.py) on
one rank of its CPU accelerator. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_getters/make.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import cases_of, write  # noqa: E402
from distributed_harness import run_distributed  # noqa: E402

cases = cases_of("getters")


def _rank(rank, world):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    found = {"deepspeed": deepspeed.__version__}
    for name, case in cases.CASES.items():
        model = cases.make_model()
        engine, _, _, _ = deepspeed.initialize(
            model=model, config=case["config"], model_parameters=model.parameters(),
            optimizer=cases.client_optimizer(case["client_optimizer"], model))
        found[name] = cases.run(engine, case["micro_steps"])
        engine.destroy()
    return found


if __name__ == "__main__":
    [found] = run_distributed(_rank, 1, timeout=600)
    write("getters", found, indent=1)
    print(sorted(found))
