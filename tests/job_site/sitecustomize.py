"""First on the PYTHONPATH of every job the tests start as a subprocess (a launcher, its ranks,
a script: distributed_harness.subprocess_env). It raises the garbage collector's first
threshold from 700 to 50,000 allocations: Python 3.11's collector spent 2.5 s of the 14 s a
rank takes to import transformers.Trainer walking the objects that import makes (2026-11-30,
a 2-core machine), and the Hugging Face jobs start about 80 such ranks. A job still collects
its garbage, only less often. Standard library only (a plain torch script must not find
zero imported); then the sitecustomize this one hides runs, as zero's own startup files do.

The modules named in ZERO_TEST_WITHOUT (comma-separated) cannot be imported, as on a machine
without them: subprocess_env names comet_ml, which CI installs for the monitor test alone (its
ranks run in the test harness's forkserver), and which transformers imports whenever it is
installed, 1.2 to 2 s of every Hugging Face rank's start."""
import gc
import os
import runpy
import sys

gc.set_threshold(50_000, *gc.get_threshold()[1:])
for _name in filter(None, os.environ.get("ZERO_TEST_WITHOUT", "").split(",")):
    sys.modules[_name] = None  # import raises ModuleNotFoundError; find_spec answers None

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
runpy.run_path(os.path.join(_REPO, "zero", "site_startup.py"))["run_hidden_sitecustomize"](_HERE)
