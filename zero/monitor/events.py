"""The scalars an engine writes to its monitors, as (name, value, samples) events.

DeepSpeed's names where DeepSpeed has the scalar (runtime/engine.py: `Train/Samples/lr`,
`Train/Samples/loss_scale`, `Train/Samples/elapsed_time_ms_*`; `Train/Samples/train_loss`
as DeepSpeed wrote it before 0.18 and its pipeline engine still does), zero's own beside
them: `Memory/rank<r>/...` bytes per rank and `Comm/...` payload bytes per step.
"""
from __future__ import annotations

from typing import Mapping

from ..memory import CATEGORY_ORDER, LOCATIONS, process_memory
from . import timers

TRAIN_LOSS = "Train/Samples/train_loss"
LR = "Train/Samples/lr"
LOSS_SCALE = "Train/Samples/loss_scale"
ELAPSED = {  # timer -> DeepSpeed's scalar
    timers.FORWARD: "Train/Samples/elapsed_time_ms_forward",
    timers.BACKWARD: "Train/Samples/elapsed_time_ms_backward",
    timers.BACKWARD_INNER: "Train/Samples/elapsed_time_ms_backward_inner",
    timers.BACKWARD_REDUCE: "Train/Samples/elapsed_time_ms_backward_allreduce",
    timers.STEP: "Train/Samples/elapsed_time_ms_step",
}
COMM_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def training_events(samples: int, lr: float, loss: float | None,
                    loss_scale: float | None) -> list:
    events = [(LR, lr, samples)]
    if loss is not None:
        events.append((TRAIN_LOSS, loss, samples))
    if loss_scale is not None:
        events.append((LOSS_SCALE, loss_scale, samples))
    return events


def timer_events(samples: int, milliseconds: Mapping[str, float]) -> list:
    return [(ELAPSED[name], value, samples) for name, value in milliseconds.items()]


def comm_events(samples: int, before, after) -> list:
    """Payload bytes of the step just made, per kind and in all (the ZeRO paper's counting);
    before and after are _C.CommStats."""
    events = [(f"Comm/{kind}_bytes", getattr(after, f"{kind}_bytes") -
               getattr(before, f"{kind}_bytes"), samples) for kind in COMM_KINDS]
    events.append(("Comm/total_bytes", after.total_bytes - before.total_bytes, samples))
    return events


def memory_scalars(registry, activation_bytes: int | None) -> list[float]:
    """This rank's memory as a flat list in the order of memory_names(): current bytes per
    category, current and peak bytes per location, the process's resident set, the
    activations the last forward kept for backward."""
    values = [float(registry.category_usage(name).current) for name in CATEGORY_ORDER]
    for location in LOCATIONS:
        usage = registry.location_usage(location)
        values += [float(usage.current), float(usage.peak)]
    values.append(float(process_memory().get("rss_bytes", 0)))
    values.append(float(activation_bytes or 0))
    return values


def memory_names() -> list[str]:
    names = [f"category/{name}" for name in CATEGORY_ORDER]
    for location in LOCATIONS:
        names += [f"location/{location}", f"location/{location}_peak"]
    return names + ["process/rss", "activations"]


def memory_events(samples: int, per_rank: list[list[float]]) -> list:
    names = memory_names()
    return [(f"Memory/rank{rank}/{name}_bytes", value, samples)
            for rank, values in enumerate(per_rank) for name, value in zip(names, values)]
