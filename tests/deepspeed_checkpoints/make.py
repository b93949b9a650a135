"""Writes the DeepSpeed checkpoints in this folder with the real DeepSpeed 0.19.8 (its CPU
accelerator, gloo), and beside each the run's continuation as DeepSpeed trains it: the losses
of the 2 steps after the save and DeepSpeed's own zero_to_fp32 of the weights at the save and
after those steps (expected.pt). From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python \
        tests/deepspeed_checkpoints/make.py [RUN ...]   # ds_checkpoint_run.RUNS named, else all
"""
import os
import shutil
import sys
import tempfile

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import ds_checkpoint_run as run  # noqa: E402
from distributed_harness import run_distributed  # noqa: E402


def _rank(rank, world, name, scratch):
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    deepspeed.init_distributed(dist_backend="gloo")
    model = run.make_model(run.RUNS[name])
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=run.config(run.RUNS[name], deepspeed=True),
        model_parameters=[p for p in model.parameters() if p.requires_grad])
    run.train(engine, rank, world, 0, run.SAVED_AT)
    saved = os.path.join(run.FIXTURES, name)
    engine.save_checkpoint(saved, client_state=dict(run.CLIENT_STATE))
    losses = run.train(engine, rank, world, run.SAVED_AT, run.MORE)
    after = os.path.join(scratch, name)
    engine.save_checkpoint(after)
    torch.distributed.barrier()
    if rank != 0:
        return None
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's: not needed here
        os.remove(os.path.join(saved, script))

    def fp32(path):  # each tensor on its own (DeepSpeed's are views of one flat buffer)
        return {k: v.clone() for k, v in get_fp32_state_dict_from_zero_checkpoint(path).items()}

    return {"deepspeed": deepspeed.__version__, "losses": losses,
            "buffers": {"seen_steps": engine.module.seen_steps.clone()},
            "fp32_at_save": fp32(saved), "fp32_after": fp32(after)}


def main(names: list[str]):
    for name in names or run.RUNS:
        shutil.rmtree(os.path.join(run.FIXTURES, name), ignore_errors=True)
        with tempfile.TemporaryDirectory() as scratch:
            expected = run_distributed(_rank, run.WORLD, args=(name, scratch),
                                       timeout=300, env={"DS_ACCELERATOR": "cpu"})[0]
        torch.save(expected, os.path.join(run.FIXTURES, name, "expected.pt"))
        print(f"{name}: DeepSpeed {expected['deepspeed']}, losses after the save "
              f"{expected['losses']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])  # the runs named, else all
