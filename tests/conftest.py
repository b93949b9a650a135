import gc
import os
import sys

# libgomp's idle threads spin before they sleep (OMP_WAIT_POLICY unset: up to 300,000 spins
# after every parallel region). On CI's 2 cores the test process's second torch thread spun
# away 8 s of every 50 while its ranks waited for a core (2026-11-30, tests/test_stage3.py
# under -n 2). Set before torch is imported here, and inherited by every rank and job.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Collection imports every test module (torch, transformers, TRL, ...): the garbage collector's
# walks of that import are 2-3 s a process (tests/job_site/sitecustomize.py). Seldom until
# collection ends, as before from then on.
_COLLECTOR_THRESHOLDS = gc.get_threshold()
gc.set_threshold(50_000, *_COLLECTOR_THRESHOLDS[1:])

# Tests import helpers (distributed_harness) from this folder and `zero` from the repo root.
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

# The files that take longest (CI seconds per file on a 2-core machine, 2026-11-30, as
# scripts/test.sh prints them: the Hugging Face and TRL jobs, the launcher's repeated jobs, the
# DeepSpeed example scripts) are collected first. Under scripts/test.sh's `-n auto --dist
# loadfile --no-loadscope-reorder` each worker takes the next file in collection order when it
# is free, so a long file handed out last would leave the other workers idle until it ends.
# (Without --no-loadscope-reorder xdist hands out the files with the most tests first, and these
# few-test files last.)
# Within a file the order is unchanged.
SLOW_FIRST = ("test_hf_trainer.py", "test_trl.py", "test_reliability.py", "test_hf_accelerate.py",
              "test_deepspeed_scripts.py", "test_hf_alst.py", "test_offload.py", "test_launcher.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: place for place, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # (stable)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the test modules) stays for the whole
    run: out of the garbage collector's sight, its full collections walk only what tests make."""
    gc.freeze()
    gc.set_threshold(*_COLLECTOR_THRESHOLDS)


def pytest_runtest_logreport(report):
    """ZERO_TEST_FAILURES=<file>: each failure's traceback appended to it as it happens, not in
    pytest's summary at the end. A lent GPU's run is cut by its time limit before that summary
    (2026-11-29: three failures whose tracebacks never came back)."""
    path = os.environ.get("ZERO_TEST_FAILURES")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # once: the controller
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
