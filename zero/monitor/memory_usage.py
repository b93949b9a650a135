"""DeepSpeed's see_memory_usage: one line of the device allocator's bytes and one of the host's
used memory, printed by rank 0 (memory_breakdown prints it around each phase; a script calls
it as deepspeed.runtime.utils.see_memory_usage). zero's own, per category: memory_report."""
from __future__ import annotations

import gc


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
