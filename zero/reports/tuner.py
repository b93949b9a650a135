"""Pick the configuration that fits a memory budget with the least offload, then the least
communication.

Tiers, tried in order; the first tier with a fitting configuration wins:

    1. no offload      stage 0 (all-reduce of gradients)
                       stage 1 (all-reduce + all-gather of the updated params)
                       stage 2 (reduce-scatter + all-gather; adds buckets)
                       stage 3 (all-gathers in forward and backward, reduce-scatter every
                                micro-step; adds the gathered working set)
    2. part of the optimizer -> host memory (offload_optimizer cpu with ratio r < 1): stage
       1, 2, 3, each at the least r, in hundredths, whose device bytes fit. The fp32 master
       and optimizer state of each shard's tail (r of it) leave the device, the head's stay
       and step there; the gradients stay on the device, and every step copies only the
       tail's gradients out and its new parameters back, and the CPU steps only the tail.
       The host bytes grow with r, so the least r is also the one most likely to fit the
       host budget. Skipped with --no-partial-offload, a ratio below 1 in the config, the
       delayed update (it needs the whole step on the host) and on a CPU-only machine. (zero
       runs a ratio at every stage; DeepSpeed ignores one below stage 3.)
    3. optimizer -> host memory (offload_optimizer cpu): stage 1, 2, 3. The fp32 master and
       the optimizer state leave the device (12Ψ/N in mixed precision; at stages 2-3 the
       gradient shard too, 2Ψ/N more); the host pays them plus two staging chunks per
       engine group, and every step copies the gradient shard to the host (stage 1; stages
       2-3 reduce into host memory) and the new parameters back.
    4. parameters -> host memory (stage 3, offload_param cpu): parameters only, then
       parameters + part of the optimizer (the least ratio that fits, as in tier 2), then
       parameters + optimizer. The parameter shard leaves the device too; every gather
       copies the unit's shard piece to the device first.
    5. optimizer -> NVMe (offload_optimizer nvme, only with an NVMe path): stage 1, 2, 3,
       then stage 3 + parameters on the host. The state goes to a swap file; the host keeps
       two chunks of each state array.
    6. parameters -> NVMe (stage 3, offload_param nvme, only with an NVMe path): parameters
       only, then with part of the optimizer on the host (as in tier 2), the whole optimizer
       on the host, then on NVMe too. With a host budget, max_in_cpu takes what it leaves:
       the first units stay in host memory, and their gathers read no disk. The device holds what it
       holds with parameters on the host; the host keeps buffer_count buffers of one unit's
       shard instead of the whole shard, so this tier is for a host budget that tier 4 does
       not fit. Every gather reads its unit from the swap file (or a buffer).

Within a tier the stages go in order of communication, as without offload. Within stage 2 the
reduce bucket (= unit) size is the knob: it starts at the configured reduce_bucket_size and
halves until the buckets fit (never below the largest parameter, which is a unit of its own
anyway): bigger buckets mean fewer, larger collectives. With overlap_comm on (two buckets) and
no fit, overlap is switched off (one bucket) before the bucket shrinks further. Within stage 3
(needs the model's gather units, i.e. --model or --hf-config, or --params with assumed units)
the knobs are overlap_comm (two buckets or one) and stage3_max_live_parameters: the configured
settings are tried first; when the working set does not fit, the live bound is set to what the
budget leaves after model states and buckets (the engine then evicts units kept for reuse and
prefetches less, so it gathers more: the replayed schedule counts the all-gathers). Among the
stage-3 settings that fit and run the least communication wins, then overlap on. The
micro-batch, accumulation, optimizer and everything else stay as they are.

A configuration fits when its device bytes fit budget - reserve - headroom, its host bytes x
ranks per node fit --host-budget (when given) and its NVMe bytes x ranks per node fit
--nvme-budget (when given). Only the model states, buckets, host staging and stage 3's
gathered working set are estimated (exactly, checked against the engine); activations and
framework overhead are not, so pass --reserve or --headroom. An option the engine would refuse
(a stage-3 live bound below the units in use, a unit above offload_param.buffer_size) does not
fit. When nothing fits, the tuner says which option would (NVMe without a path, stage 3
without the model's gather units) and writes no config.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Optional

from .estimate import (DEFAULT_MAX_INFLIGHT_GATHERS, DEFAULT_PARAM_BUFFER_COUNT,
                       DEFAULT_PARAM_BUFFER_SIZE, DEFAULT_PARAM_MAX_IN_CPU,
                       DEFAULT_SUB_GROUP_SIZE, OPTIONS, Estimate, EstimateError, ModelShapes,
                       Option, Setup, estimate, format_bytes, option_for)
from .estimate.traffic import stage3_traffic


class TuneError(EstimateError):
    """The recommendation cannot be written as a valid config."""


# Offload tiers, least offload first (see the module docstring); NVMe only with a path. A
# member is (stage, the optimizer's device, the parameters' device, partial): a partial member
# offloads the least part of the optimizer step that fits the device (least_ratio).
TIERS = (
    ("no offload", ((0, "none", "none", False), (1, "none", "none", False),
                    (2, "none", "none", False), (3, "none", "none", False))),
    ("optimizer partly on the host", ((1, "cpu", "none", True), (2, "cpu", "none", True),
                                      (3, "cpu", "none", True))),
    ("optimizer on the host", ((1, "cpu", "none", False), (2, "cpu", "none", False),
                               (3, "cpu", "none", False))),
    ("parameters on the host", ((3, "none", "cpu", False), (3, "cpu", "cpu", True),
                                (3, "cpu", "cpu", False))),
    ("optimizer on NVMe", ((1, "nvme", "none", False), (2, "nvme", "none", False),
                           (3, "nvme", "none", False), (3, "nvme", "cpu", False))),
    ("parameters on NVMe", ((3, "none", "nvme", False), (3, "cpu", "nvme", True),
                            (3, "cpu", "nvme", False), (3, "nvme", "nvme", False))),
)


def _needs_nvme_path(option: Option) -> bool:
    return "nvme" in (option.offload_optimizer, option.offload_param)


@dataclass
class Candidate:
    estimate: Estimate
    reduce_bucket_size: int
    overlap_comm: bool
    fits: bool
    comm_bytes: int          # gradient + parameter payload per optimizer step (paper counting)
    collectives: int         # gradient + parameter collectives per optimizer step
    verdict: str = ""        # why it does not fit ("" when it fits)

    # the estimate's option and bytes per rank, under the tuner's names
    stage = property(lambda self: self.estimate.option.stage)
    option = property(lambda self: self.estimate.option)
    total = property(lambda self: self.estimate.device_bytes,
                     doc="Bytes per device (the budget's side).")
    host_bytes = property(lambda self: self.estimate.host_bytes)
    nvme_bytes = property(lambda self: self.estimate.nvme_bytes)

    @property
    def stage3(self) -> Optional[dict]:
        """The stage3_* config values of a stage-3 candidate."""
        return self.estimate.setup.stage3_dict() if self.stage == 3 else None

    @property
    def offload_ratio(self) -> float:
        """The fraction of each shard's optimizer step on the host or NVMe (1 without
        optimizer offload, whatever the setup says)."""
        if self.option.offload_optimizer == "none":
            return 1.0
        return float(self.estimate.setup.offload_ratio)

    def describe(self) -> str:
        text = f"stage {self.stage}"
        if self.option.offload_optimizer != "none":
            part = "" if self.offload_ratio == 1 else f" (ratio {self.offload_ratio:g})"
            text += f" + optimizer{part} on {_DEVICE_TEXT[self.option.offload_optimizer]}"
        if self.option.offload_param != "none":
            text += f" + params on {_DEVICE_TEXT[self.option.offload_param]}"
        text += (f", reduce_bucket_size {self.reduce_bucket_size:,}, "
                 f"overlap_comm {str(self.overlap_comm).lower()}")
        if self.stage == 3:
            setup = self.estimate.setup
            text += (f", max_live {setup.max_live_parameters:,}, prefetch "
                     f"{setup.prefetch_bucket_size:,}, reuse {setup.max_reuse_distance:,}")
        return text

    def to_dict(self) -> dict:
        return {"stage": self.stage, "offload_optimizer": self.option.offload_optimizer,
                "offload_ratio": self.offload_ratio, "offload_param": self.option.offload_param,
                "reduce_bucket_size": self.reduce_bucket_size,
                "overlap_comm": self.overlap_comm, "fits": self.fits, "verdict": self.verdict,
                "device_bytes": self.total, "host_bytes": self.host_bytes,
                "nvme_bytes": self.nvme_bytes, "comm_bytes_per_step": self.comm_bytes,
                "collectives_per_step": self.collectives, "stage3": self.stage3,
                "categories": {k: v["bytes"] for k, v in self.estimate.categories.items()},
                "categories_by_location": {k: dict(v.get("by_location") or
                                                   {v["location"]: v["bytes"]})
                                           for k, v in self.estimate.categories.items()}}


_DEVICE_TEXT = {"cpu": "the host", "nvme": "NVMe"}


@dataclass
class Recommendation:
    budget: int
    usable: int                       # budget - reserve - headroom
    host_budget: Optional[int]
    chosen: Optional[Candidate]
    tried: list[Candidate] = field(default_factory=list)
    # options that would fit but cannot be recommended: NVMe without --nvme-path, stage 3
    # without the model's gather units (and an option not built, should one be added)
    not_built: list[Estimate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    nvme_budget: Optional[int] = None
    nvme_path: Optional[str] = None
    cpu_only: bool = False  # training on the CPU: device and host bytes share the RAM

    def to_dict(self) -> dict:
        return {
            "budget_bytes": self.budget, "usable_bytes": self.usable, "cpu_only": self.cpu_only,
            "host_budget_bytes": self.host_budget, "nvme_budget_bytes": self.nvme_budget,
            "nvme_path": self.nvme_path,
            "recommended": self.chosen.to_dict() if self.chosen else None,
            "tried": [c.to_dict() for c in self.tried],
            "would_need_not_built": [{**e.to_dict(), "why_not": why_not(e, self.nvme_path)}
                                     for e in self.not_built],
            "notes": self.notes,
        }


def why_not(est: Estimate, nvme_path: Optional[str]) -> str:
    """Why a fitting option was not recommended."""
    if not est.option.built:
        return "not built yet: formula only"
    if _needs_nvme_path(est.option) and nvme_path is None:
        return "needs an NVMe path: pass --nvme-path"
    return "formula only: the model's gather units are unknown (use --model)"


def communication(stage: int, est: Estimate, param_bytes: int, gas: int) -> tuple[int, int]:
    """(payload bytes, collectives) per optimizer step per rank, counted as the engine's
    Communicator counts them (all-reduce 2x, reduce-scatter and all-gather 1x the full
    unit, even on one rank); gradients in the communication dtype (est.setup.comm_bytes),
    parameters in `param_bytes`. Scalar all-reduces (norm, overflow flag) and stage 3's control
    exchanges are left out. Stage 3: the bytes of estimate/traffic.py (every micro-step
    all-gathers what the replayed schedule gathers and reduce-scatters every unit; at the
    boundary the persistent group reduce-scatters and all-gathers (b_c + b)Ψp; the configured
    ZeRO++ / MiCS layout moves or shrinks them), across nodes and within one together."""
    psi, units = est.numel, est.unit_count
    if stage == 3 and est.stage3 is not None:
        work = est.stage3["working_set"]
        persistent_units = est.stage3["persistent_units"]
        traffic = stage3_traffic(est, est.setup, gas)
        payload = traffic.cross_node + traffic.in_node
        reduce_scatters = sum(group["unit_count"] for group in est.groups)  # per group
        return payload, gas * (work["gathers_per_micro_step"] + reduce_scatters) + \
            2 * persistent_units
    grad_bytes = est.setup.comm_bytes
    if stage == 0:
        return 2 * psi * grad_bytes, units
    if stage == 1:  # reduce-scatter + all-gather
        return psi * (grad_bytes + param_bytes), 2 * units
    return psi * (gas * grad_bytes + param_bytes), (gas + 1) * units


def bucket_sizes(start: int, largest_param: int) -> list[int]:
    """start, start/2, ... while above the largest parameter, then the largest parameter."""
    sizes = [int(start)]
    while sizes[-1] // 2 >= max(1, largest_param):
        sizes.append(sizes[-1] // 2)
    if largest_param < sizes[-1]:
        sizes.append(max(1, largest_param))
    return sizes


def tune(shapes: ModelShapes, setup: Setup, budget: int, host_budget: int | None = None,
         reserve: int = 0, headroom: float = 0.0, gradient_accumulation_steps: int = 1,
         nvme_path: str | None = None, nvme_budget: int | None = None, offload: bool = True,
         partial: bool = True) -> Recommendation:
    """The first configuration, in order of least offload, then least communication, whose
    estimated per-rank device bytes fit in budget - reserve - headroom x budget (and whose
    host / NVMe bytes per node fit host_budget / nvme_budget when given). NVMe is tried only
    with an nvme_path; offload=False keeps to the first tier; partial=False skips the partial
    optimizer offload (ratio < 1; also skipped when the setup's ratio or delayed update is
    set, or setup.cpu_only). setup.cpu_only: training runs on
    the CPU, so the "device" is the host's RAM too: a rank's device and host bytes together must
    fit the budget (and, per node, the host budget); offloading to the host then saves nothing,
    only NVMe does."""
    if not 0.0 <= headroom < 1.0:
        raise EstimateError(f"--headroom must be in [0, 1), got {headroom}")
    usable = int(budget - reserve - headroom * budget)
    cpu_only = setup.cpu_only
    rec = Recommendation(budget=budget, usable=usable, host_budget=host_budget, chosen=None,
                         nvme_budget=nvme_budget, nvme_path=nvme_path, cpu_only=cpu_only)
    if usable <= 0:
        rec.notes.append(f"reserve and headroom leave nothing of the budget "
                         f"({format_bytes(budget)})")
    base = dataclasses.replace(setup, offload_optimizer="none", offload_param="none")
    gas = gradient_accumulation_steps
    rpn = setup.ranks_per_node

    def judge(est: Estimate, size: int, overlap: bool) -> Candidate:
        comm, calls = communication(est.option.stage, est, setup.param_bytes, gas)
        verdicts = [] if est.runs else ["does not run: " + est.error]
        verdicts += _over_budget(est, usable, host_budget, nvme_budget, rpn, cpu_only)
        candidate = Candidate(est, size, overlap, not verdicts, comm, calls, "; ".join(verdicts))
        rec.tried.append(candidate)
        return candidate

    tiers = TIERS if offload else TIERS[:1]
    partial = partial and not cpu_only and not setup.delayed_update \
        and float(setup.offload_ratio) == 1.0
    for _, members in tiers:
        for stage, on_optimizer, on_param, part in members:
            option = option_for(stage, on_optimizer, on_param)
            if (_needs_nvme_path(option) and nvme_path is None) or (part and not partial):
                continue
            if stage == 3 and not shapes.has_units:
                continue
            member = param_buffers_for(shapes, base, option)
            if part:
                ratio = least_ratio(shapes, member, option, usable)
                if ratio is None:
                    continue
                member = dataclasses.replace(member, offload_ratio=ratio)
            if host_budget is not None and not cpu_only:
                member = host_prefix_for(shapes, member, option, host_budget // rpn)
            if stage == 3:
                fitting = [c for c in (judge(est, setup.reduce_bucket_size,
                                             est.stage3["overlap_comm"])
                                       for est in stage3_estimates(shapes, member, usable,
                                                                   option))
                           if c.fits]
                if fitting:  # least communication, then overlap on
                    rec.chosen = min(fitting, key=lambda c: (c.comm_bytes, not c.overlap_comm))
                    note = first_boundary_note(rec.chosen.estimate, gas)
                    if note:
                        rec.notes.append(note)
                    return _finish(rec, rpn, grads_on_device_note(shapes, rec.chosen, usable,
                                                                  gas))
                continue
            if _stage_below_3(shapes, member, option, judge):
                rec.chosen = rec.tried[-1]
                note = partial_note(rec.chosen) if part else \
                    grads_on_device_note(shapes, rec.chosen, usable, gas)
                return _finish(rec, rpn, note)
    # Nothing fits: which option would, that cannot be recommended?
    for option in OPTIONS:
        needs_path = _needs_nvme_path(option) and nvme_path is None
        formula_stage3 = option.stage == 3 and not shapes.has_units
        if option.built and not needs_path and not formula_stage3:
            continue
        if (needs_path or option.offloaded) and not offload:
            continue
        # stage 3 with units: the same settings the tiers try (a lower live bound, the
        # parameter buffers raised)
        member = param_buffers_for(shapes, base, option)
        tries = (stage3_estimates(shapes, member, usable, option) if option.stage == 3
                 and shapes.has_units else [estimate(shapes, member, option, strict=False)])
        for est in tries:
            if est.runs and not _over_budget(est, usable, host_budget, nvme_budget, rpn,
                                             cpu_only):
                rec.not_built.append(est)
                break
    return rec


def partial_note(chosen: Candidate) -> str:
    """The partial-offload tier's choice below stage 3, to a DeepSpeed user."""
    return (f"offload_optimizer.ratio {chosen.offload_ratio:g} at stage {chosen.stage} is "
            "zero's (DeepSpeed ignores a ratio below stage 3); zero-mem tune "
            "--no-partial-offload recommends a whole offload")


def param_buffers_for(shapes: ModelShapes, setup: Setup, option: Option) -> Setup:
    """Parameters on NVMe: the engine refuses a unit larger than offload_param.buffer_size
    (default 100,000,000 elements), so where one is, the setup with buffer_size raised to
    the largest unit's shard on NVMe (what the engine's error asks for; the host then keeps
    buffer_count buffers of it, counted in the estimate). Otherwise `setup` as it is."""
    if option.offload_param != "nvme":
        return setup
    placed = estimate(shapes, setup, option, strict=False).offload.get("param_nvme") or {}
    largest = max(placed.get("largest_nvme_unit_shards") or [0])
    if largest <= setup.param_buffer_size:
        return setup
    return dataclasses.replace(setup, param_buffer_size=int(largest))


def host_prefix_for(shapes: ModelShapes, setup: Setup, option: Option, host_room: int
                    ) -> Setup:
    """Parameters on NVMe with a host budget: offload_param.max_in_cpu raised by what the
    budget leaves beside the rest (`host_room` bytes per rank), so the first units stay in
    host memory and their gathers read no disk; the rest stay on NVMe. Otherwise `setup`."""
    if option.offload_param != "nvme":
        return setup

    def host_bytes(max_in_cpu: int) -> Optional[int]:
        est = estimate(shapes, dataclasses.replace(setup, param_max_in_cpu=max_in_cpu),
                       option, strict=False)
        return est.host_bytes if est.runs else None

    now = host_bytes(setup.param_max_in_cpu)
    if now is None or now >= host_room:
        return setup
    more = (host_room - now) // setup.param_bytes
    for _ in range(8):  # (a unit moving to the host may not shrink the NVMe buffers)
        if more <= 0:
            return setup
        raised = setup.param_max_in_cpu + more
        if (host_bytes(raised) or host_room + 1) <= host_room:
            return dataclasses.replace(setup, param_max_in_cpu=int(raised))
        more //= 2
    return setup


def least_ratio(shapes: ModelShapes, setup: Setup, option: Option, usable: int
                ) -> Optional[float]:
    """The least offload_optimizer.ratio below 1, in hundredths, at which `option` (at the
    configured buckets and stage-3 settings) fits `usable` device bytes; None when none does.
    Each offloaded element takes its master and state off the device, so the device bytes
    fall as the ratio grows (in steps: the engine rounds each group's tail with llround): a
    binary search over 0.01 .. 0.99."""
    def fits(hundredths: int) -> bool:
        est = estimate(shapes, dataclasses.replace(setup, offload_ratio=hundredths / 100),
                       option, strict=False)
        return est.runs and est.device_bytes <= usable

    if not fits(99):
        return None
    low, high = 0, 99  # high fits; low does not (0, no offload, is not a candidate)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high / 100


def _over_budget(est: Estimate, usable: int, host_budget: int | None, nvme_budget: int | None,
                 rpn: int, cpu_only: bool) -> list[str]:
    """What of the estimate does not fit (empty: it fits)."""
    verdicts = []
    ram = est.device_bytes + (est.host_bytes if cpu_only else 0)  # per rank
    if ram > usable:
        what = "RAM (device and host bytes: CPU only)" if cpu_only and est.host_bytes else ""
        verdicts.append(f"over by {format_bytes(ram - usable)}" + (f" of {what}" if what else ""))
    host = (ram if cpu_only else est.host_bytes) * rpn
    if host_budget is not None and host > host_budget:
        verdicts.append(f"host RAM over by {format_bytes(host - host_budget)} per node")
    if nvme_budget is not None and est.nvme_bytes * rpn > nvme_budget:
        verdicts.append(f"NVMe over by {format_bytes(est.nvme_bytes * rpn - nvme_budget)} "
                        "per node")
    return verdicts


def _stage_below_3(shapes: ModelShapes, base: Setup, option: Option, judge) -> bool:
    """Stages 0-2: bucket sizes from the configured one halving down (stage 2, and stage 1
    with sharded gradients; overlap off before a smaller bucket); True at the first that fits
    (the last judged)."""
    stage = option.stage
    overlap = base.overlap_for(stage)
    whole_units = base.grads_sharded(stage)  # buckets of whole units (stage 2; 1 at gas 1)
    overlaps = [overlap, False] if (whole_units and overlap) else [overlap]
    sizes = (bucket_sizes(base.reduce_bucket_size, shapes.largest_param_numel)
             if whole_units else [base.reduce_bucket_size])
    seen = set()
    for size in sizes:
        for ov in overlaps:
            est = estimate(shapes, base, option, reduce_bucket_size=size, overlap_comm=ov)
            key = (ov, est.numel, est.unit_count, est.max_unit_numel,
                   est.categories["bucket"]["bytes"])
            if key in seen:
                continue  # a smaller bucket size that changes nothing
            seen.add(key)
            if judge(est, size, ov).fits:
                return True
    return False


def _finish(rec: Recommendation, ranks_per_node: int, note: str = "") -> Recommendation:
    if note:
        rec.notes.append(note)
    chosen = rec.chosen
    if chosen.option.offloaded and rec.host_budget is None and not rec.cpu_only:
        rec.notes.append(f"host RAM was not checked (no --host-budget): this needs "
                         f"{format_bytes(chosen.host_bytes * ranks_per_node)} per node")
    if _needs_nvme_path(chosen.option) and rec.nvme_budget is None:
        rec.notes.append(f"NVMe space was not checked (no --nvme-budget): the swap files need "
                         f"{format_bytes(chosen.estimate.offload['swap_file_bytes'] * ranks_per_node)}"
                         " per node")
    return rec


def grads_on_device_note(shapes: ModelShapes, chosen: Candidate, usable: int, gas: int) -> str:
    """A GPU's stage 2-3 with the whole optimizer step offloaded keeps the gradient shard in
    host memory; when offload_optimizer.grads_on_device still fits the budget, say so and what
    it costs and saves (the engine's copies: csrc/adapter/grad_reducer.h). Not chosen: it
    trades device memory for host traffic, which the estimate does not price."""
    setup, option = chosen.estimate.setup, chosen.option
    if (setup.cpu_only or setup.grads_on_device or option.stage < 2
            or option.offload_optimizer == "none" or float(setup.offload_ratio) < 1.0):
        return ""
    kept = estimate(shapes, dataclasses.replace(setup, grads_on_device=True), option,
                    reduce_bucket_size=chosen.reduce_bucket_size,
                    overlap_comm=chosen.overlap_comm,
                    strict=False)
    if not kept.runs or kept.device_bytes > usable:
        return ""
    copies = f"{2 * gas - 1} shard-sized copies" if gas > 1 else "one shard-sized copy"
    return (f"offload_optimizer.grads_on_device: true would fit too "
            f"(+{format_bytes(kept.device_bytes - chosen.estimate.device_bytes)} per rank on the "
            f"device): backward then reduces into a gradient shard on the GPU instead of making "
            f"{copies} between the GPU and the host every step (at {gas} micro-step"
            f"{'s' if gas > 1 else ''}), and the step copies it to the host once")


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


def stage3_estimates(shapes: ModelShapes, setup: Setup, usable: int,
                     option: Option | None = None) -> list[Estimate]:
    """The stage-3 settings worth trying for one option (default: stage 3 without offload):
    the configured ones with overlap_comm as set (then off: one bucket); for each whose
    working set does not fit (or cannot run), the same with stage3_max_live_parameters set to
    the elements the budget leaves after model states, buckets and staging."""
    option = option or option_for(3)
    overlap = setup.overlap_for(3)
    out = []
    for ov in ([True, False] if overlap else [False]):
        base = dataclasses.replace(setup, overlap_comm=ov)
        est = estimate(shapes, base, option, strict=False)
        out.append(est)
        if est.device_bytes <= usable and est.runs:
            continue
        # the live bound also bounds what is in flight, so device staging shrinks with it
        fixed = est.device_bytes - est.categories["gathered_param"]["bytes"] \
            - est.categories["staging"]["by_location"].get("device", 0)
        room = (usable - fixed) // setup.param_bytes
        if option.offload_param != "none":  # device staging: up to room/N more, in bytes
            room = room * setup.world_size // (setup.world_size + 1)
        if room > 0 and room != setup.max_live_parameters:
            out.append(estimate(shapes, dataclasses.replace(base, max_live_parameters=room),
                                option, strict=False))
    return out


# ---- the config it writes -------------------------------------------------------------------

_ZERO_DROP_BELOW_STAGE3 = ("offload_param", "round_robin_gradients")
# offload block keys kept from the base config when the device stays the same
_OFFLOAD_KEYS = {("offload_optimizer", "cpu"): ("pin_memory",),
                 ("offload_optimizer", "nvme"): ("pin_memory", "buffer_count", "pipeline_read",
                                                 "pipeline_write", "fast_init"),
                 ("offload_param", "cpu"): ("pin_memory",),
                 ("offload_param", "nvme"): ("pin_memory",)}


def template_config(setup: Setup, micro_batch: int = 1, gradient_accumulation_steps: int = 1
                    ) -> dict:
    """A minimal complete config for when no --config was given."""
    if setup.optimizer == "adam":
        optimizer = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                 "weight_decay": 0.01}}
    elif setup.optimizer == "adagrad":
        optimizer = {"type": "Adagrad", "params": {"lr": 1e-2}}
    elif setup.optimizer == "lion":
        optimizer = {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}
    elif setup.optimizer == "lamb":
        optimizer = {"type": "Lamb", "params": {"lr": 1e-3, "weight_decay": 0.01}}
    else:
        optimizer = {"type": "SGD", "params": {
            "lr": 1e-2, "momentum": 0.9 if setup.optimizer == "sgd_momentum" else 0.0}}
    return {"train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "optimizer": optimizer, "zero_optimization": {}}


def _offload_block(name: str, device: str, previous, nvme_path: str | None,
                   setup: Setup) -> dict:
    """The `name` block ("offload_optimizer" or "offload_param") for `device` ("cpu" or
    "nvme"): pin_memory true unless the base config says otherwise (pinned host memory makes
    the copies faster; where it cannot be pinned the engine says why and uses pageable
    memory), the base's other keys that still apply, and what the estimate used: the
    optimizer's ratio, delayed_update and grads_on_device, the parameter buffers and
    max_in_cpu (when not the defaults)."""
    previous = previous if isinstance(previous, dict) else {}
    block = {"device": device, "pin_memory": True}
    if previous.get("device") == device:
        block.update({k: previous[k] for k in _OFFLOAD_KEYS[name, device] if k in previous})
    elif "pin_memory" in previous:
        block["pin_memory"] = previous["pin_memory"]
    if device == "nvme":
        block["nvme_path"] = nvme_path
    if name == "offload_optimizer" and float(setup.offload_ratio) != 1.0:
        block["ratio"] = float(setup.offload_ratio)
    if name == "offload_optimizer" and device == "cpu" and setup.delayed_update:
        block["delayed_update"] = True
    if name == "offload_optimizer" and setup.grads_on_device:
        block["grads_on_device"] = True
    if name == "offload_param" and device == "nvme":
        for key, value, default in (
                ("buffer_count", setup.param_buffer_count, DEFAULT_PARAM_BUFFER_COUNT),
                ("buffer_size", setup.param_buffer_size, DEFAULT_PARAM_BUFFER_SIZE),
                ("max_in_cpu", setup.param_max_in_cpu, DEFAULT_PARAM_MAX_IN_CPU)):
            if value != default or key in previous:
                block[key] = value
    return block


def recommended_config(rec: Recommendation, setup: Setup, base: dict | None = None,
                       micro_batch: int = 1, gradient_accumulation_steps: int = 1
                       ) -> tuple[dict, list[str]]:
    """(config dict, notes): `base` (or a template) with the recommended zero_optimization
    (stage, buckets, the stage-3 bounds, the offload blocks) and precision; checked with
    zero.config.load_config before it is returned."""
    from zero.config import ConfigError, load_config
    from zero.config.schema import ZERO_OPTIMIZATION_ALIASES

    if rec.chosen is None:
        raise TuneError("no built configuration fits the budget; nothing to write")
    chosen = rec.chosen
    option = chosen.option
    config = copy.deepcopy(base) if base is not None else template_config(
        setup, micro_batch, gradient_accumulation_steps)
    notes = []
    zero_block = dict(config.get("zero_optimization") or {})
    previous = {name: zero_block.pop(name, None) for name in ("offload_optimizer",
                                                               "offload_param")}
    not_built = _not_built_zero_keys()
    for short, documented in ZERO_OPTIMIZATION_ALIASES.items():  # DeepSpeed's field names
        if short in zero_block and documented not in zero_block:
            zero_block[documented] = zero_block.pop(short)
    for key in list(zero_block):
        if chosen.stage < 3 and (key.startswith("stage3_") or key in _ZERO_DROP_BELOW_STAGE3):
            notes.append(f"dropped zero_optimization.{key} (stage 3 only)")
            del zero_block[key]
        elif key in not_built:
            notes.append(f"dropped zero_optimization.{key} (not built; the recommendation is "
                         "estimated without it)")
            del zero_block[key]
    for name, device in (("offload_optimizer", option.offload_optimizer),
                         ("offload_param", option.offload_param)):
        was = (previous[name] or {}).get("device", "none") if isinstance(previous[name], dict) \
            else "none"
        if device != "none":
            zero_block[name] = _offload_block(name, device, previous[name], rec.nvme_path,
                                              chosen.estimate.setup)  # (its ratio)
        if device != was:
            notes.append(f"zero_optimization.{name}: {was} -> {device}")
    buffer_size = chosen.estimate.setup.param_buffer_size
    if option.offload_param == "nvme" and buffer_size != setup.param_buffer_size:
        notes.append(f"zero_optimization.offload_param.buffer_size: {setup.param_buffer_size} "
                     f"-> {buffer_size} (the largest gather unit on NVMe: the engine refuses "
                     "a unit above it)")
    if option.offload_optimizer != "none" and "sub_group_size" not in zero_block and \
            setup.sub_group_size != DEFAULT_SUB_GROUP_SIZE:
        zero_block["sub_group_size"] = setup.sub_group_size  # the estimate's chunk
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
    _keep_gradient_dtype(config, setup, notes)
    try:
        load_config(config, world_size=setup.world_size)
    except ConfigError as error:
        raise TuneError(f"the recommended config does not validate: {error}") from None
    return config, notes


def _keep_gradient_dtype(config: dict, setup: Setup, notes: list[str]) -> None:
    """The written config accumulates gradients in the dtype the estimate counted."""
    from zero.config.schema import FP32_DTYPES

    data_types = dict(config.get("data_types") or {})
    asked = data_types.get("grad_accum_dtype") in FP32_DTYPES and setup.precision != "fp32"
    if setup.fp32_grads == asked:
        return
    if setup.fp32_grads:
        data_types["grad_accum_dtype"] = "fp32"
    else:
        data_types.pop("grad_accum_dtype", None)
    config["data_types"] = data_types
    notes.append(f"data_types.grad_accum_dtype: {'fp32' if setup.fp32_grads else 'the training dtype'}")


def _not_built_zero_keys() -> set[str]:
    """zero_optimization keys whose feature is not built (round-robin gradients, stage-3
    fetch tuning)."""
    from zero.config import BUILT_FEATURES
    from zero.config.schema import ZERO_OPTIMIZATION

    return {key.name for key in ZERO_OPTIMIZATION.keys
            if key.feature is not None and key.feature not in BUILT_FEATURES}


def format_recommendation(rec: Recommendation, setup: Setup) -> str:
    rpn = setup.ranks_per_node
    lines = [f"budget: {format_bytes(rec.budget)} per device"
             + (f", {format_bytes(rec.usable)} usable for model states, buckets, staging and "
                "the stage-3 working set" if rec.usable != rec.budget else "")
             + (f"; host budget {format_bytes(rec.host_budget)} per node"
                if rec.host_budget is not None else "")
             + (f"; NVMe budget {format_bytes(rec.nvme_budget)} per node"
                if rec.nvme_budget is not None else "")]
    lines.extend(rec.notes)
    lines.append("tried, least offload then least communication first:")
    width = max((len(c.describe()) for c in rec.tried), default=0)
    for c in rec.tried:
        where = ""
        if c.host_bytes or c.nvme_bytes:
            where = f" + host {format_bytes(c.host_bytes * rpn)}/node"
            if c.nvme_bytes:
                where += f" + NVMe {format_bytes(c.nvme_bytes * rpn)}/node"
        lines.append(f"  {c.describe():<{width}} {format_bytes(c.total):>12} per device{where}  "
                     f"comm {format_bytes(c.comm_bytes)}/step in {c.collectives} collective(s)"
                     f"  {c.verdict or 'fits'}")
    if rec.chosen is not None:
        c = rec.chosen
        lines.append(f"recommended: {c.describe()}: {format_bytes(c.total)} per device "
                     f"({format_bytes(rec.usable - c.total)} to spare), "
                     f"{format_bytes(c.total * rpn)} per node")
        if c.option.offloaded:
            text = f"  offloaded: {format_bytes(c.host_bytes)} host RAM per rank"
            if c.nvme_bytes:
                text += (f", {format_bytes(c.nvme_bytes)} on NVMe per rank (swap files "
                         f"{format_bytes(c.estimate.offload['swap_file_bytes'])}) under "
                         f"{rec.nvme_path}")
            lines.append(text)
        if c.stage == 3:
            work = c.estimate.stage3["working_set"]
            lines.append(f"  stage 3 working set: {work['peak_numel']:,} elements gathered at "
                         f"most ({work['live_at_peak_text']}), "
                         f"{work['gathers_per_micro_step']} all-gather(s) per micro-step")
    else:
        runnable = [c for c in rec.tried if c.estimate.runs]
        if runnable:
            smallest = min(runnable, key=lambda c: c.total)
            lines.append(f"nothing fits: the smallest on the device is {smallest.describe()} at "
                         f"{format_bytes(smallest.total)} per device")
        else:
            lines.append("nothing fits")
        if rec.not_built:
            for est in rec.not_built:
                lines.append(f"  would need {est.name} ({why_not(est, rec.nvme_path)}): "
                             f"{format_bytes(est.device_bytes)} per device, "
                             f"{format_bytes(est.host_bytes * rpn)} host RAM and "
                             f"{format_bytes(est.nvme_bytes * rpn)} NVMe per node")
        else:
            limits = " and ".join(["the device budget"]
                                  + (["the host budget"] if rec.host_budget is not None else [])
                                  + (["the NVMe budget"] if rec.nvme_budget is not None else []))
            lines.append(f"  no option, offload included, fits {limits}: more ranks, bigger "
                         "budgets or a smaller model are needed")
    lines.append("activations, autograd temporaries and framework overhead are not included: "
                 "keep room with --reserve / --headroom")
    return "\n".join(lines)


def dump_config(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"
