"""A memory report as text: one table, whoever prints it.

`format_report(report)` is a rank's table (the end of a run, `engine.print_memory_report()`);
`format_table([(label, report), ...])` is the same table over the ranks of a run, one block
per rank (`zero-mem report --table`); `format_report_line(report)` is the one-line form for a
training log. Per category: the current bytes at each location (device, host pinned, host
pageable, NVMe), current and peak, the ZeRO formula's bytes; then the model states against the
formula, every location's current and peak, and what the process holds (the CUDA allocator on
a GPU, the RSS). MiB, or GiB from 1 GiB up (labelled).
"""
from __future__ import annotations

from ..memory import CATEGORY_ORDER, LOCATIONS, MODEL_STATES, location_totals
from .estimate.sizes import GiB, MiB

LOCATION_TEXT = {"device": "device", "host_pinned": "host pinned",
                 "host_pageable": "host pageable", "nvme": "NVMe"}
_LEFT_ALIGNED = ("rank", "category", "formula", "check")


def unit(values) -> tuple[int, str]:
    return (GiB, "GiB") if max(values, default=0) >= GiB else (MiB, "MiB")


def size(value: int) -> str:
    scale, name = unit([value])
    return f"{value / scale:.3f} {name}" if value else "0"


def ordered_categories(reports: list[dict]) -> list[str]:
    names = {name for report in reports for name in report["categories"]}
    return [n for n in CATEGORY_ORDER if n in names] + sorted(names - set(CATEGORY_ORDER))


def format_report(report: dict) -> str:
    """A rank's table, under a title naming the step, stage, N, Ψ and the offload."""
    persistent = report.get("persistent_numel")
    title = (f"[rank {report['rank']}] memory after step {report['step']} (stage "
             f"{report['stage']}, N={report['world_size']}, Ψ={report['numel']:,}"
             + (f", Ψp={persistent:,} persistent" if persistent else "")
             + f", {report['param_bytes']}-byte params{offload_text(report)})")
    if report.get("mesh"):
        title += f"\n{mesh_text(report['mesh'])}"
    number, name = _number_format([report])
    rows = _rank_rows([], report, ordered_categories([report]), number)
    lines = [_table_text(title, _headers([], name), rows, blocks=False)]
    lines.extend(_notes(report))
    return "\n".join(lines)


def format_table(labelled: list[tuple[str, dict]]) -> str:
    """Per rank (its label, its last report), the rank's table; one title for the run."""
    reports = [report for _, report in labelled]
    number, name = _number_format(reports)
    names = ordered_categories(reports)
    rows = []
    for label, report in labelled:
        mesh = report.get("mesh")
        place = f" (stage {mesh['stage']}, tensor {mesh['tensor_rank']})" if mesh else ""
        rows.extend(_rank_rows([label + place, str(report["step"])], report, names, number))
    first = reports[0]
    title = (f"memory report: stage {first['stage']}, N = {first['world_size']}, "
             + _psi_text(reports) + f", {first['param_bytes']}-byte parameters"
             + offload_text(first) + " (last report of each rank)")
    return _table_text(title, _headers(["rank", "step"], name), rows, blocks=True)


def format_report_line(report: dict) -> str:
    """One line per rank for a training log: model states measured against the formula, then
    every location's current and peak bytes."""
    measured = report["model_state_bytes"]
    verdict = "= formula" if measured == report["model_state_expected_bytes"] else \
        f"formula {size(report['model_state_expected_bytes'])}"
    used = [(loc, usage) for loc, usage in location_totals(report).items()
            if usage.get("current") or usage.get("peak") or loc == "device"]
    where = ", ".join(f"{LOCATION_TEXT.get(loc, loc)} {size(usage.get('current') or 0)} "
                      f"(peak {size(usage.get('peak') or 0)})" for loc, usage in used)
    place = f" ({mesh_text(report['mesh'], short=True)})" if report.get("mesh") else ""
    return (f"[zero] step {report['step']} rank {report['rank']}{place}: model states "
            f"{size(measured)} ({verdict}); {where}")


def mesh_text(mesh: dict, short: bool = False) -> str:
    """Where a rank sits in a pipe x data x tensor mesh, and what its numbers cover."""
    place = (f"pipeline stage {mesh['stage']}/{mesh['pipe']}, data rank "
             f"{mesh['data_rank']}/{mesh['data']}, tensor rank {mesh['tensor_rank']}/"
             f"{mesh['tensor']}")
    if short:
        return place
    return (f"mesh: {place}; this rank's part (its stage's layers"
            + (", split layers cut to its tensor slice" if mesh["tensor"] > 1 else "")
            + f") sharded over N = {mesh['data']} data-parallel ranks")


def offload_text(report: dict) -> str:
    offload = report.get("offload") or {}
    parts = []
    if offload.get("optimizer", "none") != "none":
        parts.append(f"optimizer on {'the host' if offload['optimizer'] == 'cpu' else 'NVMe'}")
    if offload.get("param", "none") != "none":
        parts.append(f"parameters on {'the host' if offload['param'] == 'cpu' else 'NVMe'}")
    return (", offload: " + " + ".join(parts)) if parts else ""


def _number_format(reports: list[dict]):
    """One unit for every number of the table, chosen by the engine's largest peak (the
    process rows may then be thousands of MiB; the engine's small categories stay readable)."""
    scale, name = unit([report["total"]["peak"] for report in reports])

    def number(value) -> str:
        return "-" if value is None else "0" if value == 0 else f"{value / scale:.3f}"
    return number, name


def _headers(head: list[str], name: str) -> list[str]:
    return [*head, "category", *(f"{LOCATION_TEXT[loc]} {name}" for loc in LOCATIONS),
            f"current {name}", f"peak {name}", f"formula {name}", "formula", "check"]


def _rank_rows(head: list[str], report: dict, names: list[str], number) -> list[list[str]]:
    return [*_category_rows(head, report, names, number),
            _model_states_row(head, report, number),
            *_engine_rows(head, report, number),
            *_process_rows(head, report, number)]


def _psi_text(reports: list[dict]) -> str:
    """Ψ of the model, or with pipeline stages / tensor slices of each part (its ranks hold
    only it; N is then its data-parallel ranks)."""
    mesh = reports[0].get("mesh")
    if not mesh:
        return f"Ψ = {reports[0]['numel']:,}"
    parts = {(r["mesh"]["stage"], r["mesh"]["tensor_rank"]): r["numel"]
             for r in reports if r.get("mesh")}
    listed = ", ".join(f"stage {stage} tensor {tensor}: {numel:,}"
                       for (stage, tensor), numel in sorted(parts.items()))
    return (f"mesh pipe {mesh['pipe']} x data {mesh['data']} x tensor {mesh['tensor']}, "
            f"Ψ per part ({listed})")


def _category_rows(head: list[str], report: dict, names: list[str], number) -> list[list[str]]:
    """One row per category: current bytes at each location, current, peak, the formula's."""
    rows = []
    for name in names:
        entry = report["categories"].get(name, {"current": 0, "peak": 0})
        at = entry.get("by_location", {})
        expected = entry.get("expected")
        # model states at their most (stage 2 and 3 gradient shards are given back between steps)
        check = "" if expected is None else ("= formula" if expected == entry["peak"]
                                             else "differs")
        rows.append([*head, name, *(number(at[loc]["current"]) if loc in at else "-"
                                    for loc in LOCATIONS),
                     number(entry["current"]), number(entry["peak"]), number(expected),
                     entry.get("formula", ""), check])
    return rows


def _model_states_row(head: list[str], report: dict, number) -> list[str]:
    """param + gradient + fp32_master + optimizer_state: now at each location and in all, at
    their most (each category's peak: stages 2 and 3 give the gradient shard back between
    steps) against the formula (and, when the report has it, the formula's split over the
    locations)."""
    by_location = report.get("model_state_by_location")
    measured = (by_location or {}).get("measured", {})
    states = {loc: 0 for loc in LOCATIONS}
    for name in MODEL_STATES:
        for loc, usage in report["categories"].get(name, {}).get("by_location", {}).items():
            states[loc] = states.get(loc, 0) + usage["current"]
    current = sum(report["categories"].get(name, {}).get("current", 0) for name in MODEL_STATES)
    return [*head, "model states", *(number(states[loc]) for loc in LOCATIONS),
            number(current), number(report["model_state_bytes"]),
            number(report["model_state_expected_bytes"]),
            report.get("model_state_formula", ""),
            "= formula" if report["model_state_bytes"] ==
            report["model_state_expected_bytes"] and
            (not by_location or measured == by_location["expected"]) else "differs"]


def _engine_rows(head: list[str], report: dict, number) -> list[list[str]]:
    """Everything the engine accounts for: now at each location, and each location's peak."""
    totals = location_totals(report)
    return [[*head, "engine total", *(number(totals.get(loc, {}).get("current"))
                                      for loc in LOCATIONS),
             number(report["total"]["current"]), number(report["total"]["peak"]), "", "", ""],
            [*head, "engine peak", *(number(totals.get(loc, {}).get("peak"))
                                     for loc in LOCATIONS), "",
             number(report["total"]["peak"]), "", "(peak of each sum)", ""]]


def _process_rows(head: list[str], report: dict, number) -> list[list[str]]:
    """What the process holds beyond the engine: the CUDA allocator's bytes, the RSS."""
    process = report.get("process", {})
    rows = []
    if "cuda_allocated_bytes" in process:
        rows.append([*head, "CUDA allocated", number(process["cuda_allocated_bytes"]), "",
                     "", "", number(process["cuda_allocated_bytes"]),
                     number(process["cuda_max_allocated_bytes"]), "", "",
                     "(allocator)"])
        if "cuda_reserved_bytes" in process:
            rows.append([*head, "CUDA reserved", number(process["cuda_reserved_bytes"]),
                         "", "", "", number(process["cuda_reserved_bytes"]),
                         number(process["cuda_max_reserved_bytes"]), "", "",
                         "(allocator)"])
    if "rss_peak_bytes" in process:
        # ru_maxrss is read before statm, so the current RSS can exceed it by a page or so.
        current = process.get("rss_bytes", 0)
        rows.append([*head, "process RSS", "", "", "", "", number(current),
                     number(max(current, process["rss_peak_bytes"])), "", "",
                     "(whole process)"])
    return rows


def _notes(report: dict) -> list[str]:
    """What the rows cannot say: where the model states differ from the formula's split over
    the locations, the allocator's device and its bytes outside zero's accounting, the
    activations the last forward kept."""
    notes = []
    by_location = report.get("model_state_by_location")
    if by_location and by_location["measured"] != by_location["expected"]:
        notes.append("model states by location (peak): " + ", ".join(
            f"{LOCATION_TEXT.get(loc, loc)} {size(by_location['measured'].get(loc, 0))} "
            f"(formula {size(expected)})" for loc, expected in by_location["expected"].items()))
    process = report.get("process", {})
    if "cuda_allocated_bytes" in process:
        outside = process.get("cuda_outside_zero_bytes")
        notes.append(f"CUDA allocated (cuda:{process.get('cuda_device', '?')}): " + (
            "the engine's device bytes are part of it" if outside is None else
            f"{size(outside)} of it outside zero's accounting (activations, cuBLAS "
            "workspaces, the script's own tensors)"))
    if report.get("activations_bytes") is not None:
        notes.append(f"activations: {size(report['activations_bytes'])} kept for backward by "
                     "the last forward (measured; activation checkpointing keeps less)")
    return notes


def _table_text(title: str, headers: list[str], rows: list[list[str]], blocks: bool) -> str:
    """The title and the aligned table; with `blocks`, a blank line between ranks."""
    widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
    left = {i for i, header in enumerate(headers) if header in _LEFT_ALIGNED}

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [title, line(headers), line(["-" * w for w in widths])]
    previous = None
    for row in rows:
        if blocks and previous is not None and row[0] != previous:
            out.append("")
        previous = row[0]
        out.append(line(row))
    return "\n".join(out)
