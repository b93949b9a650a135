"""wall_clock_breakdown: the engine's forward / backward / step timers, DeepSpeed's names.

DeepSpeed (utils/timer.py) keeps one timer per phase: `fwd`, `bwd` (all of engine.backward),
`bwd_inner` (autograd's backward, with the gradient reductions it launches on the way),
`bwd_allreduce` (waiting for the reductions still in flight after it) and `step`. Each
accumulates over the micro-batches of one optimizer step. On a GPU a timer records CUDA
events and reads them only when asked, so timing never synchronizes the device mid-step; on
CPU it reads time.perf_counter.
"""
from __future__ import annotations

import time

import torch

FORWARD = "fwd"
BACKWARD = "bwd"
BACKWARD_INNER = "bwd_inner"
BACKWARD_REDUCE = "bwd_allreduce"
STEP = "step"
PHASES = (FORWARD, BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, STEP)


class _Timer:
    """Milliseconds between start() and stop() calls, summed until reset()."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._start = None
        self._spans: list = []  # seconds (CPU) or (start, end) event pairs (CUDA)

    def start(self) -> None:
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self._start is None:
            return  # stop without start (e.g. an exception left the phase): nothing to add
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans.append((self._start, end))
        else:
            self._spans.append(time.perf_counter() - self._start)
        self._start = None

    def elapsed_ms(self) -> float:
        if self._cuda:
            total = 0.0
            for start, end in self._spans:
                end.synchronize()
                total += start.elapsed_time(end)
            return total
        return 1000.0 * sum(self._spans)

    def reset(self) -> None:
        self._spans.clear()


class EngineTimers:
    """The five phase timers of one engine. `phase(name)` times a block; `collect()` returns
    the milliseconds of the step just finished per phase and starts the next one."""

    def __init__(self, device: torch.device):
        self._timers = {name: _Timer(device) for name in PHASES}

    def start(self, name: str) -> None:
        self._timers[name].start()

    def stop(self, name: str) -> None:
        self._timers[name].stop()

    def collect(self) -> dict[str, float]:
        out = {name: timer.elapsed_ms() for name, timer in self._timers.items()}
        for timer in self._timers.values():
            timer.reset()
        return out


def format_breakdown(milliseconds: dict[str, float]) -> str:
    """DeepSpeed's line: `time (ms) | fwd: 12.34 | bwd: ... | step: ...`."""
    return "time (ms)" + "".join(f" | {name}: {value:.2f}" for name, value in milliseconds.items())
