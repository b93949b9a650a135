"""Pick the configuration that fits a memory budget with the least communication.

Order of preference (least communication first, as the engine builds them):

    stage 0  (all-reduce of gradients)                       - nothing sharded
    stage 1  (all-reduce + all-gather of the updated params) - optimizer state + master sharded
    stage 2  (reduce-scatter + all-gather)                   - + gradients sharded; adds buckets
    stage 3  (all-gathers in forward and backward,           - + parameters sharded; adds the
              reduce-scatter every micro-step)                 gathered working set

Within stage 2 the reduce bucket (= unit) size is the knob: it starts at the configured
reduce_bucket_size and halves until the buckets fit (never below the largest parameter,
which is a unit of its own anyway): bigger buckets mean fewer, larger collectives. With
overlap_comm on (two buckets) and no fit, overlap is switched off (one bucket) before the
bucket shrinks further. The micro-batch, accumulation, optimizer and everything else stay
as they are.

Within stage 3 (needs the model's gather units, i.e. --model or --hf-config, or --params
with assumed units) the knobs are overlap_comm (two buckets or one) and
stage3_max_live_parameters: the configured settings are tried first; when the working set
does not fit, the live bound is set to what the budget leaves after model states and
buckets (the engine then evicts units kept for reuse and prefetches less, so it gathers
more: the replayed schedule counts the all-gathers). Among the stage-3 settings that fit
and run (the units in use must fit under the bound) the least communication wins, then
overlap on. Prefetch and reuse distance stay as configured.

Only the model states, buckets and stage 3's gathered working set are estimated (exactly,
checked against the engine); activations and framework overhead are not, so pass --reserve
(bytes kept free for them) or --headroom (a fraction of the budget kept free). When nothing
built fits, the tuner says which not-yet-built option (offload) would and writes no config.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Optional

from .estimate import (DEFAULT_MAX_INFLIGHT_GATHERS, OPTIONS, Estimate, EstimateError,
                       ModelShapes, Setup, estimate, format_bytes)


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

    @property
    def stage3(self) -> Optional[dict]:
        """The stage3_* config values of a stage-3 candidate."""
        return self.estimate.setup.stage3_dict() if self.stage == 3 else None

    def describe(self) -> str:
        text = (f"stage {self.stage}, reduce_bucket_size {self.reduce_bucket_size:,}, "
                f"overlap_comm {str(self.overlap_comm).lower()}")
        if self.stage == 3:
            setup = self.estimate.setup
            text += (f", max_live {setup.max_live_parameters:,}, prefetch "
                     f"{setup.prefetch_bucket_size:,}, reuse {setup.max_reuse_distance:,}")
        return text

    def to_dict(self) -> dict:
        return {"stage": self.stage, "reduce_bucket_size": self.reduce_bucket_size,
                "overlap_comm": self.overlap_comm, "fits": self.fits,
                "device_bytes": self.total, "comm_bytes_per_step": self.comm_bytes,
                "collectives_per_step": self.collectives, "stage3": self.stage3,
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
    unit, even on one rank). Scalar all-reduces (norm, overflow flag) and stage 3's control
    exchanges are left out. Stage 3: every micro-step all-gathers what the replayed
    schedule gathers (once the order is recorded) and reduce-scatters every unit; at the
    boundary the persistent group all-reduces and all-gathers (3bΨp)."""
    psi, units = est.numel, est.unit_count
    if stage == 3 and est.stage3 is not None:
        work = est.stage3["working_set"]
        persistent_units = est.stage3["persistent_units"]
        payload = gas * (work["gathered_numel_per_micro_step"] + psi) * param_bytes
        payload += 3 * est.persistent_numel * param_bytes
        reduce_scatters = sum(group["unit_count"] for group in est.groups)  # per group
        return payload, gas * (work["gathers_per_micro_step"] + reduce_scatters) + \
            2 * persistent_units
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
    if shapes.has_units:
        fitting = []
        for est in stage3_estimates(shapes, setup, usable):
            comm, calls = communication(3, est, setup.param_bytes, gradient_accumulation_steps)
            overlap = est.stage3["overlap_comm"]
            candidate = Candidate(est, setup.reduce_bucket_size, overlap,
                                  est.device_bytes <= usable and est.runs, comm, calls)
            rec.tried.append(candidate)
            if candidate.fits:
                fitting.append(candidate)
        if fitting:  # least communication, then overlap on
            rec.chosen = min(fitting, key=lambda c: (c.comm_bytes, not c.overlap_comm))
            note = first_boundary_note(rec.chosen.estimate, gradient_accumulation_steps)
            if note:
                rec.notes.append(note)
            return rec
    # Nothing built fits: which formula-only option would?
    for option in OPTIONS:
        if option.built and (option.stage < 3 or shapes.has_units):
            continue
        est = estimate(shapes, setup, option)
        host_ok = host_budget is None or est.host_bytes * setup.ranks_per_node <= host_budget
        if est.device_bytes <= usable and host_ok:
            rec.not_built.append(est)
    return rec


def first_boundary_note(est: Estimate, gas: int) -> str:
    """Stage 3 with persistent parameters and one micro-step per step: the engine launches
    its first backward's reduce-scatters in a default order that puts the persistent group
    first, so until that group's unit completes (in the first block's backward) every block
    holds its bucket; the pool then grows to one bucket per block, for that one backward.
    The estimate (and so the recommendation) is the steady state; this says what the first
    step may add."""
    if gas != 1 or not est.persistent_numel or not est.stage3:
        return ""
    extra = 0
    for group in est.groups:
        size = group["max_unit_numel"] + group["max_unit_numel"] // est.setup.world_size
        blocks = group["block_units"]  # the root completes last
        extra += max(0, blocks - group["buckets_peak"]) * size * est.setup.param_bytes
    if not extra:
        return ""
    return (f"note: with gradient_accumulation_steps = 1 the engine's first backward can hold "
            f"one reduce-scatter bucket per block until its launch order is learned (the "
            f"persistent group is launched first by default): up to {format_bytes(extra)} more "
            "than the estimate in the first step; accumulate over 2+ micro-steps or keep that "
            "much in --reserve")


def stage3_estimates(shapes: ModelShapes, setup: Setup, usable: int) -> list[Estimate]:
    """The stage-3 settings worth trying: the configured ones with overlap_comm as set (then
    off: one bucket); for each whose working set does not fit (or cannot run), the same
    with stage3_max_live_parameters set to the elements the budget leaves after model states
    and buckets."""
    overlap = setup.overlap_for(3)
    out = []
    for ov in ([True, False] if overlap else [False]):
        base = dataclasses.replace(setup, overlap_comm=ov)
        est = estimate(shapes, base, 3)
        out.append(est)
        if est.device_bytes <= usable and est.runs:
            continue
        fixed = est.device_bytes - est.categories["gathered_param"]["bytes"]
        room = (usable - fixed) // setup.param_bytes
        if room > 0 and room != setup.max_live_parameters:
            out.append(estimate(shapes, dataclasses.replace(base, max_live_parameters=room), 3))
    return out


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
    not_built = _not_built_zero_keys()
    for key in list(zero_block):
        if chosen.stage < 3 and (key.startswith("stage3_") or key in _ZERO_DROP_BELOW_STAGE3):
            notes.append(f"dropped zero_optimization.{key} (stage 3 / offload only)")
            del zero_block[key]
        elif chosen.stage == 3 and (key in not_built or key.startswith("offload_")):
            notes.append(f"dropped zero_optimization.{key} (the recommendation is estimated "
                         "without it)")
            del zero_block[key]
    zero_block.update(stage=chosen.stage, reduce_bucket_size=chosen.reduce_bucket_size,
                      overlap_comm=chosen.overlap_comm)
    if chosen.stage == 3:
        values = dict(chosen.stage3)
        if "stage3_max_inflight_gathers" not in zero_block and \
                values["stage3_max_inflight_gathers"] == DEFAULT_MAX_INFLIGHT_GATHERS:
            del values["stage3_max_inflight_gathers"]  # zero's own key: only when it matters
        zero_block.update(values)
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


def _not_built_zero_keys() -> set[str]:
    """zero_optimization keys whose feature is not built (offload, stage-3 fetch tuning)."""
    from zero.config import BUILT_FEATURES
    from zero.config.schema import ZERO_OPTIMIZATION

    return {key.name for key in ZERO_OPTIMIZATION.keys
            if key.feature is not None and key.feature not in BUILT_FEATURES}


def format_recommendation(rec: Recommendation, setup: Setup) -> str:
    lines = [f"budget: {format_bytes(rec.budget)} per device"
             + (f", {format_bytes(rec.usable)} usable for model states, buckets and the "
                "stage-3 working set"
                if rec.usable != rec.budget else "")
             + (f"; host budget {format_bytes(rec.host_budget)} per node"
                if rec.host_budget is not None else "")]
    lines.extend(rec.notes)
    lines.append("tried, least communication first:")
    width = max((len(c.describe()) for c in rec.tried), default=0)
    for c in rec.tried:
        verdict = ("fits" if c.fits else
                   "does not run: " + c.estimate.stage3["error"] if not c.estimate.runs else
                   f"over by {format_bytes(c.total - rec.usable)}")
        lines.append(f"  {c.describe():<{width}} {format_bytes(c.total):>12} per device  "
                     f"comm {format_bytes(c.comm_bytes)}/step in {c.collectives} collective(s)"
                     f"  {verdict}")
    if rec.chosen is not None:
        c = rec.chosen
        lines.append(f"recommended: {c.describe()}: {format_bytes(c.total)} per device "
                     f"({format_bytes(rec.usable - c.total)} to spare), "
                     f"{format_bytes(c.total * setup.ranks_per_node)} per node")
        if c.stage == 3:
            work = c.estimate.stage3["working_set"]
            lines.append(f"  stage 3 working set: {work['peak_numel']:,} elements gathered at "
                         f"most ({work['live_at_peak_text']}), "
                         f"{work['gathers_per_micro_step']} all-gather(s) per micro-step")
    else:
        smallest = min((c for c in rec.tried if c.estimate.runs), key=lambda c: c.total)
        lines.append(f"nothing built fits: the smallest is {smallest.describe()} at "
                     f"{format_bytes(smallest.total)} per device")
        if rec.not_built:
            for est in rec.not_built:
                what = ("formula only: the model's gather units are unknown"
                        if est.option.built else "not built yet: formula only")
                lines.append(f"  would need {est.name} ({what}): "
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
