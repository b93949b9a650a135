import os
import sys

# Tests import helpers (distributed_harness) from this folder and `zero` from the repo root.
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

# The files that take longest (CI seconds per file on a 2-core machine, 2026-11-30, as
# scripts/test.sh prints them: the Hugging Face and TRL jobs, the launcher's repeated jobs, the
# DeepSpeed example scripts) are collected first. Under scripts/test.sh's `-n auto --dist
# loadfile` each worker takes the next file in collection order when it is free, so a long
# file handed out last would leave the other workers idle until it ends. Within a file the
# order is unchanged.
SLOW_FIRST = ("test_hf_trainer.py", "test_trl.py", "test_reliability.py", "test_hf_accelerate.py",
              "test_deepspeed_scripts.py", "test_hf_alst.py", "test_offload.py", "test_launcher.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: place for place, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # (stable)
