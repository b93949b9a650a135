"""One memory category's row (bytes, formula, where they live) and the rules for where the
model states live: the gradient shard, the fp32 master, a partial optimizer offload."""
from __future__ import annotations

from typing import Sequence

from .options import Option
from .training_setup import Setup

CATEGORIES = ("param", "gradient", "fp32_master", "optimizer_state", "bucket", "gathered_param",
              "staging")
LOCATIONS = ("device", "host", "nvme")
WHERE = {"none": "device", "cpu": "host", "nvme": "nvme"}  # offload device -> location


def category_row(value: int, formula: str, location: str = "device") -> dict:
    """A category's row, all of it at one location."""
    return {"bytes": value, "formula": formula if value else "0", "location": location,
            "by_location": {location: value}}


def kind_symbol(kind: str | None) -> str:
    """optimizer_state's formula symbol of a group kind's elements (ModelShapes.group_kinds;
    None: every group's, Ψ)."""
    return {"muon": "Ψm", "adam": "Ψa"}.get(kind, "Ψ")


def merged_row(rows: Sequence[dict]) -> dict:
    """One row of several (the optimizer's arrays of each group kind): their bytes added per
    location, their formulas joined."""
    located: dict = {}
    for row in rows:
        for where, value in by_location(row).items():
            located[where] = located.get(where, 0) + value
    total = sum(located.values())
    formula = " + ".join(row["formula"] for row in rows if row["bytes"]) or "0"
    out = {"bytes": total, "formula": formula,
           "location": max(located, key=lambda where: located[where]), "by_location": located}
    if any("persistent_bytes" in row for row in rows):
        out["persistent_bytes"] = sum(row.get("persistent_bytes", 0) for row in rows)
    return out


def by_location(row: dict) -> dict:
    """A row's bytes per location (a row split over locations says so; others are at one)."""
    return row.get("by_location") or {row["location"]: row["bytes"]}


def term(coefficient: int, sharded: bool, symbol: str = "Ψ") -> str:
    """A formula term in the paper's notation: '12Ψ/N', '2Ψ', '4Ψp/N' ('0' for none)."""
    if not coefficient:
        return "0"
    return f"{coefficient}{symbol}/N" if sharded else f"{coefficient}{symbol}"


def gradient_location(setup: Setup, option: Option) -> str:
    """Where the gradient shard lives (csrc grads_offloaded): with the whole optimizer step
    offloaded (ratio 1) at stages 2-3 the shard is reduced straight into host memory
    (ZeRO-Offload); at stage 3 only the partitioned group's, the persistent parameters are a
    stage-1 group whose whole gradients stay on the device. A partial offload keeps it on
    the device, where the head's step runs, and so does offload_optimizer.grads_on_device."""
    offloaded = option.offload_optimizer != "none" and float(setup.offload_ratio) >= 1.0 \
        and not setup.grads_on_device
    return "host" if option.stage >= 2 and offloaded else "device"


def bucket_pieces(setup: Setup, option: Option) -> bool:
    """Whether a sharded-gradient bucket (csrc GradReducer, stages 1-3) has a 1/N piece beside
    its unit. Not when the reduced 1/N goes straight into the gradient shard: every reduction
    is its window's first (gradient_accumulation_steps 1), plain (stage 3: no qgZ, and no
    MiCS, whose piece is averaged over the replicas first), in the gradients' dtype (not
    another communication_data_type) and on the shard's device (a GPU model's host shard
    takes it through a piece)."""
    host_shard = gradient_location(setup, option) == "host" and not setup.cpu_only
    stage3_extra = option.stage == 3 and (
        setup.quantized_gradients or setup.partition_world < setup.world_size)
    return (setup.gradient_accumulation_steps > 1 or host_shard or stage3_extra
            or setup.comm_converts)


def master_bytes(setup: Setup, option: Option) -> int:
    """4 in mixed precision; where the master has the parameters' dtype (fp32, or a 16-bit
    master) the parameter shard is the master, unless the optimizer is offloaded (the host or
    NVMe keeps a master of its own) or external (it steps one fp32 tensor)."""
    separate = (setup.master_dtype_bytes != setup.param_bytes
                or option.offload_optimizer != "none" or setup.optimizer == "external")
    return setup.master_dtype_bytes if separate else 0


def split_partial(categories: dict, setup: Setup, option: Option,
                  group_shards: Sequence[int]) -> None:
    """offload_optimizer.ratio < 1: of every group's shard only the tail (llround(ratio x
    shard) elements) keeps its master and optimizer state on the host / NVMe; the head keeps
    them on the device (an fp32 master too: the parameters and master are separate wherever
    the step runs)."""
    if option.offload_optimizer == "none" or float(setup.offload_ratio) == 1.0:
        return
    total = sum(int(shard) for shard in group_shards)
    tail = sum(setup.offloaded_numel(shard) for shard in group_shards)
    where = WHERE[option.offload_optimizer]
    ratio = f"{setup.offload_ratio:g}"
    rest = f"{1 - float(setup.offload_ratio):g}"
    for name in ("fp32_master", "optimizer_state"):
        row = categories[name]
        if not row["bytes"] or not total:
            continue
        per_element = row["bytes"] // total  # 4 (master), 8 / 4 (Adam / momentum); 16-bit: half
        offloaded = per_element * tail
        formula = row["formula"]
        row["by_location"] = {k: v for k, v in ((where, offloaded),
                                                ("device", row["bytes"] - offloaded)) if v}
        row["formula_by_location"] = {where: f"{ratio}·({formula})",
                                      "device": f"{rest}·({formula})"}
        row["location"] = max(row["by_location"], key=lambda k: row["by_location"][k])
        row["formula"] = f"{where}: {ratio}·({formula}); device: {rest}·({formula})"
