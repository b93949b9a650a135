"""Writes expected.pt: the real DeepSpeed 0.19.8 trains cases.py's Ulysses runs on 2 ranks of
its CPU accelerator (its DistributedAttention, its parallel_state_sp or its mesh); per run
rank 0's losses, the first step's gradients and the final fp32 weights, and rank 1's final
weights. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_ulysses/make.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import TESTS, ask_deepspeed, cases_of  # noqa: E402

cases = cases_of("ulysses")


def _run(rank, world, name):
    import deepspeed

    engine, losses, grads = cases.train(deepspeed, name)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        weights = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
    every = [None] * world
    torch.distributed.all_gather_object(every, weights)
    if rank != 0:
        return None
    return {"losses": losses, "grads": grads, "weights": weights, "rank1_weights": every[1]}


if __name__ == "__main__":
    path = os.path.join(TESTS, "deepspeed_ulysses", "expected.pt")
    found = {}
    for name in cases.CASES:
        version, run = ask_deepspeed(_run, cases.SIZE, args=(name,))
        found[name] = {"deepspeed": version, **run}
    torch.save(found, path)
    print({name: found[name]["losses"] for name in found})
