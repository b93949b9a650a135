"""Memory as the benchmarks measure it: a process's resident set (now and its peak), its
anonymous part (what the process allocated, without the page-cache pages of files it has
memory-mapped, which RSS and ru_maxrss count), and the bytes actually allocated behind a set of
tensors (distinct storages, so views and tied parameters count once)."""
from __future__ import annotations

import os
import resource
import threading

import torch

MIB = 1024 * 1024


def rss_peak() -> int:
    """ru_maxrss: the process's peak resident set so far (torch runtime, activations and every
    allocator cache included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def proc_status() -> dict[str, int]:
    """The byte counts of /proc/self/status (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                values[name] = int(parts[0]) * 1024
    return values


def rss_anon() -> int:
    """Anonymous resident bytes now (RssAnon): heap, tensors, malloc arenas; not the pages of
    memory-mapped files."""
    return proc_status()["RssAnon"]


def reset_peak_rss() -> bool:
    """Resets VmHWM (the kernel's peak RSS) to the current RSS (Linux 4.0+); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


class AnonPeak(threading.Thread):
    """The peak of RssAnon while a piece of code runs, sampled every `every` seconds on a
    thread (the kernel keeps no anonymous-only peak); a burst shorter than `every` can be
    missed. with AnonPeak() as peak: ...; peak.peak is the highest sample (bytes)."""

    def __init__(self, every: float = 0.002):
        super().__init__(daemon=True)
        self.every, self.peak, self.samples = every, 0, 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            self.peak = max(self.peak, rss_anon())
            self.samples += 1
            self._stop_event.wait(self.every)

    def __enter__(self):
        self.peak = rss_anon()
        self.start()
        return self

    def __exit__(self, *exc):
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, rss_anon())
        return False


class PhasePeaks:
    """Each phase's peak RSS and its RSS at the end, both over `baseline` bytes: mark(phase)
    ends a phase and resets VmHWM for the next. A phase marked again (a later step's
    "forward") keeps the latest values; highest is the peak over every phase marked."""

    def __init__(self, baseline: int):
        self.baseline, self.highest = baseline, 0
        self.phases: dict[str, dict[str, int]] = {}
        reset_peak_rss()

    def mark(self, phase: str) -> None:
        status = proc_status()
        self.phases[phase] = {"peak": status["VmHWM"] - self.baseline,
                              "end": status["VmRSS"] - self.baseline}
        self.highest = max(self.highest, self.phases[phase]["peak"])
        reset_peak_rss()


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
