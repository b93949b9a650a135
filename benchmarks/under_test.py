"""Which zero the CPU benchmarks measure: this checkout, or another tree with a built zero/
(ZERO_ROOT), e.g. a snapshot of a commit while the checkout is being edited.

Importing this module puts ZERO_ROOT first on sys.path, so `import zero` finds the engine under
test; ranks started from the benchmark (spawn, forkserver) inherit that path."""
from __future__ import annotations

import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZERO_ROOT = os.path.abspath(os.environ.get("ZERO_ROOT", ROOT))
if ZERO_ROOT in sys.path:
    sys.path.remove(ZERO_ROOT)
sys.path.insert(0, ZERO_ROOT)


def command_line(name_commit: bool = True) -> str:
    """The command that started this run, as the report quotes it: relative to the checkout,
    prefixed with ZERO_ROOT (and ZERO_COMMIT, when name_commit) where they are set."""
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    if name_commit and os.environ.get("ZERO_COMMIT"):
        command = f"ZERO_COMMIT={shlex.quote(os.environ['ZERO_COMMIT'])} " + command
    if ZERO_ROOT != ROOT:
        command = f"ZERO_ROOT={shlex.quote(ZERO_ROOT)} " + command
    return command
