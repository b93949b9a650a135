"""`deepspeed.runtime.utils`: see_memory_usage, move_to_device, set_random_seed."""
from __future__ import annotations

import gc
import random


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


def see_memory_usage(message, force=False) -> None:
    """With `force`, rank 0 prints `message`, the CUDA allocator's bytes (allocated and
    reserved, now and at their peak, whose peaks it then resets) and the host's used memory,
    as DeepSpeed's does. zero's own, per category: engine.memory_report()."""
    import torch
    import torch.distributed as dist

    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()
    print(message)
    gib = 2**30
    if torch.cuda.is_available():
        print(f"MA {torch.cuda.memory_allocated() / gib:.2f} GB "
              f"Max_MA {torch.cuda.max_memory_allocated() / gib:.2f} GB "
              f"CA {torch.cuda.memory_reserved() / gib:.2f} GB "
              f"Max_CA {torch.cuda.max_memory_reserved() / gib:.2f} GB")
        torch.cuda.reset_peak_memory_stats()
    total, available = _meminfo("MemTotal"), _meminfo("MemAvailable")
    print(f"CPU Virtual Memory:  used = {(total - available) / gib:.2f} GB, "
          f"percent = {100 * (total - available) / total:.1f}%")


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {field}")


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
