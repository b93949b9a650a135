"""The estimate as text: what was estimated, a table of bytes per category, a table of the
formulas per location and per node."""
from __future__ import annotations

import re

from offload import OFFLOAD_TILE

from .categories import CATEGORIES, by_location
from .result import Estimate
from .shapes import ModelShapes
from .sizes import format_bytes
from .traffic import stage3_traffic
from .training_setup import Setup

_SYMBOLS = ("Ψ", "Ψ/N", "Ψp", "Ψp/N")

_EXACTNESS = ("Built options are exact: each model-state category (on the device, the host "
              "and NVMe), the buckets and the host staging equal the engine's measured "
              "`current` bytes; stage 3's gathered_param (and, with offload_param, the device "
              "staging) is the peak of the gather schedule replayed on the units (every unit "
              "once per forward, in definition order). Not included (activations only with --sample-input): "
              "autograd's transient gradients, optimizer-step temporaries, framework and "
              "allocator overhead.")


def format_estimates(shapes: ModelShapes, setup: Setup, estimates: list[Estimate],
                     selected_stage: int | None = None) -> str:
    """The estimate as tables: per-rank bytes by category, then per node."""
    lines = [*_setup_lines(shapes, setup), *_layout_lines(setup, estimates),
             *_offload_lines(setup, estimates), "",
             *_bytes_table(setup, estimates, selected_stage), "",
             *_formula_table(setup, estimates), "",
             _EXACTNESS]
    return "\n".join(lines)


def _setup_lines(shapes: ModelShapes, setup: Setup) -> list[str]:
    """The model and the set-up the estimate is for."""
    lines = [
        f"model: {shapes.description}: {shapes.trainable_numel:,} trainable parameters in "
        f"{shapes.tensor_count:,} tensors" + (
            f", {shapes.frozen_numel:,} frozen (stage 3 partitions them with their units, "
            "keeping no gradients or optimizer state; below stage 3 they stay the model's, "
            "not counted)" if shapes.frozen_numel else ""),
        f"setup: {setup.world_size} rank(s) = {setup.num_nodes} node(s) x "
        f"{setup.ranks_per_node}, {setup.precision} (b = {setup.param_bytes}), "
        f"{setup.optimizer}, reduce_bucket_size {setup.reduce_bucket_size:,}, overlap_comm "
        + ("default (stage 3 only)" if setup.overlap_comm is None else str(setup.overlap_comm)),
        f"stage 3: persistence threshold {setup.persistence_threshold:,}, prefetch "
        f"{setup.prefetch_bucket_size:,}, max live {setup.max_live_parameters:,}, max reuse "
        f"distance {setup.max_reuse_distance:,}, {setup.max_inflight_gathers} gather(s) in flight"
        + "".join(f", {key} {value:,}" for key, value in setup.stage3_dict().items()
                  if key in ("stage3_model_persistence_threshold",
                             "stage3_module_granularity_threshold")),
    ]
    if shapes.note:
        lines.append(f"note: {shapes.note}")
    return lines


def _layout_lines(setup: Setup, estimates: list[Estimate]) -> list[str]:
    """The padded numbers: Ψ, Ψ/N and U of stages 0-2; stage 3's units, Ψp and working set."""
    first = estimates[0]
    sharded = next((e for e in estimates if e.option.stage >= 1), first)
    lines = [f"padded: Ψ = {first.numel:,} (stage 0), {sharded.numel:,} (stages 1-2, "
             f"Ψ/N = {sharded.shard_numel:,}); largest unit U = {sharded.max_unit_numel:,} "
             f"elements in {sharded.unit_count} unit(s)"]
    stage3 = next((e for e in estimates if e.option.stage == 3 and e.stage3 is not None), None)
    if stage3 is not None:
        work = stage3.stage3["working_set"]
        lines.append(
            f"stage 3: Ψ = {stage3.numel:,} partitioned (Ψ/N = {stage3.shard_numel:,}) in "
            f"{stage3.unit_count} gather unit(s), largest U = {stage3.max_unit_numel:,}; "
            f"Ψp = {stage3.persistent_numel:,} persistent ({stage3.stage3['persistent_tensors']} "
            f"tensor(s) of at most {setup.persistence_threshold:,} elements, whole on every "
            f"rank: {format_bytes(stage3.persistent_bytes)}); working set W = "
            f"{work['peak_numel']:,} ({work['live_at_peak_text']}), "
            f"{work['gathers_per_micro_step']} all-gather(s) per micro-step")
        traffic = stage3_traffic(stage3, setup, gas=1)
        lines.append(f"stage 3 sends per rank per micro-step: {format_bytes(traffic.cross_node)} "
                     f"across nodes, {format_bytes(traffic.in_node)} within a node"
                     f"{_layout_names(setup)}")
        if stage3.stage3["error"]:
            lines.append(f"stage 3 does not run as configured: {stage3.stage3['error']}")
    return lines


def _layout_names(setup: Setup) -> str:
    """' (qwZ, MiCS S=2)': the stage-3 layouts the setup uses, or ''."""
    names = [name for name, on in (("qwZ", setup.quantized_weights),
                                   ("qgZ", setup.quantized_gradients)) if on]
    if setup.hpz_world:
        names.append(f"hpZ H={setup.hpz_world}")
    if setup.partition_world < setup.world_size:
        names.append(f"MiCS S={setup.partition_world}")
    return f" ({', '.join(names)})" if names else ""


def _offload_lines(setup: Setup, estimates: list[Estimate]) -> list[str]:
    """How the offloaded step streams its chunks; where parameters on NVMe go."""
    lines = []
    if any(e.option.offload_optimizer != "none" for e in estimates):
        lines.append(f"offload: the step streams chunks of C = min(sub_group_size "
                     f"{setup.sub_group_size:,}, {OFFLOAD_TILE:,}, the group's Ψ/N) elements "
                     "through 2 host staging slots per engine group; an offloaded optimizer keeps "
                     + ("a bf16/fp16 master of its own (bf16/fp16_master_weights_and_grads)"
                        if setup.sixteen_bit_master else "an fp32 master (fp32 training too)"))
    on_nvme = next((e for e in estimates if e.option.offload_param == "nvme"), None)
    if on_nvme is not None:
        lines.append(_params_on_nvme_line(on_nvme))
    return lines


def _params_on_nvme_line(est: Estimate) -> str:
    """offload_param nvme in one line: what stays in host memory, what the buffers hold, or
    why the engine refuses it."""
    setup, params = est.setup, est.offload["param_nvme"]
    if params["error"]:
        return f"params on NVMe do not run as configured: {params['error']}"
    kept = (f"{params['host_numel']:,} shard elements of the first units in host memory "
            f"(max_in_cpu {setup.param_max_in_cpu:,}), " if params["host_numel"] else "")
    largest = ", ".join(f"{v:,}" for v in params["largest_nvme_unit_shards"]) or "-"
    return (f"params on NVMe: {kept}{params['nvme_numel']:,} in a swap file; the host holds "
            f"buffer_count = {setup.param_buffer_count} buffers of the largest NVMe unit's shard "
            f"(V = {largest} elements, whole 4 KiB pages) per partitioned group; every gather "
            "reads its unit through them")


def _bytes_table(setup: Setup, estimates: list[Estimate], selected_stage: int | None
                 ) -> list[str]:
    """Per rank and option: every category's bytes and the total at each location; the
    configured option marked with '*'."""
    names = list(CATEGORIES)
    headers = ["per rank", *names, "device", "host (offload)", "NVMe"]
    selected = None
    if selected_stage is not None:
        selected = (selected_stage, setup.offload_optimizer, setup.offload_param)
    rows = []
    for est in estimates:
        option = est.option
        mark = "*" if (option.stage, option.offload_optimizer, option.offload_param) == selected \
            else " "
        cells = [_cell(est.categories[name]) for name in names]
        rows.append([f"{mark}{est.name}", *cells, format_bytes(est.device_bytes),
                     format_bytes(est.host_bytes), format_bytes(est.nvme_bytes)])
    return _table(headers, rows)


def _formula_table(setup: Setup, estimates: list[Estimate]) -> list[str]:
    """Per option: the formula at each location, the bytes per node, the status; then what
    the symbols mean."""
    per_node = setup.ranks_per_node
    headers = ["formula per rank", "on the device", "on the host", "on NVMe",
               f"devices/node (x{per_node})", f"host RAM/node (x{per_node})",
               f"NVMe/node (x{per_node})", "status"]
    rows = [[est.name, location_formula(est, "device"), location_formula(est, "host"),
             location_formula(est, "nvme"), format_bytes(est.device_bytes * per_node),
             format_bytes(est.host_bytes * per_node), format_bytes(est.nvme_bytes * per_node),
             est.status if est.runs else "does not run (below)"] for est in estimates]
    refusals = [f"{est.name} does not run: {est.error}" for est in estimates if not est.runs]
    return [*_table(headers, rows, left={0, 1, 2, 3, 7}),
            f"(Ψ padded parameter count (stage 3: partitioned), Ψp stage 3's persistent "
            f"parameters, Ψf its partitioned frozen ones, N = {setup.world_size} ranks, U = "
            f"largest unit in elements, W = most elements gathered at once, C = offload chunk, "
            f"P = shard elements whose all-gather is in flight at once, b = {setup.param_bytes})",
            *refusals]


def _cell(row: dict) -> str:
    """Bytes of one category, marked with where they are when not (only) on the device:
    '27.781 KiB (host) + 896 B'."""
    parts = []
    for where, value in sorted(by_location(row).items(), key=lambda item: item[0] == "device"):
        if not value:
            continue
        parts.append(format_bytes(value) + ("" if where == "device" else f" ({where})"))
    return " + ".join(parts) or "0"


def location_formula(est: Estimate, location: str) -> str:
    """The bytes at one location in the paper's notation, e.g. '2Ψ + 14Ψ/N + 1·(U + U/N)·2'
    (stage 3: '16Ψ/N + 8Ψp + 8Ψp/N + 2·(U + U/N)·2 + W·2'; offload to the host:
    '14Ψ/N + 2·C·(2+2)')."""
    coefficients = dict.fromkeys(_SYMBOLS, 0)
    extra = []
    for name in CATEGORIES:
        row = est.categories[name]
        if not by_location(row).get(location):
            continue
        formula = row.get("formula_by_location", {row["location"]: row["formula"]}).get(location)
        if formula is None:  # one formula for a split row: the location's bytes, labelled
            extra.append(f"{name} {format_bytes(by_location(row)[location])}")
            continue
        for term in formula.split(" (")[0].split(" + "):
            match = re.fullmatch(r"(\d+)(Ψp/N|Ψp|Ψ/N|Ψ)", term)
            if match:
                coefficients[match.group(2)] += int(match.group(1))
            elif term != "0":
                extra.append(term)
    parts = [f"{c}{symbol}" for symbol, c in coefficients.items() if c] + extra
    return " + ".join(parts) or "0"


def _table(headers: list[str], rows: list[list[str]], left=frozenset({0})) -> list[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]
