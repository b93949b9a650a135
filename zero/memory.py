"""Memory of the engine: what the ZeRO formulas say each rank should own, and the report
that puts the accounting registry's measurement beside it.

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


@dataclass(frozen=True)
class StateLayout:
    """What the engine keeps per rank, in elements (already padded)."""
    stage: int
    world_size: int
    numel: int            # Ψ (padded)
    param_bytes: int      # b: 2 (fp16/bf16) or 4 (fp32)
    optimizer: str        # "adam" | "sgd"
    sgd_momentum: bool = False
    persistent: bool = False  # stage 3's small parameters kept whole (laid out as stage 1)
    offload_optimizer: str = "none"  # "cpu" | "nvme": where fp32 master + optimizer state live
    offload_param: bool = False  # stage 3: the parameter shard lives in host memory

    @property
    def mixed_precision(self) -> bool:
        return self.param_bytes != 4

    @property
    def sharded_numel(self) -> int:
        return self.numel if self.stage == 0 else self.numel // self.world_size


def _coefficients(layout: StateLayout) -> dict[str, tuple[int, bool]]:
    """Bytes per parameter of each category, and whether it is divided by N."""
    b, stage = layout.param_bytes, layout.stage
    optimizer = {"adam": 8, "sgd": 4 if layout.sgd_momentum else 0}[layout.optimizer]
    # In fp32 training the master is the parameter's own shard (nothing extra), unless the
    # optimizer is offloaded: then the host keeps an fp32 copy of its own.
    master = 4 if layout.mixed_precision or layout.offload_optimizer != "none" else 0
    return {
        "param": (b, stage >= 3),
        "gradient": (b, stage >= 2),
        "fp32_master": (master, stage >= 1),
        "optimizer_state": (optimizer, stage >= 1),
    }


def category_location(layout: StateLayout, category: str) -> str:
    """Where a model-state category lives: "device", "host" or "nvme" (when offloaded)."""
    if category in ("fp32_master", "optimizer_state") and layout.offload_optimizer != "none":
        return "host" if layout.offload_optimizer == "cpu" else "nvme"
    if category == "param" and layout.offload_param:
        return "host"
    return "device"


def expected_model_state_bytes(layout: StateLayout) -> dict[str, dict]:
    """Per category: the bytes this rank should own and the formula that gives them."""
    rows = {}
    for name, (coefficient, sharded) in _coefficients(layout).items():
        numel = layout.sharded_numel if sharded else layout.numel
        formula = f"{coefficient}Ψ/N" if sharded and coefficient else f"{coefficient}Ψ"
        if coefficient and category_location(layout, name) != "device":
            formula += f" ({category_location(layout, name)})"
        rows[name] = {"bytes": coefficient * numel, "formula": formula if coefficient else "0",
                      "location": category_location(layout, name)}
    return rows


def total_formula(layout: StateLayout) -> str:
    """The model-state total in the paper's notation, e.g. '2Ψ + 14Ψ/N'."""
    coefficients = _coefficients(layout).values()
    full = sum(c for c, sharded in coefficients if not sharded)
    divided = sum(c for c, sharded in coefficients if sharded)
    parts = ([f"{full}Ψ"] if full else []) + ([f"{divided}Ψ/N"] if divided else [])
    return " + ".join(parts) or "0"


def process_memory() -> dict[str, int]:
    """Process-level numbers the registry cannot see: RSS on CPU, allocator peaks on GPU."""
    out = {"rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            out["rss_bytes"] = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return out


def build_report(registry, layouts: list[StateLayout], rank: int, step: int,
                 comm_stats: dict) -> dict:
    """The per-rank memory report: measured current/peak per category beside the formula
    (summed over the engine's layouts: stage 3 has its persistent parameters as a second)."""
    categories = {}
    for row in registry.records():
        entry = categories.setdefault(row["category"], {"current": 0, "peak": 0, "by_location": {}})
        entry["current"] += row["current"]
        entry["peak"] = registry.category_usage(row["category"])["peak"]
        entry["by_location"][row["location"]] = {"current": row["current"], "peak": row["peak"]}
    expected_total = 0
    expected_by_location = {"device": 0, "host": 0, "nvme": 0}
    for layout in layouts:
        label = "persistent " if layout.persistent else ""
        for name, row in expected_model_state_bytes(layout).items():
            entry = categories.setdefault(name, {"current": 0, "peak": 0, "by_location": {}})
            entry["expected"] = entry.get("expected", 0) + row["bytes"]
            formula = f"{label}{row['formula']}"
            entry["formula"] = f"{entry['formula']} + {formula}" if "formula" in entry else formula
            expected_total += row["bytes"]
            expected_by_location[row["location"]] += row["bytes"]
    model_state = sum(categories[name]["current"] for name in _coefficients(layouts[0]))
    measured_by_location = {"device": 0, "host": 0, "nvme": 0}
    for name in _coefficients(layouts[0]):
        for location, usage in categories[name]["by_location"].items():
            where = location if location in ("device", "nvme") else "host"
            measured_by_location[where] += usage["current"]
    main = next((layout for layout in layouts if not layout.persistent), layouts[0])
    formula = " + ".join(("persistent: " if layout.persistent else "") + total_formula(layout)
                         for layout in layouts)
    return {
        "rank": rank,
        "step": step,
        "stage": main.stage,
        "world_size": main.world_size,
        "numel": sum(layout.numel for layout in layouts if not layout.persistent),
        "persistent_numel": sum(layout.numel for layout in layouts if layout.persistent),
        "param_bytes": main.param_bytes,
        "categories": categories,
        "model_state_bytes": model_state,
        "model_state_expected_bytes": expected_total,
        "model_state_formula": formula,
        # model states by where they live (device, host: pinned or pageable, nvme), measured
        # and as the formulas place them
        "model_state_by_location": {"measured": measured_by_location,
                                    "expected": expected_by_location},
        "total": registry.total(),
        "process": process_memory(),
        "comm": comm_stats,
    }


def format_report(report: dict) -> str:
    """A table for humans: one line per category, bytes in MiB (labelled MiB)."""
    mib = 1024 * 1024
    lines = [f"[rank {report['rank']}] memory after step {report['step']} "
             f"(stage {report['stage']}, N={report['world_size']}, Ψ={report['numel']:,}):",
             f"  {'category':<16}{'current MiB':>12}{'peak MiB':>12}{'formula MiB':>13}  formula"]
    for name, entry in sorted(report["categories"].items()):
        expected = entry.get("expected")
        expected_text = f"{expected / mib:>13.3f}" if expected is not None else f"{'-':>13}"
        lines.append(f"  {name:<16}{entry['current'] / mib:>12.3f}{entry['peak'] / mib:>12.3f}"
                     f"{expected_text}  {entry.get('formula', '')}")
    lines.append(f"  model states: {report['model_state_bytes'] / mib:.3f} MiB measured, "
                 f"{report['model_state_expected_bytes'] / mib:.3f} MiB by "
                 f"{report['model_state_formula']}; engine total peak "
                 f"{report['total']['peak'] / mib:.3f} MiB; "
                 f"RSS peak {report['process']['rss_peak_bytes'] / mib:.1f} MiB")
    return "\n".join(lines)
