"""Writes expected.json: the real DeepSpeed 0.19.8's DynamicLossScaler, built from each fp16
block as its engine builds it, stepped through cases.py's overflow patterns: the scale after
each step, or "raise" where DeepSpeed raises at its minimum. From the project root, after
scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_loss_scale/make.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepspeed_reference import ask_deepspeed, cases_of, write  # noqa: E402

cases = cases_of("loss_scale")


def _answers(rank, world):
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    found = {}
    for name, (fp16, pattern) in cases.CASES.items():
        config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1,
                                  "fp16": {"enabled": True, **fp16}}).float16_config
        scaler = CreateLossScaler(torch.half, config.loss_scale, True,
                                  config.dynamic_loss_scale_args())
        scales = [scaler.cur_scale]
        for overflow in pattern:
            try:
                scaler.update_scale(bool(overflow))
            except Exception:  # noqa: BLE001 - DeepSpeed raises a bare Exception at its minimum
                scales.append("raise")
                break
            scales.append(scaler.cur_scale)
        found[name] = scales
    return found


if __name__ == "__main__":
    version, found = ask_deepspeed(_answers)
    found = {"deepspeed": version, **found}
    write("loss_scale", found, indent=None)
    print(found)
