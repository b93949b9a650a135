"""What zero's sitecustomize files share (zero/launcher/rank_startup/ and
zero/compat/as_deepspeed/, folders a launched rank gets on its PYTHONPATH). Standard library
only: they load this file by path, before the user's script, without importing zero or torch.
"""
import importlib.machinery
import importlib.util
import os
import sys


def load(name: str, path: str):
    """The module at ``path`` under ``name`` (the one already in sys.modules, if any)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_hidden_sitecustomize(own_dir: str) -> None:
    """Runs the sitecustomize that the one in ``own_dir`` hides: the next one on sys.path after
    ``own_dir`` (entries before it, zero's other startup folder included, have run already)."""
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    own = os.path.abspath(own_dir)
    after = sys.path[entries.index(own) + 1:] if own in entries else sys.path
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
