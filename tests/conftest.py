import os
import sys

# Tests import helpers (distributed_harness) from this folder and `zero` from the repo root.
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
