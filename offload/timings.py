"""Where the offloaded steps' time went, summed over an engine's groups: the C++
OffloadTimings (csrc/adapter/offloaded_state.h) of every group, and the HostCopyTimings of its
gradient reducer (csrc/adapter/grad_reducer.h: backward's copies into a host gradient shard),
as running totals since the engine was built."""
from __future__ import annotations

TIMING_FIELDS = ("grads_in_wait_s", "cpu_optimizer_s", "params_out_wait_s", "step_s")
COPY_FIELDS = ("batches", "copy_s", "wait_s")


def step_timings(core) -> dict[str, float]:
    """Seconds per OffloadTimings field over all groups of `core` (a zero._C.EngineCore); all
    zero for groups that offload nothing."""
    return _summed(core, core.group_offload_timings, TIMING_FIELDS)


def backward_copy_timings(core) -> dict[str, float]:
    """Backward's copies into host gradient shards, over all groups of `core`: batches sent
    to the copy engine, its time for them, and how long the engine thread waited for them
    (what backward did not hide). All zero where no gradient shard is in host memory."""
    return _summed(core, core.group_host_copy_timings, COPY_FIELDS)


def _summed(core, of_group, fields) -> dict[str, float]:
    totals = dict.fromkeys(fields, 0.0)
    for group in range(core.group_count):
        timing = of_group(group)
        for field in fields:
            totals[field] += getattr(timing, field)
    return totals
