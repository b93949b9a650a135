"""Where the offloaded steps' time went, summed over an engine's groups: the C++
OffloadTimings (csrc/adapter/offloaded_state.h) of every group, as running totals since the
engine was built."""
from __future__ import annotations

TIMING_FIELDS = ("grads_in_wait_s", "cpu_optimizer_s", "params_out_wait_s", "step_s")


def step_timings(core) -> dict[str, float]:
    """Seconds per OffloadTimings field over all groups of `core` (a zero._C.EngineCore); all
    zero for groups that offload nothing."""
    totals = dict.fromkeys(TIMING_FIELDS, 0.0)
    for group in range(core.group_count):
        timing = core.group_offload_timings(group)
        for field in TIMING_FIELDS:
            totals[field] += getattr(timing, field)
    return totals
