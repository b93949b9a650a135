"""Accelerate on a machine without a GPU, for DeepSpeed launches while zero stands in for
`deepspeed` (registered by zero/compat/as_deepspeed/sitecustomize.py).

Accelerate (1.x) brings up DeepSpeed only for an accelerator backend: on a CPU-only machine a
rank launched for DeepSpeed gets no backend, so Accelerate takes it for a single process
(world size 1, every rank training on all the data). The HF Trainer and Accelerate would
then fail the same way with DeepSpeed's own CPU accelerator. With ACCELERATE_USE_DEEPSPEED
set, LOCAL_RANK set and no CUDA device, the backend becomes gloo (MULTI_CPU, which Accelerate
then turns into DEEPSPEED), so every rank sees the real world size. Standard library only
until Accelerate itself is imported.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

def watch_for_accelerate() -> None:
    """Adapts accelerate.state when it is first imported (called by as_deepspeed's
    sitecustomize, before the script runs)."""
    if not any(isinstance(finder, _AccelerateStateWatcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AccelerateStateWatcher())


class _AccelerateStateWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "accelerate.state":
            return None
        sys.meta_path.remove(self)  # find the real module, once
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader)
        return spec


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _gloo_for_deepspeed_without_gpu(module)


def _gloo_for_deepspeed_without_gpu(state_module) -> None:
    partial = getattr(state_module, "PartialState", None)
    kinds = getattr(state_module, "DistributedType", None)
    original = getattr(partial, "_prepare_backend", None)
    if original is None or kinds is None or getattr(original, "_zero_patched", False):
        return  # another Accelerate: left as it is

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, kind = original(self, cpu, sagemaker_dp, backend)
        if (kind == kinds.NO and not cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1
                and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
                and not _cuda_available()):
            return chosen or "gloo", kinds.MULTI_CPU
        return chosen, kind

    _prepare_backend._zero_patched = True
    partial._prepare_backend = _prepare_backend


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
