"""`engine.tput_timer`: DeepSpeed's ThroughputTimer (deepspeed/utils/timer.py), samples per second.

The engine starts it at each forward and stops it at each step(); a step that ends the
gradient-accumulation window is a global step. From the third global step on (DeepSpeed's
`start_step`, which leaves out the first steps' warm-up) it sums the wall time between those
points, and every `steps_per_print` global steps rank 0 prints DeepSpeed's line:
`epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...,
MemAllocated=...GB, MaxMemAllocated=...GB`. Scripts call `update_epoch_count()` at the end of
each epoch (DeepSpeed-Chat does) and read `avg_samples_per_sec()`. The config's
`timers.throughput` turns it off (`enabled`) or its GPU synchronization (`synchronized`).
"""
from __future__ import annotations

import time

import torch

from ..memory import process_memory

_EPSILON = 1e-6  # DeepSpeed's TIME_EPSILON: no division by a zero-length step


class ThroughputTimer:
    """`enabled` false (the config's timers.throughput.enabled): start and stop do nothing;
    `synchronized` false: the GPU is not synchronized before the clock is read."""

    def __init__(self, batch_size: int, steps_per_output: int | None, device: torch.device,
                 report: bool, start_step: int = 2, enabled: bool = True,
                 synchronized: bool = True):
        self.enabled, self.synchronized = enabled, synchronized
        self.batch_size = batch_size
        self.steps_per_output = steps_per_output or None
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0
        self.started = False
        self.start_time = 0.0
        self._cuda = device.type == "cuda"
        self._report = report  # rank 0 prints

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        if not self.enabled:
            return
        self.started = True
        if self.global_step_count >= self.start_step:
            self._synchronize()
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time > 0:
            self._synchronize()
            duration = time.time() - self.start_time
            self.total_elapsed_time += duration
            self.step_elapsed_time += duration
            if global_step:
                if report_speed and self._report and self._at_output_step():
                    print(self._line(), flush=True)
                self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        timed_steps = self.global_step_count - self.start_step
        if self.global_step_count > 0 and timed_steps > 0:
            return self.batch_size / (self.total_elapsed_time / timed_steps)
        return float("-inf")

    def _at_output_step(self) -> bool:
        return self.steps_per_output is not None and self.global_step_count % self.steps_per_output == 0

    def _line(self) -> str:
        allocated, peak = _memory_gb()
        return (f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/"
                f"global_step={self.global_step_count}, "
                f"RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + _EPSILON)}, "
                f"MemAllocated={allocated}GB, MaxMemAllocated={peak}GB")

    def _synchronize(self) -> None:
        if self._cuda and self.synchronized:
            torch.cuda.synchronize()


def _memory_gb() -> tuple[float, float]:
    """The device's allocated bytes and their peak, in GB (on the CPU the resident set and its peak)."""
    memory = process_memory()
    allocated = memory.get("cuda_allocated_bytes", memory.get("rss_bytes", 0))
    peak = memory.get("cuda_max_allocated_bytes", memory["rss_peak_bytes"])
    return round(allocated / 1024**3, 2), round(peak / 1024**3, 2)
