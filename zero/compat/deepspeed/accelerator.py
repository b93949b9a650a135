"""`deepspeed.accelerator.get_accelerator()`: the calls DeepSpeed scripts make on it, answered
for the device zero trains on (a CUDA GPU when torch sees one, else the CPU).

On a GPU every call is torch.cuda's. On the CPU the answers are those of DeepSpeed's own CPU
accelerator: one device named "cpu", no streams or events (None, and a no-op context), and the
memory calls report the process's resident set, the peak being the largest one these calls
have seen since the last reset (the kernel's own peak is left alone: zero's reports read it)."""
from __future__ import annotations

import contextlib
import functools
import os

import torch

from zero import rng_tracker
from zero.memory import process_memory


def _resident_bytes() -> int:
    """This process's resident set (zero's memory report reads it the same way)."""
    return process_memory().get("rss_bytes", 0)


class Accelerator:
    """The device of this process: cuda:LOCAL_RANK on a GPU machine, else cpu."""

    def __init__(self):
        self._cuda = torch.cuda.is_available()
        self._name = "cuda" if self._cuda else "cpu"  # DeepSpeed's attribute; scripts read it
        self._peak_rss = 0  # the CPU's: the largest resident set seen by the memory calls

    # ---- the device

    def device_name(self, device_index: int | None = None) -> str:
        if not self._cuda:
            return "cpu"
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index: int | None = None):
        return torch.cuda.device(device_index) if self._cuda else None

    def set_device(self, device_index: int) -> None:
        if self._cuda:
            torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._cuda else int(os.environ.get("LOCAL_RANK", "0"))

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._cuda else 1

    def is_available(self) -> bool:
        return True

    def is_synchronized_device(self) -> bool:
        return not self._cuda

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def communication_backend_name(self) -> str:
        return "nccl" if self._cuda else "gloo"

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list:
        dtypes = [torch.float32, torch.float16]
        return dtypes + [torch.bfloat16] if self.is_bf16_supported() else dtypes

    def is_triton_supported(self) -> bool:
        return False

    # ---- synchronisation, streams and events (none on the CPU)

    def synchronize(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.synchronize(device_index)

    @property
    def Stream(self):
        return torch.cuda.Stream if self._cuda else None

    def stream(self, stream):
        return torch.cuda.stream(stream) if self._cuda else contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None):
        return torch.cuda.current_stream(device_index) if self._cuda else None

    def default_stream(self, device_index: int | None = None):
        return torch.cuda.default_stream(device_index) if self._cuda else None

    @property
    def Event(self):
        return torch.cuda.Event if self._cuda else None

    def range_push(self, msg: str, domain=None, category=None) -> None:
        if self._cuda:
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None) -> None:
        if self._cuda:
            torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return callback()

    # ---- random numbers

    def random(self):
        return torch.random

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds every CUDA device too

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return rng_tracker.get_rng_state(device_index)

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        rng_tracker.set_rng_state(new_state, device_index)

    # ---- memory (the CPU's: this process's resident set, as DeepSpeed's CPU accelerator)

    def empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()

    def _rss(self) -> int:
        rss = _resident_bytes()
        self._peak_rss = max(self._peak_rss, rss)
        return rss

    def _max_rss(self) -> int:
        self._rss()
        return self._peak_rss

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._cuda else self._rss()

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._cuda else self._max_rss()

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index) if self._cuda else self._rss()

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_reserved(device_index) if self._cuda else self._max_rss()

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)
        else:
            self._peak_rss = _resident_bytes()

    reset_max_memory_allocated = reset_peak_memory_stats
    reset_max_memory_cached = reset_peak_memory_stats

    def memory_stats(self, device_index: int | None = None) -> dict:
        if self._cuda:
            return torch.cuda.memory_stats(device_index)
        rss, peak = self._rss(), self._peak_rss
        return {"allocated_bytes.all.current": rss, "allocated_bytes.all.peak": peak,
                "reserved_bytes.all.current": rss, "reserved_bytes.all.peak": peak}

    def total_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            index = torch.cuda.current_device() if device_index is None else device_index
            return torch.cuda.get_device_properties(index).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            return torch.cuda.mem_get_info(device_index)[0]
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._cuda else tensor


@functools.cache
def get_accelerator() -> Accelerator:
    """This process's accelerator (one object, as DeepSpeed's)."""
    return Accelerator()
