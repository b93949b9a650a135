"""Writes checkpoints/: the real DeepSpeed 0.19.8 trains cases.py's net (4 experts, top-1,
ep_size 2) on 4 ranks of its CPU accelerator (gloo) and saves it after SAVED_AT steps, then
trains MORE steps; test_moe_checkpoint.py resumes the checkpoint in zero at several layouts
and compares. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_moe/make_checkpoints.py

checkpoints/<run>/global_step2/ is DeepSpeed's save, as it wrote it: mp_rank_00_model_states.pt
(the shared weights; param_shapes: the dense group, then the "ep_size_2" group of rank 0's
local experts; num_experts), layer_0_expert_<E>_mp_rank_00_model_states.pt (each expert under
its global id) and zero_pp_rank_<r>_mp_rank_00_optim_states.pt (rank r's partition of each
group: the expert group partitioned over r's expert data-parallel group, partition_count
[4, 2]). checkpoints/<run>/expected.pt: {"deepspeed": version, "at_save": {global name:
weight}, "after": {global name: weight after MORE steps more}, "losses": {rank: [loss] *
MORE}}, the module's weights in fp32 (in an fp32 run DeepSpeed's master itself, in bf16 the
master rounded to bf16).
"""
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import TESTS, ask_deepspeed, cases_of  # noqa: E402

cases = cases_of("moe")
WORLD, EP_SIZE, SAVED_AT, MORE = 4, 2, 2, 2
# name: (stage, dtype, use_data_before_expert_parallelism); bf16 at stage 1 is DeepSpeed's
# BF16_Optimizer (bf16_zero_pp_rank_* files)
RUNS = {"stage1-fp32": (1, "fp32", False), "stage2-fp32": (2, "fp32", False),
        "stage1-bf16": (1, "bf16", False), "stage2-fp32-data-before-expert": (2, "fp32", True)}
FOLDER = os.path.join(TESTS, "deepspeed_moe", "checkpoints")


def _weights(engine, rank, data_before_expert):
    return {cases.global_name(name, rank, EP_SIZE, WORLD, data_before_expert):
            param.detach().float().clone() for name, param in engine.module.named_parameters()}


def _run(rank, world, name):
    import deepspeed
    from deepspeed.moe.layer import MoE

    stage, dtype, data_before_expert = RUNS[name]
    net = cases.build(MoE, rank, EP_SIZE, 1)  # (D + E: each expert data-parallel group's
    # first rank's experts are broadcast, whatever ids build() drew them from)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        **cases.config(stage, dtype),
        "use_data_before_expert_parallelism": data_before_expert})
    losses = []
    for step in range(SAVED_AT + MORE):
        if step == SAVED_AT:
            engine.save_checkpoint(os.path.join(FOLDER, name))
            at_save = _weights(engine, rank, data_before_expert)
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    found = {"at_save": at_save, "after": _weights(engine, rank, data_before_expert),
             "losses": losses[SAVED_AT:]}
    every = [None] * world
    torch.distributed.all_gather_object(every, found)
    return every if rank == 0 else None


def _merge(version, every) -> dict:
    """Every rank's weights in one dict (the ranks holding an expert agree: checked)."""
    merged = {"deepspeed": version, "losses": {r: f["losses"] for r, f in enumerate(every)}}
    for key in ("at_save", "after"):
        merged[key] = {}
        for found in every:
            for name, value in found[key].items():
                if name in merged[key] and not torch.equal(merged[key][name], value):
                    raise AssertionError(f"ranks disagree on {name} ({key})")
                merged[key][name] = value
    return merged


if __name__ == "__main__":
    for name in sys.argv[1:] or RUNS:
        shutil.rmtree(os.path.join(FOLDER, name), ignore_errors=True)
        version, every = ask_deepspeed(_run, WORLD, args=(name,))
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's: not needed here
            path = os.path.join(FOLDER, name, script)
            if os.path.exists(path):
                os.remove(path)
        torch.save(_merge(version, every), os.path.join(FOLDER, name, "expected.pt"))
        print(name, sorted(os.listdir(os.path.join(FOLDER, name, f"global_step{SAVED_AT}"))))
