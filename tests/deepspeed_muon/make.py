"""Writes expected.pt: DeepSpeed 0.19.8's muon_update (its CPU accelerator: "gram" iterates
in fp32 here, where oneDNN has no fp16; "standard" in bf16; and "gram-fp16", gram with its
iteration dtype set to fp16, as it runs on a GPU) on random wide, tall, square and batched
matrices, with a momentum of 0.95: per (shape, method) the gradient, the momentum before, the
update and the momentum after. tests/test_muon.py holds the engine's update to
it. From the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_muon/make.py
"""
import os

# muon_update is wrapped for torch.compile, which this CPU build cannot lower here; eager is
# the same arithmetic
os.environ["TORCHDYNAMO_DISABLE"] = "1"

import torch  # noqa: E402

from deepspeed.runtime.zero.muon import original_muon  # noqa: E402

SHAPES = [(8, 20), (20, 8), (12, 12), (3, 8, 20)]

if __name__ == "__main__":
    torch.manual_seed(0)
    found = {}
    for shape in SHAPES:
        for method in ("gram", "standard", "gram-fp16"):
            grad, momentum = torch.randn(shape), torch.randn(shape)
            after = momentum.clone()
            dtype = original_muon.ns_compute_dtype
            if method == "gram-fp16":  # as a GPU's accelerator answers
                original_muon.ns_compute_dtype = lambda _: torch.float16
            update = original_muon.muon_update(grad.clone(), after, beta=0.95,
                                               ns_method=method.split("-")[0])
            original_muon.ns_compute_dtype = dtype
            found[(shape, method)] = (grad, momentum, update, after)
    torch.save(found, os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected.pt"))
    print(sorted(found))
