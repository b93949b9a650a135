"""Memory as the benchmarks measure it: a process's resident set (now and its peak), and the
bytes actually allocated behind a set of tensors (distinct storages, so views and tied
parameters count once)."""
from __future__ import annotations

import os
import resource

import torch

MIB = 1024 * 1024


def rss_peak() -> int:
    """ru_maxrss: the process's peak resident set so far (torch runtime, activations and every
    allocator cache included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def local(t):
    """The local tensor of a DTensor (or the tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def unique_storage_bytes(tensors) -> int:
    """Bytes of the distinct, non-empty storages behind the tensors (None skipped)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = local(t).untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def logical_bytes(tensors) -> int:
    """numel × element size of each (local) tensor, whatever storage lies behind it."""
    return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)


def optimizer_state_tensors(optimizer) -> list:
    """The tensors of a torch optimizer's state (AdamW: exp_avg, exp_avg_sq, step)."""
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
