"""Stage 3's gathered working set: the engine's own gather schedule replayed on the units'
sizes (csrc/adapter/gather_schedule.cpp through _C.simulate_schedule: no tensors, no process
group), and how its units are named in the text."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .training_setup import DEFAULT_MAX_INFLIGHT_GATHERS


@dataclass
class WorkingSet:
    """What the gather schedule does on a model's units (simulate_stage3_schedule)."""
    peak_numel: int               # the most elements gathered at once (the registry's peak)
    live_at_peak: tuple[int, ...]  # the units gathered at that moment
    first_peak_numel: int         # the first micro-step's peak (no recorded order yet)
    gathers: int                  # all-gathers of one micro-step once the order is recorded
    gathered_numel: int           # elements all-gathered in that micro-step
    prefetches: int               # of those, started ahead of use
    reuses: int                   # units kept gathered for a use soon after
    # the most elements whose all-gather was in flight at once (the unit being gathered
    # included): with offload_param each holds its shard piece in device staging
    peak_inflight_numel: int = 0
    inflight_at_peak: tuple[int, ...] = ()


def simulate_stage3_schedule(unit_numel: Sequence[int], prefetch_bucket_size: int,
                             max_live_parameters: int, max_reuse_distance: int,
                             max_inflight_gathers: int = DEFAULT_MAX_INFLIGHT_GATHERS,
                             externals: Iterable[tuple[int, int]] = (),
                             unit_parents: Sequence[int] = ()) -> WorkingSet:
    """The engine's own stage-3 gather schedule (csrc/adapter/gather_schedule.cpp) run on unit
    sizes (elements; unit 0 is the root, units without partitioned parameters have 0) by
    _C.simulate_schedule: two training micro-steps of a sequential model, the first recording
    the order, the second following it; `unit_parents` (UnitPlan.parents) nests a unit in the
    one enclosing it. Returns the peak and the steady micro-step's gathers."""
    from zero import _C
    from zero.boundary import typed

    options = typed(_C.ScheduleOptions, prefetch_numel=int(prefetch_bucket_size),
                    max_live_numel=int(max_live_parameters),
                    max_reuse_distance=int(max_reuse_distance),
                    max_inflight=int(max_inflight_gathers))
    run = _C.simulate_schedule([int(n) for n in unit_numel], options,
                               [(int(user), int(owner)) for user, owner in externals],
                               [int(p) for p in unit_parents])
    working = WorkingSet(peak_numel=run.peak_numel, live_at_peak=tuple(run.live_at_peak),
                         first_peak_numel=run.first_peak_numel, gathers=run.gathers,
                         gathered_numel=run.gathered_numel, prefetches=run.prefetches,
                         reuses=run.reuses, peak_inflight_numel=run.peak_inflight_numel,
                         inflight_at_peak=tuple(run.inflight_at_peak))
    return working


def short_count(number: int) -> str:
    """1000000000 -> '1e9', 50000000 -> '5e7', 13000 -> '13,000'."""
    text = f"{number:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if number >= 10_000_000 and float(text) == number else f"{number:,}"


def describe_live(units: Sequence[int], names: Sequence[str]) -> str:
    """The units gathered at once, by name ('root + h.0 + h.1'; more than 4: counted)."""
    if not units:
        return "nothing"
    parts = ["root" if u == 0 else (names[u] if u < len(names) and names[u] else f"unit {u}")
             for u in units]
    if len(parts) > 4:
        root = ["root"] if 0 in units else []
        return " + ".join(root + [f"{len(units) - len(root)} units"])
    return " + ".join(parts)
