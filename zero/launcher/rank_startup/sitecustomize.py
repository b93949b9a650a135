"""Runs at the start of every Python process of a job that zero's launcher started (this
folder is first on the ranks' PYTHONPATH), before the user's script, importing neither zero's
package nor torch.

The first Python process of each rank (the one that finds ZERO_EXIT_GRACE=1; it sets "taken",
so the processes it starts do not) gets zero.clean_exit's exit grace even when the script
never imports zero: a plain torch.distributed script failed 6 runs in 25 here without it
(SIGABRT at exit, pytorch/pytorch#190489; see zero/clean_exit.py). zero.clean_exit is loaded
under its own name, so a later ``import zero`` finds the same module, not a second handler.
Then the sitecustomize this one hides runs (zero's `deepspeed` alias folder's, next, when on).
"""
import os
import runpy

_HERE = os.path.dirname(os.path.abspath(__file__))
_ZERO = os.path.dirname(os.path.dirname(_HERE))
_startup = runpy.run_path(os.path.join(_ZERO, "site_startup.py"))  # not the package: no torch

if os.environ.get("ZERO_EXIT_GRACE") == "1":
    os.environ["ZERO_EXIT_GRACE"] = "taken"
    _startup["load"]("zero.clean_exit", os.path.join(_ZERO, "clean_exit.py")).note_launched_rank()
_startup["run_hidden_sitecustomize"](_HERE)
