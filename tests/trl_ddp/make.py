"""Writes expected.json: each TRL trainer of tests/test_trl.py under plain DDP (gloo on the
CPU, zero not standing in for deepspeed), the values the test compares zero's runs with, and
the digest of what they depend on (the script, its arguments, torch / transformers / trl).
From the project root, after scripts/setup.sh:

    python tests/trl_ddp/make.py
"""
import json
import os
import sys
import tempfile

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import test_trl  # noqa: E402
from distributed_harness import run_job  # noqa: E402


def main() -> None:
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        model = os.path.join(scratch, "tiny")
        run_job([sys.executable, str(test_trl.SCRIPT), "--save_model", model], test_trl.TIMEOUT)
        for trainer, lora in test_trl.DDP_RUNS:
            out = os.path.join(scratch, f"ddp-{trainer}-{lora}")
            runs[f"{trainer}-{lora}"] = test_trl.ddp_run(out, model, trainer, lora)
            print(trainer, lora, runs[f"{trainer}-{lora}"], flush=True)
    with open(test_trl.RECORDED, "w") as file:
        json.dump({"digest": test_trl.digest(), "runs": runs}, file, indent=1, sort_keys=True)
        file.write("\n")


if __name__ == "__main__":
    main()
