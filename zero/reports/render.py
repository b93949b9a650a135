"""Read the engine's memory-report JSON lines (`memory_report: {"path": ..., "every_n_steps":
n}` makes rank r append one line per n steps to `<root>.rank<r>.jsonl`;
`engine.final_memory_report()` appends one more, marked "final") and show them: a table per
rank and category (bytes at each location: device, host pinned, host pageable, NVMe; current,
peak, the formula's expected bytes), and a PNG timeline of memory by category, one row per
rank and one column per location.

A file that several runs appended to holds several runs; a new run starts where the step
does not increase or the layout (stage, world size, Ψ, dtype) changes (a final report of the
run's last step replaces that report). The last run is shown unless another is asked for.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field

from ..memory import LOCATIONS, location_totals
from .estimate import GiB, MiB

# the registry's locations, in the order shown, and how they are labelled
LOCATION_TEXT = {"device": "device", "host_pinned": "host pinned",
                 "host_pageable": "host pageable", "nvme": "NVMe"}

CATEGORY_ORDER = ("param", "gradient", "fp32_master", "optimizer_state", "bucket",
                  "gathered_param", "staging", "other")
MODEL_STATES = CATEGORY_ORDER[:4]
_RANK_FILE = re.compile(r"^(?P<root>.*)\.rank(?P<rank>\d+)(?P<ext>\.[^.]*)?$")


class ReportError(ValueError):
    """No usable report lines, or a bad path / option."""


@dataclass
class Series:
    """The reports of one rank of one run, in step order."""
    label: str
    rank: int
    source: str
    reports: list[dict]
    runs_in_file: int = 1

    @property
    def last(self) -> dict:
        return self.reports[-1]


@dataclass
class Loaded:
    series: list[Series]
    warnings: list[str] = field(default_factory=list)


def _files(paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "*.rank*.jsonl")))
            if not found:
                found = sorted(glob.glob(os.path.join(path, "*.jsonl")))
            if not found:
                raise ReportError(f"{path}: no *.rank<r>.jsonl memory reports in this folder")
            out.extend(found)
        elif os.path.isfile(path):
            out.append(path)
        else:
            raise ReportError(f"{path}: no such file or folder")
    return list(dict.fromkeys(out))


def _layout_key(report: dict) -> tuple:
    return (report.get("stage"), report.get("world_size"), report.get("numel"),
            report.get("param_bytes"))


def split_runs(reports: list[dict]) -> list[list[dict]]:
    """Consecutive reports with increasing steps and one layout are one run. A final report
    (`engine.final_memory_report()`, marked "final") of the step the run's last report has
    replaces that report: it is the same step, measured later."""
    runs: list[list[dict]] = []
    for report in reports:
        same_layout = runs and _layout_key(report) == _layout_key(runs[-1][-1])
        step, last = report.get("step", 0), runs[-1][-1].get("step", 0) if runs else None
        if same_layout and step > last:
            runs[-1].append(report)
        elif same_layout and step == last and report.get("final") and \
                not runs[-1][-1].get("final"):
            runs[-1][-1] = report
        else:
            runs.append([report])
    return runs


def load(paths: list[str], run: int = -1, ranks: list[int] | None = None) -> Loaded:
    """Every rank file under `paths` (files or folders); run -1 = the last run of each file."""
    loaded = Loaded(series=[])
    per_file = []
    for path in _files(paths):
        reports = []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError:
                    loaded.warnings.append(f"{path}:{number}: not JSON (a line cut short by a "
                                           "crash?); skipped")
                    continue
                if not isinstance(value, dict) or "categories" not in value:
                    loaded.warnings.append(f"{path}:{number}: not a memory report; skipped")
                    continue
                reports.append(value)
        if not reports:
            loaded.warnings.append(f"{path}: no memory reports")
            continue
        runs = split_runs(reports)
        try:
            chosen = runs[run]
        except IndexError:
            raise ReportError(f"{path} holds {len(runs)} run(s); --run {run} is not one of "
                              f"them") from None
        match = _RANK_FILE.match(os.path.basename(path))
        root = match.group("root") if match else os.path.splitext(os.path.basename(path))[0]
        rank = int(chosen[-1].get("rank", match.group("rank") if match else 0))
        per_file.append((os.path.join(os.path.dirname(path), root), rank, path, chosen, len(runs)))
    if not per_file:
        raise ReportError("no memory reports found in " + ", ".join(paths))
    roots = {root for root, *_ in per_file}
    for root, rank, path, chosen, run_count in sorted(per_file, key=lambda x: (x[0], x[1])):
        if ranks is not None and rank not in ranks:
            continue
        label = f"rank {rank}" if len(roots) == 1 else f"{os.path.basename(root)} rank {rank}"
        loaded.series.append(Series(label, rank, path, chosen, run_count))
        if run_count > 1:
            loaded.warnings.append(f"{path}: {run_count} runs appended to one file; showing run "
                                   f"{run if run >= 0 else run_count + run} (0-based; --run "
                                   "picks another)")
    if not loaded.series:
        raise ReportError(f"no reports for ranks {ranks}")
    return loaded


def ordered_categories(series: list[Series]) -> list[str]:
    names = set()
    for s in series:
        for report in s.reports:
            names.update(report["categories"])
    return [n for n in CATEGORY_ORDER if n in names] + sorted(names - set(CATEGORY_ORDER))


def _unit(values) -> tuple[float, str]:
    return (GiB, "GiB") if max(values, default=0) >= GiB else (MiB, "MiB")


def used_locations(series: list[Series]) -> list[str]:
    """The locations that held bytes in any report (the device always)."""
    used = {"device"}
    for s in series:
        for report in s.reports:
            for entry in report["categories"].values():
                for location, usage in entry.get("by_location", {}).items():
                    if usage.get("peak") or usage.get("current"):
                        used.add(location)
    return [loc for loc in LOCATIONS if loc in used] + sorted(used - set(LOCATIONS))


def format_table(series: list[Series]) -> str:
    """Per rank, the last report of the run: every category's current bytes at each location
    (device, host pinned, host pageable, NVMe), its current and peak bytes, the ZeRO
    formula's expected bytes; then the model states, every location's current and peak, the
    engine total and the process."""
    names = ordered_categories(series)
    biggest = [s.last["total"]["peak"] for s in series]
    scale, unit = _unit(biggest)
    rows = []

    def number(value) -> str:
        return "-" if value is None else "0" if value == 0 else f"{value / scale:.3f}"

    for s in series:
        report = s.last
        head = [s.label, str(report["step"])]
        for name in names:
            entry = report["categories"].get(name, {"current": 0, "peak": 0})
            at = entry.get("by_location", {})
            expected = entry.get("expected")
            check = "" if expected is None else ("= formula" if expected == entry["current"]
                                                 else "differs")
            rows.append([*head, name, *(number(at[loc]["current"]) if loc in at else "-"
                                        for loc in LOCATIONS),
                         number(entry["current"]), number(entry["peak"]), number(expected),
                         entry.get("formula", ""), check])
        by_location = report.get("model_state_by_location")
        measured = (by_location or {}).get("measured", {})
        states = {loc: 0 for loc in LOCATIONS}
        for name in MODEL_STATES:
            for loc, usage in report["categories"].get(name, {}).get("by_location", {}).items():
                states[loc] = states.get(loc, 0) + usage["current"]
        rows.append([*head, "model states", *(number(states[loc]) for loc in LOCATIONS),
                     number(report["model_state_bytes"]), "",
                     number(report["model_state_expected_bytes"]),
                     report.get("model_state_formula", ""),
                     "= formula" if report["model_state_bytes"] ==
                     report["model_state_expected_bytes"] and
                     (not by_location or measured == by_location["expected"]) else "differs"])
        totals = location_totals(report)
        rows.append([*head, "engine total", *(number(totals.get(loc, {}).get("current"))
                                              for loc in LOCATIONS),
                     number(report["total"]["current"]), number(report["total"]["peak"]), "",
                     "", ""])
        rows.append([*head, "engine peak", *(number(totals.get(loc, {}).get("peak"))
                                             for loc in LOCATIONS), "",
                     number(report["total"]["peak"]), "", "(peak of each sum)", ""])
        process = report.get("process", {})
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
    headers = ["rank", "step", "category", *(f"{LOCATION_TEXT[loc]} {unit}" for loc in LOCATIONS),
               f"current {unit}", f"peak {unit}", f"formula {unit}", "formula", "check"]
    widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
    left = {0, 2, 10, 11}

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    first = series[0].last
    out = [f"memory report: stage {first['stage']}, N = {first['world_size']}, "
           f"Ψ = {first['numel']:,}, {first['param_bytes']}-byte parameters"
           + _offload_text(first) + " (last report of each rank)",
           line(headers), line(["-" * w for w in widths])]
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            out.append("")
        previous = row[0]
        out.append(line(row))
    return "\n".join(out)


def _offload_text(report: dict) -> str:
    offload = report.get("offload") or {}
    parts = []
    if offload.get("optimizer", "none") != "none":
        parts.append(f"optimizer on {'the host' if offload['optimizer'] == 'cpu' else 'NVMe'}")
    if offload.get("param", "none") != "none":
        parts.append("parameters on the host")
    return (", offload: " + " + ".join(parts)) if parts else ""


_COLORS = {"param": "#4c72b0", "gradient": "#dd8452", "fp32_master": "#55a868",
           "optimizer_state": "#c44e52", "bucket": "#8172b3", "gathered_param": "#937860",
           "staging": "#da8bc3", "other": "#8c8c8c"}


def plot(series: list[Series], png: str, max_panels: int = 16) -> str:
    """One row per rank, one column per location that held bytes (device, host pinned, host
    pageable, NVMe): memory by category (stacked, current bytes) across steps, the location's
    peak so far (dashed; the band between it and the stack is what was transient during the
    steps: gathered parameters, device staging, a grown bucket pool), and the ZeRO formula's
    model states at that location (dotted). Each column has its own unit (MiB or GiB)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--png needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    shown = series[:max_panels]
    names = ordered_categories(shown)
    locations = used_locations(shown)
    host_columns = [loc for loc in locations if loc.startswith("host")]
    # the host column that holds the offloaded model states gets the formula's host bytes
    formula_host = max(host_columns, key=lambda loc: sum(
        r["categories"].get(n, {}).get("by_location", {}).get(loc, {}).get("current", 0)
        for s in shown for r in s.reports for n in MODEL_STATES), default=None)
    units = {}
    for loc in locations:
        values = [_location_peak(r, loc) or _location_current(r, loc) for s in shown
                  for r in s.reports]
        units[loc] = _unit(values)
    cols = len(locations)
    fig, axes = plt.subplots(len(shown), cols, figsize=(1.0 + 5.4 * cols, 1.9 + 2.9 * len(shown)),
                             sharex=True, sharey="col", squeeze=False)
    handles = {}
    for row, s in enumerate(shown):
        steps = [r["step"] for r in s.reports]
        for col, loc in enumerate(locations):
            ax = axes[row, col]
            scale, unit = units[loc]
            here = [n for n in names if any(
                r["categories"].get(n, {}).get("by_location", {}).get(loc, {}).get("current")
                for r in s.reports)]
            stacks = [[r["categories"].get(n, {}).get("by_location", {}).get(loc, {})
                       .get("current", 0) / scale for r in s.reports] for n in here]
            tops = [sum(values) for values in zip(*stacks)] if stacks else [0.0] * len(steps)
            peaks = [_location_peak(r, loc) for r in s.reports]
            expected = [_formula_at(r, loc, formula_host) for r in s.reports]
            single = len(steps) == 1
            xs = [steps[0] - 0.3, steps[0] + 0.3] if single else steps
            if single:  # one report: a bar, the lines become segments across it
                bottom = 0.0
                for name, values in zip(here, stacks):
                    bar = ax.bar(steps, values, width=0.6, bottom=bottom,
                                 color=_COLORS.get(name), label=name)
                    handles.setdefault(name, bar)
                    bottom += values[0]
                ax.set_xlim(steps[0] - 1, steps[0] + 1)
                tops, peaks, expected = tops * 2, peaks * 2, expected * 2
            elif stacks:
                polys = ax.stackplot(steps, *stacks, colors=[_COLORS.get(n) for n in here],
                                     alpha=0.85)
                for name, poly in zip(here, polys):
                    handles.setdefault(name, poly)
            if all(p is not None for p in peaks) and any(peaks):
                peak = [p / scale for p in peaks]
                if any(p > t * 1.0001 for p, t in zip(peak, tops)):
                    band = ax.fill_between(xs, tops, peak, facecolor="none", edgecolor="#777777",
                                           hatch="///", linewidth=0)
                    handles.setdefault("transient in steps (peak − now)", band)
                style = dict(marker="o", markersize=3) if 1 < len(steps) < 30 else {}
                (line,) = ax.plot(xs, peak, color="black", linestyle="--", linewidth=1.2,
                                  **style)
                handles.setdefault("peak so far (this location)", line)
            if any(value is not None for value in expected):
                values = [(value or 0) / scale for value in expected]
                (line,) = ax.plot(xs, values, color="#111111", linestyle=":", linewidth=2.2)
                handles.setdefault("ZeRO formula: model states here", line)
            last = s.last
            now = _location_current(last, loc)
            peak_text = _location_peak(last, loc)
            title = (f"{s.label} · {LOCATION_TEXT.get(loc, loc)}: {now / scale:.3f} {unit} now"
                     + (f", peak {peak_text / scale:.3f} {unit}" if peak_text is not None
                        else ""))
            states = sum(last["categories"].get(n, {}).get("by_location", {}).get(loc, {})
                         .get("current", 0) for n in MODEL_STATES)
            formula = _formula_at(last, loc, formula_host)
            if formula is not None and (states or formula):
                title += "\nmodel states " + (
                    f"{states / scale:.3f} {unit} = formula" if states == formula else
                    f"{states / scale:.3f} {unit}, formula {formula / scale:.3f} {unit}")
            ax.set_title(title, fontsize=9.5)
            ax.set_ylabel(f"{LOCATION_TEXT.get(loc, loc)} memory ({unit})")
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
            ax.margins(x=0.01)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for col in range(cols):
        axes[-1, col].set_xlabel("optimizer step")
    first = shown[0].last
    extra = f" (first {len(shown)} of {len(series)} ranks)" if len(series) > len(shown) else ""
    dtype = {2: "16-bit", 4: "fp32"}.get(first["param_bytes"], f"{first['param_bytes']}-byte")
    persistent = first.get("persistent_numel")
    offload = _offload_text(first).removeprefix(", ")
    fig.suptitle(f"zero memory by location and category{extra}: ZeRO stage {first['stage']}, "
                 f"N = {first['world_size']} ranks, {dtype} parameters\n"
                 f"Ψ = {first['numel']:,}" + (" partitioned" if persistent else "")
                 + (f" + Ψp = {persistent:,} persistent" if persistent else "")
                 + (f"; {offload}" if offload else "") + "\n"
                 f"model states {first['model_state_formula']} · stacked: bytes after each "
                 "reported step · hatched: transient within a step", fontsize=10.5)
    ordered = {n: handles[n] for n in names if n in handles}
    ordered.update({k: v for k, v in handles.items() if k not in ordered})
    columns = max(1, min(len(ordered), int(fig.get_figwidth() / 2.9)))
    legend_rows = -(-len(ordered) // columns)
    height = fig.get_figheight()
    fig.legend(list(ordered.values()), list(ordered.keys()), loc="lower center",
               ncol=columns, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, (0.15 + 0.25 * legend_rows) / height, 1, 1))
    directory = os.path.dirname(os.path.abspath(png))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _location_current(report: dict, location: str) -> int:
    return sum(entry.get("by_location", {}).get(location, {}).get("current", 0)
               for entry in report["categories"].values())


def _location_peak(report: dict, location: str):
    if "by_location" in report:
        return report["by_location"].get(location, {}).get("peak", 0)
    if all(location == "device" or location not in e.get("by_location", {})
           for e in report["categories"].values()):
        return report["total"]["peak"]  # an older report with everything on the device
    return None


def _formula_at(report: dict, location: str, formula_host: str | None):
    """The formula's model-state bytes at a registry location (host: on the host column that
    holds the offloaded states); None when the report does not say."""
    by_location = report.get("model_state_by_location")
    if by_location is None:
        return report["model_state_expected_bytes"] if location == "device" else None
    expected = by_location["expected"]
    if location == "device":
        return expected.get("device", 0)
    if location == "nvme":
        return expected.get("nvme", 0)
    return expected.get("host", 0) if location == formula_host else None
