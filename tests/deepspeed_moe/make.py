"""Writes expected.pt: the real DeepSpeed 0.19.8 trains cases.py's MoE runs on 2 ranks of its
CPU accelerator (gloo), all cases in one launch (starting DeepSpeed is the slow part), and its
gating functions answer on fixed logits. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_moe/make.py

Naming cases (make.py NAME...) reruns those alone into the existing expected.pt.

expected.pt holds
  {case name: {"deepspeed": version, "losses": {rank: [float] * STEPS},
               "params": {rank: {parameter name: fp32 tensor after the last step}}}
     (or {"deepspeed": version, "failed": what DeepSpeed raised}),
   "gating": [{"fn": "top1gating" | "top2gating" | "topkgating", "kwargs": {...},
               "logits": fp32 [tokens, experts], "out": DeepSpeed's tuple}]}
where "out" is what the function returns with sparse_routes=True: (l_aux, capacity (an int64
0-d tensor), num_experts (int), indices [k, tokens] int32 (-1 for a dropped route), locations
[k, tokens] int32, gates [k, tokens] fp32, exp_counts [experts] int64 (before any drop)).
A rank's weights equal to rank 0's (every ep_size 1 run) share rank 0's tensors in the file.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import TESTS, ask_deepspeed, cases_of  # noqa: E402

cases = cases_of("moe")


def _train(deepspeed, rank, case):
    from deepspeed.moe.layer import MoE

    trained = cases.train(deepspeed, MoE, rank, case)
    trained.pop("engine").destroy()
    return trained


def _run(rank, world, names):
    import deepspeed

    mine = {}
    for case in cases.CASES:
        if case["name"] not in names:
            continue
        try:
            mine[case["name"]] = _train(deepspeed, rank, case)
        except Exception as error:  # noqa: BLE001 - recorded: zero need not do better
            mine[case["name"]] = {"failed": f"{type(error).__name__}: {error}".splitlines()[0]}
    every = [None] * world
    torch.distributed.all_gather_object(every, mine)
    return every if rank == 0 else None


def _merge(every, version):
    """Per-rank answers -> {name: {"losses": {rank: ...}, "params": {rank: ...}}}."""
    found = {}
    for name in every[0]:
        failed = [each[name]["failed"] for each in every if "failed" in each[name]]
        if failed:
            found[name] = {"deepspeed": version, "failed": failed[0]}
            continue
        losses = {rank: each[name]["losses"] for rank, each in enumerate(every)}
        params = {rank: each[name]["params"] for rank, each in enumerate(every)}
        for rank in range(1, len(every)):  # the same weights are stored once
            params[rank] = {k: params[0][k] if torch.equal(v, params[0][k]) else v
                            for k, v in params[rank].items()}
        found[name] = {"deepspeed": version, "losses": losses, "params": params}
    return found


def _gating():
    """DeepSpeed's gating functions on fixed logits, with capacities that drop tokens."""
    from deepspeed.moe.sharded_moe import top1gating, top2gating, topkgating

    functions = {"top1gating": top1gating, "top2gating": top2gating, "topkgating": topkgating}
    logits = []
    for seed, (tokens, experts, scale) in enumerate([(12, 4, 1.0), (12, 4, 3.0), (10, 8, 2.0)]):
        generator = torch.Generator().manual_seed(seed)
        logits.append(scale * torch.randn(tokens, experts, generator=generator))
    runs = []
    for factor in (1.0, 0.5):
        for min_capacity in (0, 4):
            for drop_tokens in (True, False):
                common = dict(capacity_factor=factor, min_capacity=min_capacity,
                              drop_tokens=drop_tokens, sparse_routes=True)
                runs.append(("top1gating", dict(common, use_rts=False)))
                runs.append(("top2gating", dict(common, top2_2nd_expert_sampling=False)))
                for policy in ("probs", "position") if drop_tokens else ("probs", ):
                    runs.append(("topkgating", dict(common, k=3, drop_policy=policy)))
    found = []
    for fn, kwargs in runs:
        for each in logits:
            # ep_group None: no process group (drop_tokens=False all-reduces over none)
            out = functions[fn](each.clone(), **kwargs)
            out = tuple(v.clone() if torch.is_tensor(v) else v for v in out)
            found.append({"fn": fn, "kwargs": kwargs, "logits": each, "out": out})
    return found


if __name__ == "__main__":
    import deepspeed

    start = time.time()
    path = os.path.join(TESTS, "deepspeed_moe", "expected.pt")
    names = sys.argv[1:] or [case["name"] for case in cases.CASES]
    found = torch.load(path) if sys.argv[1:] else {}
    version, every = ask_deepspeed(_run, 2, args=(names,))
    found.update(_merge(every, version))
    found["gating"] = _gating()
    torch.save(found, path)
    for name in names:
        print(name, found[name].get("failed") or
              [round(loss, 5) for loss in found[name]["losses"][0]])
    print(f"{len(found['gating'])} gating answers; {os.path.getsize(path)} bytes; "
          f"{time.time() - start:.0f}s")
