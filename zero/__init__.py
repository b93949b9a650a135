"""zero: a ZeRO / sharded-optimizer memory engine for PyTorch.

    import zero
    engine, optimizer, _, scheduler = zero.initialize(model=model, config="ds_config.json")
    loss = engine(batch); engine.backward(loss); engine.step()

`zero._C` is the compiled core (partition planner, memory accounting, collectives, the
sharded optimizer step); the Python package holds config, hooks, the launcher and reports.

Importing the package imports neither torch nor the engine: the launcher (`zero train.py`)
and the rank start-up do not need them (the launcher imports torch only to count GPUs when
neither --num_procs nor --num_gpus is given), and torch's import is seconds of a short job. The API
below is loaded on first use (PEP 562), and so is any submodule named as an attribute
(`zero.engine`), as a plain `import zero` used to load it.
"""
import importlib
import importlib.abc
import importlib.util
import sys

from . import clean_exit as _clean_exit  # noqa: F401  (first, so its exit handler runs last)

__version__ = "0.1.0"

_API = {
    "initialize": "api", "init_distributed": "api", "add_config_arguments": "api",
    "Init": "init",
    "GatheredParameters": "stage3", "gather_unit": "stage3", "set_z3_leaf_modules": "stage3",
    "register_external_parameter": "stage3", "unregister_external_parameter": "stage3",
}
__all__ = list(_API)


class _LibtorchFirst(importlib.abc.MetaPathFinder):
    """zero._C links against libtorch, which only `import torch` loads: whichever module
    imports zero._C first, torch is imported just before it."""

    def find_spec(self, name, path=None, target=None):
        if name == f"{__name__}._C":
            import torch  # noqa: F401
        return None  # the regular finders load it


sys.meta_path.insert(0, _LibtorchFirst())


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
