"""`deepspeed.runtime.utils`: see_memory_usage, move_to_device, set_random_seed."""
from __future__ import annotations

import random

from zero.monitor.memory_usage import see_memory_usage  # noqa: F401 - deepspeed.runtime.utils's


def set_random_seed(seed: int) -> None:
    """Seeds Python's, NumPy's and torch's generators with `seed`, each taken modulo what it
    accepts (NumPy 2**32, torch 2**63), as DeepSpeed's does (NumPy where it is installed)."""
    import torch

    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**63)


def move_to_device(item, device, criterion_func=None):
    """`item` with its tensors (also inside lists, tuples and dicts) on `device`, as
    DeepSpeed's: a tensor `criterion_func` accepts moves in place, any other is copied there;
    values that are not tensors come back as they are."""
    import torch

    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    if not torch.is_tensor(item):
        return item
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    return item.to(device)
