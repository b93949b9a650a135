"""`import deepspeed` under the `zero` launcher: this package is zero's (zero/compat/as_deepspeed/
is put on the ranks' PYTHONPATH; `zero --no_deepspeed_alias` leaves it off). It replaces itself
with zero.compat.deepspeed and routes every `deepspeed.X` submodule to `zero.compat.deepspeed.X`,
so `import deepspeed`, `from deepspeed.runtime.zero import ...` and
`importlib.metadata.version("deepspeed")` (the dist-info beside this folder) all answer with zero.
"""
from zero.compat.deepspeed_alias import become_deepspeed

become_deepspeed(__name__)
