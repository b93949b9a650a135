"""What the real DeepSpeed 0.19.8's AutoEP does with tests/test_auto_ep.py's tiny Mixtral and
config (expert_parallel, autoep_size 2, stage 2) on 2 ranks of its CPU accelerator: prints
(DeepSpeed's version, rank 0's answer: the first loss, or what it raised). From the project
root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_moe/autoep_under_deepspeed.py

On transformers 5.24 it raised (2026-11-29): TypeError: _CanRecordRegistry.get() takes 2
positional arguments but 3 were given (its Mixtral preset's output-recorder call).
"""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
from deepspeed_reference import ask_deepspeed  # noqa: E402


def _run(rank, world):
    import deepspeed
    import test_auto_ep as case

    model = case._model("mixtral")
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=case._config(2, 2))
        ids = case._batch(rank, 0)
        return f"loss {engine(input_ids=ids, labels=ids).loss.item()}"
    except Exception as error:  # noqa: BLE001 -- what DeepSpeed raised is the answer
        return f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    print(ask_deepspeed(_run, 2, timeout=300))
