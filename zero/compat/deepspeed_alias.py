"""zero as the module `deepspeed`, for scripts and libraries that import DeepSpeed by name
(the Hugging Face Trainer and Accelerate).

The `zero` launcher puts ALIAS_PATH first on the ranks' PYTHONPATH (unless
`--no_deepspeed_alias` or ZERO_DEEPSPEED_ALIAS=0). That folder holds a `deepspeed` package and a
`deepspeed-<version>.dist-info`, so both `importlib.util.find_spec("deepspeed")` and
`importlib.metadata.version("deepspeed")` see DeepSpeed's API version; nothing is written
outside zero's own installation, and outside the launcher nothing changes. Importing that
package calls `become_deepspeed`: `deepspeed` *is* zero.compat.deepspeed, and `deepspeed.X`
is the very module `zero.compat.deepspeed.X` (one module object under two names, so classes
and state are shared and `isinstance` holds across both spellings).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

ALIAS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "as_deepspeed")
ENV_SWITCH = "ZERO_DEEPSPEED_ALIAS"   # "0": the launcher leaves `deepspeed` alone
IMPLEMENTATION = "zero.compat.deepspeed"
ALIAS = "deepspeed"


class _SameModule(importlib.abc.Loader):
    """Loads `deepspeed.X` as the already imported `zero.compat.deepspeed.X` (`real`: its own
    spec)."""

    def __init__(self, real: importlib.machinery.ModuleSpec):
        self.real = real

    def create_module(self, spec):
        return importlib.import_module(self.real.name)

    def exec_module(self, module):
        # The import system stamped the alias spec on the module; the module keeps its own.
        module.__spec__ = self.real

    def get_code(self, fullname):
        """`python -m deepspeed.X` (runpy): the code of zero.compat.deepspeed.X. (A module its
        package imports is found in sys.modules under its own spec instead, whose loader
        refuses the alias name: `-m` works for modules like checkpoint.ds_to_universal that
        no package imports.)"""
        del fullname
        return self.real.loader.get_code(self.real.name)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(ALIAS + "."):
            return None
        real = importlib.util.find_spec(IMPLEMENTATION + fullname[len(ALIAS):])
        if real is None:
            return None  # a DeepSpeed module zero does not provide: the usual ImportError
        return importlib.machinery.ModuleSpec(fullname, _SameModule(real), origin=real.origin)


def become_deepspeed(alias_name: str = ALIAS) -> None:
    """Makes `deepspeed` and its submodules zero.compat.deepspeed's (called by the alias
    package's __init__)."""
    implementation = importlib.import_module(IMPLEMENTATION)
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    sys.modules[alias_name] = implementation
    for name, module in list(sys.modules.items()):
        if name.startswith(IMPLEMENTATION + "."):
            sys.modules.setdefault(ALIAS + name[len(IMPLEMENTATION):], module)


def launcher_environment(environ: dict) -> dict:
    """The variables the launcher adds for the ranks: ALIAS_PATH first on PYTHONPATH, unless
    switched off. Empty when off."""
    if environ.get(ENV_SWITCH, "1") == "0":
        return {}
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ALIAS_PATH]
    return {"PYTHONPATH": os.pathsep.join([ALIAS_PATH] + rest), ENV_SWITCH: "1"}


def real_deepspeed_origin() -> str | None:
    """Where a real DeepSpeed is installed in this environment (None when there is none)."""
    spec = importlib.util.find_spec(ALIAS) if ALIAS not in sys.modules else None
    if spec is None or spec.origin is None or spec.origin.startswith(ALIAS_PATH):
        return None
    return spec.origin


if __name__ == "__main__":
    # `PYTHONPATH=$(python -m zero.compat.deepspeed_alias):$PYTHONPATH accelerate launch ...`
    print(ALIAS_PATH)
