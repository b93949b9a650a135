"""Pick the configuration that fits a memory budget with the least communication.

Order of preference (least communication first, as the engine builds them):

    stage 0  (all-reduce of gradients)                       - nothing sharded
    stage 1  (all-reduce + all-gather of the updated params) - optimizer state + master sharded
    stage 2  (reduce-scatter + all-gather)                   - + gradients sharded; adds buckets

Within stage 2 the reduce bucket (= unit) size is the knob: it starts at the configured
reduce_bucket_size and halves until the buckets fit (never below the largest parameter,
which is a unit of its own anyway): bigger buckets mean fewer, larger collectives. With
overlap_comm on (two buckets) and no fit, overlap is switched off (one bucket) before the
bucket shrinks further. The micro-batch, accumulation, optimizer and everything else stay
as they are.

Only the model states and buckets are estimated (exactly, for stages 0-2); activations and
framework overhead are not, so pass --reserve (bytes kept free for them) or --headroom (a
fraction of the budget kept free). When nothing built fits, the tuner says which
not-yet-built option would ("would need stage 3 (not built yet)") and writes no config.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Optional

from .estimate import (OPTIONS, Estimate, EstimateError, ModelShapes, Setup, estimate,
                       format_bytes)


class TuneError(EstimateError):
    """The recommendation cannot be written as a valid config."""


@dataclass
class Candidate:
    estimate: Estimate
    reduce_bucket_size: int
    overlap_comm: bool
    fits: bool
    comm_bytes: int          # gradient + parameter payload per optimizer step (paper counting)
    collectives: int         # gradient + parameter collectives per optimizer step

    @property
    def stage(self) -> int:
        return self.estimate.option.stage

    @property
    def total(self) -> int:
        return self.estimate.device_bytes

    def describe(self) -> str:
        return (f"stage {self.stage}, reduce_bucket_size {self.reduce_bucket_size:,}, "
                f"overlap_comm {str(self.overlap_comm).lower()}")

    def to_dict(self) -> dict:
        return {"stage": self.stage, "reduce_bucket_size": self.reduce_bucket_size,
                "overlap_comm": self.overlap_comm, "fits": self.fits,
                "device_bytes": self.total, "comm_bytes_per_step": self.comm_bytes,
                "collectives_per_step": self.collectives,
                "categories": {k: v["bytes"] for k, v in self.estimate.categories.items()}}


@dataclass
class Recommendation:
    budget: int
    usable: int                       # budget - reserve - headroom
    host_budget: Optional[int]
    chosen: Optional[Candidate]
    tried: list[Candidate] = field(default_factory=list)
    not_built: list[Estimate] = field(default_factory=list)   # formula-only options that fit
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "budget_bytes": self.budget, "usable_bytes": self.usable,
            "host_budget_bytes": self.host_budget,
            "recommended": self.chosen.to_dict() if self.chosen else None,
            "tried": [c.to_dict() for c in self.tried],
            "would_need_not_built": [e.to_dict() for e in self.not_built],
            "notes": self.notes,
        }


def communication(stage: int, est: Estimate, param_bytes: int, gas: int) -> tuple[int, int]:
    """(payload bytes, collectives) per optimizer step per rank, counted as the engine's
    Communicator counts them (all-reduce 2x, reduce-scatter and all-gather 1x the full
    unit, even on one rank). Scalar all-reduces (norm, overflow flag) are left out."""
    psi, units = est.numel, est.unit_count
    if stage == 0:
        return 2 * psi * param_bytes, units
    if stage == 1:
        return 3 * psi * param_bytes, 2 * units
    return (gas + 1) * psi * param_bytes, (gas + 1) * units


def bucket_sizes(start: int, largest_param: int) -> list[int]:
    """start, start/2, ... while above the largest parameter, then the largest parameter."""
    sizes = [int(start)]
    while sizes[-1] // 2 >= max(1, largest_param):
        sizes.append(sizes[-1] // 2)
    if largest_param < sizes[-1]:
        sizes.append(max(1, largest_param))
    return sizes


def tune(shapes: ModelShapes, setup: Setup, budget: int, host_budget: int | None = None,
         reserve: int = 0, headroom: float = 0.0, gradient_accumulation_steps: int = 1
         ) -> Recommendation:
    """The first configuration, in order of least communication, whose estimated per-rank
    bytes fit in budget - reserve - headroom x budget."""
    if not 0.0 <= headroom < 1.0:
        raise EstimateError(f"--headroom must be in [0, 1), got {headroom}")
    usable = int(budget - reserve - headroom * budget)
    rec = Recommendation(budget=budget, usable=usable, host_budget=host_budget, chosen=None)
    if usable <= 0:
        rec.notes.append(f"reserve and headroom leave nothing of the budget "
                         f"({format_bytes(budget)})")
    seen = set()
    for stage in (0, 1, 2):
        overlap = setup.overlap_for(stage)
        overlaps = [overlap, False] if (stage == 2 and overlap) else [overlap]
        sizes = (bucket_sizes(setup.reduce_bucket_size, shapes.largest_param_numel)
                 if stage == 2 else [setup.reduce_bucket_size])
        for size in sizes:
            for ov in overlaps:
                est = estimate(shapes, setup, stage, reduce_bucket_size=size, overlap_comm=ov)
                key = (stage, ov, est.numel, est.unit_count, est.max_unit_numel,
                       est.categories["bucket"]["bytes"])
                if key in seen:
                    continue  # a smaller bucket size that changes nothing
                seen.add(key)
                comm, calls = communication(stage, est, setup.param_bytes,
                                            gradient_accumulation_steps)
                candidate = Candidate(est, size, ov, est.device_bytes <= usable, comm, calls)
                rec.tried.append(candidate)
                if candidate.fits:
                    rec.chosen = candidate
                    return rec
    # Nothing built fits: which formula-only option would?
    for option in OPTIONS:
        if option.built:
            continue
        est = estimate(shapes, setup, option)
        host_ok = host_budget is None or est.host_bytes * setup.ranks_per_node <= host_budget
        if est.device_bytes <= usable and host_ok:
            rec.not_built.append(est)
    return rec


# ---- the config it writes -------------------------------------------------------------------

_ZERO_DROP_BELOW_STAGE3 = ("offload_optimizer", "offload_param", "round_robin_gradients",
                           "sub_group_size")


def template_config(setup: Setup, micro_batch: int = 1, gradient_accumulation_steps: int = 1
                    ) -> dict:
    """A minimal complete config for when no --config was given."""
    if setup.optimizer == "adam":
        optimizer = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                 "weight_decay": 0.01}}
    else:
        optimizer = {"type": "SGD", "params": {
            "lr": 1e-2, "momentum": 0.9 if setup.optimizer == "sgd_momentum" else 0.0}}
    return {"train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "optimizer": optimizer, "zero_optimization": {}}


def recommended_config(rec: Recommendation, setup: Setup, base: dict | None = None,
                       micro_batch: int = 1, gradient_accumulation_steps: int = 1
                       ) -> tuple[dict, list[str]]:
    """(config dict, notes): `base` (or a template) with the recommended zero_optimization
    and precision; checked with zero.config.load_config before it is returned."""
    from zero.config import ConfigError, load_config

    if rec.chosen is None:
        raise TuneError("no built configuration fits the budget; nothing to write")
    chosen = rec.chosen
    config = copy.deepcopy(base) if base is not None else template_config(
        setup, micro_batch, gradient_accumulation_steps)
    notes = []
    zero_block = dict(config.get("zero_optimization") or {})
    for key in list(zero_block):
        if key.startswith("stage3_") or key in _ZERO_DROP_BELOW_STAGE3:
            notes.append(f"dropped zero_optimization.{key} (stage 3 / offload only)")
            del zero_block[key]
    zero_block.update(stage=chosen.stage, reduce_bucket_size=chosen.reduce_bucket_size,
                      overlap_comm=chosen.overlap_comm)
    if "allgather_bucket_size" in zero_block:
        zero_block["allgather_bucket_size"] = chosen.reduce_bucket_size
    config["zero_optimization"] = zero_block
    for name in ("fp16", "bf16"):
        block = dict(config.get(name) or {})
        wanted = setup.precision == name
        if bool(block.get("enabled", False)) != wanted:
            block["enabled"] = wanted
            config[name] = block
    try:
        load_config(config, world_size=setup.world_size)
    except ConfigError as error:
        raise TuneError(f"the recommended config does not validate: {error}") from None
    return config, notes


def format_recommendation(rec: Recommendation, setup: Setup) -> str:
    lines = [f"budget: {format_bytes(rec.budget)} per device"
             + (f", {format_bytes(rec.usable)} usable for model states and buckets"
                if rec.usable != rec.budget else "")
             + (f"; host budget {format_bytes(rec.host_budget)} per node"
                if rec.host_budget is not None else "")]
    lines.extend(rec.notes)
    lines.append("tried, least communication first:")
    for c in rec.tried:
        verdict = ("fits" if c.fits else
                   f"over by {format_bytes(c.total - rec.usable)}")
        lines.append(f"  {c.describe():<66} {format_bytes(c.total):>12} per device  "
                     f"comm {format_bytes(c.comm_bytes)}/step in {c.collectives} collective(s)"
                     f"  {verdict}")
    if rec.chosen is not None:
        c = rec.chosen
        lines.append(f"recommended: {c.describe()}: {format_bytes(c.total)} per device "
                     f"({format_bytes(rec.usable - c.total)} to spare), "
                     f"{format_bytes(c.total * setup.ranks_per_node)} per node")
    else:
        smallest = min(rec.tried, key=lambda c: c.total)
        lines.append(f"nothing built fits: the smallest is {smallest.describe()} at "
                     f"{format_bytes(smallest.total)} per device")
        if rec.not_built:
            for est in rec.not_built:
                lines.append(f"  would need {est.name} (not built yet: formula only): "
                             f"{format_bytes(est.device_bytes)} per device, "
                             f"{format_bytes(est.host_bytes * setup.ranks_per_node)} host RAM "
                             "per node")
        else:
            lines.append("  not even stage 3 with offload (formula only) fits: more ranks, a "
                         "bigger budget or a smaller model are needed")
    lines.append("activations, autograd temporaries and framework overhead are not included: "
                 "keep room with --reserve / --headroom")
    return "\n".join(lines)


def dump_config(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"
