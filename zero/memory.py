"""Memory of the engine: what the ZeRO formulas say each rank should own, and the report
that puts the accounting registry's measurement beside it (as text: zero/reports/table.py).

Ψ below is the parameter count padded as the partition planner lays it out (each group's
flat buffer is padded to a multiple of world_size x alignment at stages >= 1), so the
formulas hold exactly, not approximately. b is the bytes of a model parameter (2 in mixed
precision, 4 in fp32).
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import torch

from .boundary import as_dict, fp32_grads, grads_sharded, sixteen_bit_master, sixteen_bit_states


@dataclass(frozen=True)
class StateLayout:
    """What the engine keeps per rank, in elements (already padded)."""
    stage: int
    world_size: int
    numel: int            # Ψ (padded)
    param_bytes: int      # b: 2 (fp16/bf16) or 4 (fp32)
    optimizer_arrays: int  # the optimizer's arrays per element (the engine's names)
    master_bytes: int = 4  # 2: bf16/fp16_master_weights_and_grads (the master in the model dtype)
    state_bytes: int = 4   # 2: bf16_optimizer_states (boundary.sixteen_bit_states)
    grad_bytes: int = 0    # 4: a 16-bit model's gradients accumulated in fp32; 0: b
    external: bool = False  # an external optimizer: it steps one whole fp32 tensor
    persistent: bool = False  # stage 3's small parameters kept whole (laid out as stage 1)
    frozen: bool = False  # stage 3's frozen parameters: their partitioned shard alone ...
    packed_bytes: int = 0  # ... kept as int8 code (zero_quantized_nontrainable_weights): bytes
    sharded_grads: bool = False  # stage 1, one micro-step per step: gradients sharded as at 2
    offload_optimizer: str = "none"  # "cpu" | "nvme": where fp32 master + optimizer state live
    offload_param: bool = False  # stage 3: the parameter shard lives in host memory ...
    param_nvme_numel: int = 0    # ... or this many of its elements on NVMe (offload_param nvme)
    # stages 2-3 with the whole optimizer step offloaded: the gradient shard is in host memory
    grads_on_host: bool = False
    # offload_optimizer.ratio < 1: of the shard's Ψ/N elements, how many keep their master and
    # optimizer state offloaded (the rest, on the device, keep theirs there); None: all of them
    offloaded_numel: int | None = None

    @property
    def sharded_numel(self) -> int:
        return self.numel if self.stage == 0 else self.numel // self.world_size


def state_layouts(core, groups, spec, config, param_bytes: int) -> list[StateLayout]:
    """What the ZeRO formulas describe for an engine (its EngineCore and EngineGroups): one
    layout per group kind (stage, the optimizer's arrays as the engine keeps them); stage 3's
    persistent parameters follow stage 1 and are a layout of their own. N is the ranks a group
    shards over: the world, or with MiCS the shard group. Stage 3's partitioned frozen
    parameters are a layout of their own (their shard only: no gradients or optimizer)."""
    kinds: dict[tuple[int, int], dict] = {}
    for g, group in enumerate(groups):
        info = core.group_offload_info(g)
        kind = kinds.setdefault((group.stage, len(core.group_state_names(g))),
                                {"numel": 0, "offloaded": 0, "nvme": 0, "grads_on_host": True})
        kind["numel"] += core.group_numel(g)
        kind["world_size"] = core.group_layout(g).world_size
        kind["offloaded"] += info.offloaded_numel          # shard elements with offloaded state
        kind["nvme"] += info.nvme_param_numel              # parameter shard elements on NVMe
        kind["grads_on_host"] = kind["grads_on_host"] and info.grads_on_host
    zero_cfg = config.zero_optimization
    return [StateLayout(stage=stage, world_size=kind["world_size"], numel=kind["numel"],
                        param_bytes=param_bytes, optimizer_arrays=arrays,
                        master_bytes=param_bytes if sixteen_bit_master(config) else 4,
                        state_bytes=param_bytes if sixteen_bit_states(
                            config, spec.fp32_optimizer_states) else 4,
                        grad_bytes=4 if fp32_grads(config) else param_bytes,
                        external=spec.external is not None,
                        persistent=zero_cfg.stage == 3 and stage == 1,
                        sharded_grads=stage == 1 and grads_sharded(
                            zero_cfg.stage, config.gradient_accumulation_steps),
                        offload_optimizer=zero_cfg.offload_optimizer.device,
                        offload_param=stage == 3 and zero_cfg.offload_param.device != "none",
                        param_nvme_numel=kind["nvme"], grads_on_host=kind["grads_on_host"],
                        offloaded_numel=kind["offloaded"])
            for (stage, arrays), kind in sorted(kinds.items(), reverse=True)] + \
        _frozen_layouts(core, param_bytes, zero_cfg.offload_param.device,
                        bool(zero_cfg.zero_quantized_nontrainable_weights))


def _frozen_layouts(core, param_bytes: int, offload_param: str,
                    quantized: bool) -> list[StateLayout]:
    """Stage 3's frozen group, if any, as a layout after the trained ones (`quantized`: its
    shard kept packed, quantized_bytes per unit piece)."""
    if not core.frozen_group_count:
        return []
    from . import _C

    layouts = [core.frozen_group_layout(g) for g in range(core.frozen_group_count)]
    infos = [core.frozen_group_offload_info(g) for g in range(core.frozen_group_count)]
    packed = sum(_C.quantized_bytes(layout.unit(u).shard_numel)
                 for layout in layouts for u in range(layout.unit_count)) if quantized else 0
    return [StateLayout(stage=3, world_size=layouts[0].world_size,
                        numel=sum(layout.full_numel for layout in layouts),
                        param_bytes=param_bytes, optimizer_arrays=0, frozen=True,
                        packed_bytes=packed, offload_param=offload_param != "none",
                        param_nvme_numel=sum(info.nvme_param_numel for info in infos))]


def _coefficients(layout: StateLayout) -> dict[str, tuple[int, bool]]:
    """Bytes per parameter of each category, and whether it is divided by N."""
    b, stage = layout.param_bytes, layout.stage
    if layout.frozen:  # (packed: about 1 byte per element, int8 and a scale per 256)
        return {"param": (1 if layout.packed_bytes else b, True), "gradient": (0, True), "fp32_master": (0, True),
                "optimizer_state": (0, True)}
    optimizer = layout.state_bytes * layout.optimizer_arrays
    # Where the master has the parameters' dtype (fp32 training, or a 16-bit master) it is the
    # parameter's own shard (nothing extra), unless the optimizer is offloaded (the host keeps
    # a copy of its own), the parameters are (stage 3's device step keeps one) or the
    # optimizer is external (it steps one whole fp32 tensor).
    separate = (layout.master_bytes != b or layout.offload_optimizer != "none"
                or layout.offload_param or layout.external)
    master = layout.master_bytes if separate else 0
    return {
        "param": (b, stage >= 3),
        "gradient": (layout.grad_bytes or b, stage >= 2 or layout.sharded_grads),
        "fp32_master": (master, stage >= 1),
        "optimizer_state": (optimizer, stage >= 1),
    }


def category_location(layout: StateLayout, category: str) -> str:
    """Where a model-state category lives: "device", "host" or "nvme" (when offloaded)."""
    if category in ("fp32_master", "optimizer_state") and layout.offload_optimizer != "none":
        return "host" if layout.offload_optimizer == "cpu" else "nvme"
    if category == "gradient" and layout.grads_on_host:
        return "host"
    if category == "param" and layout.param_nvme_numel:
        return "nvme"
    if category == "param" and layout.offload_param:
        return "host"
    return "device"


def expected_model_state_bytes(layout: StateLayout) -> dict[str, dict]:
    """Per category: the bytes this rank should own, the formula that gives them and where
    they are (`by_location`: split between the device and the host / NVMe with a partial
    optimizer offload)."""
    rows = {}
    for name, (coefficient, sharded) in _coefficients(layout).items():
        numel = layout.sharded_numel if sharded else layout.numel
        formula = f"{coefficient}Ψ/N" if sharded and coefficient else f"{coefficient}Ψ"
        location = category_location(layout, name)
        value = coefficient * numel
        if name == "param" and layout.packed_bytes:  # exact: the packed pieces' bytes
            value = layout.packed_bytes
            formula += " (int8 + fp32 scale per 256)"
        by_location = {location: value}
        partial = (location != "device" and name in ("fp32_master", "optimizer_state")
                   and layout.offloaded_numel is not None and layout.offloaded_numel != numel)
        if partial and coefficient:
            offloaded = coefficient * layout.offloaded_numel
            by_location = {location: offloaded, "device": value - offloaded}
            share = layout.offloaded_numel / numel if numel else 0.0
            formula += f" ({share:.3g} {location}, the rest on the device)"
        elif location == "nvme" and name == "param" and layout.param_nvme_numel != numel:
            on_nvme = coefficient * layout.param_nvme_numel  # max_in_cpu keeps the rest on the host
            by_location = {"nvme": on_nvme, "host": value - on_nvme}
            share = layout.param_nvme_numel / numel if numel else 0.0
            formula += f" ({share:.3g} nvme, the rest on the host)"
        elif coefficient and location != "device":
            formula += f" ({location})"
        rows[name] = {"bytes": value, "formula": formula if coefficient else "0",
                      "location": location, "by_location": by_location}
    return rows


def total_formula(layout: StateLayout) -> str:
    """The model-state total in the paper's notation, e.g. '2Ψ + 14Ψ/N'."""
    coefficients = _coefficients(layout).values()
    full = sum(c for c, sharded in coefficients if not sharded)
    divided = sum(c for c, sharded in coefficients if sharded)
    parts = ([f"{full}Ψ"] if full else []) + ([f"{divided}Ψ/N"] if divided else [])
    return " + ".join(parts) or "0"


LOCATIONS = ("device", "host_pinned", "host_pageable", "nvme")  # the registry's locations
CATEGORY_ORDER = ("param", "gradient", "fp32_master", "optimizer_state", "bucket",
                  "gathered_param", "staging", "other")
MODEL_STATES = CATEGORY_ORDER[:4]


def process_memory() -> dict[str, int]:
    """Process-level numbers the registry cannot see: RSS on CPU, allocator peaks on GPU (of
    the engine's device, cuda:LOCAL_RANK, as zero.engine picks it)."""
    out = {"rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            out["rss_bytes"] = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        out["cuda_device"] = device.index
        out["cuda_allocated_bytes"] = torch.cuda.memory_allocated(device)
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["cuda_reserved_bytes"] = torch.cuda.memory_reserved(device)
        out["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out


def build_report(registry, layouts: list[StateLayout], rank: int, step: int,
                 comm_stats: dict, activation_bytes: int | None = None,
                 mesh: dict | None = None) -> dict:
    """The per-rank memory report: measured current/peak per category beside the formula
    (summed over the engine's layouts: stage 3 has its persistent parameters as a second).
    `mesh` (PipelineParallelGrid.describe()): with pipeline stages or tensor parallelism the
    rank's place; its numbers are then its part's (Ψ of its stage / slice, N its data ranks)."""
    categories = {}
    for row in registry.records():
        entry = categories.setdefault(row.category, {"current": 0, "peak": 0, "by_location": {}})
        entry["current"] += row.current
        entry["peak"] = registry.category_usage(row.category).peak
        entry["by_location"][row.location] = {"current": row.current, "peak": row.peak}
    expected_total = 0
    expected_by_location = {"device": 0, "host": 0, "nvme": 0}
    for layout in layouts:
        label = _label(layout)
        for name, row in expected_model_state_bytes(layout).items():
            entry = categories.setdefault(name, {"current": 0, "peak": 0, "by_location": {}})
            entry["expected"] = entry.get("expected", 0) + row["bytes"]
            formula = f"{label}{row['formula']}"
            entry["formula"] = f"{entry['formula']} + {formula}" if "formula" in entry else formula
            expected_total += row["bytes"]
            for location, value in row["by_location"].items():
                expected_by_location[location] += value
    # Model states at their most: stages 2 and 3 give the gradient shard's memory back
    # between steps (held from a window's first gradient to the step); the others are constant.
    model_state = sum(categories[name]["peak"] for name in _coefficients(layouts[0]))
    measured_by_location = {"device": 0, "host": 0, "nvme": 0}
    for name in _coefficients(layouts[0]):
        for location, usage in categories[name]["by_location"].items():
            where = location if location in ("device", "nvme") else "host"
            measured_by_location[where] += usage["peak"]
    main = layouts[0]  # the trained parameters' (partitioned at stage 3, when any are)
    process = process_memory()
    if "cuda_allocated_bytes" in process:  # e.g. cuBLAS workspaces, the user's own tensors
        process["cuda_outside_zero_bytes"] = (process["cuda_allocated_bytes"] -
                                              registry.location_usage("device").current)
    formula = " + ".join((f"{_label(layout).strip()}: " if _label(layout) else "")
                         + total_formula(layout) for layout in layouts)
    return {
        "rank": rank,
        "step": step,
        # (persistent and frozen layouts exist at stage 3 only: a LoRA model's adapters may
        # all be persistent, its frozen base partitioned)
        "stage": 3 if any(_label(layout) for layout in layouts) else main.stage,
        "world_size": main.world_size,
        "numel": sum(layout.numel for layout in layouts if not _label(layout)),
        "persistent_numel": sum(layout.numel for layout in layouts if layout.persistent),
        "frozen_numel": sum(layout.numel for layout in layouts if layout.frozen),
        "param_bytes": main.param_bytes,
        "categories": categories,
        "model_state_bytes": model_state,
        "model_state_expected_bytes": expected_total,
        "model_state_formula": formula,
        # model states by where they live (device, host: pinned or pageable, nvme), measured
        # and as the formulas place them
        "model_state_by_location": {"measured": measured_by_location,
                                    "expected": expected_by_location},
        "total": as_dict(registry.total()),
        # every category at one location: current and peak (the peak of the sum)
        "by_location": {location: as_dict(registry.location_usage(location))
                        for location in LOCATIONS},
        "offload": {"optimizer": main.offload_optimizer,
                    "param": ("nvme" if any(layout.param_nvme_numel for layout in layouts) else
                              "cpu" if any(layout.offload_param for layout in layouts) else "none")},
        "process": process,
        "comm": comm_stats,
        # what the last forward kept for backward (autograd's saved tensors, parameters
        # excluded), measured; None when not measured
        "activations_bytes": activation_bytes,
        "mesh": mesh,
    }


def _label(layout: StateLayout) -> str:
    """How a layout's terms are told apart in the report: "" for the trained parameters'."""
    return "persistent " if layout.persistent else "frozen " if layout.frozen else ""


def location_totals(report: dict) -> dict[str, dict[str, int | None]]:
    """Per registry location: current and peak bytes over all categories (reports written
    before the `by_location` key: current summed from the categories, peak unknown)."""
    if "by_location" in report:
        return report["by_location"]
    out = {location: {"current": 0, "peak": None} for location in LOCATIONS}
    for entry in report["categories"].values():
        for location, usage in entry.get("by_location", {}).items():
            out.setdefault(location, {"current": 0, "peak": None})["current"] += usage["current"]
    return out
