"""Read the engine's memory-report JSON lines (`memory_report: {"path": ..., "every_n_steps":
n}` makes rank r append one line per n steps to `<root>.rank<r>.jsonl`;
`engine.final_memory_report()` appends one more, marked "final") and show them: the table of
each rank's last report (table.format_table), and a PNG timeline of memory by category, one
row per rank and one column per location.

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

from ..memory import LOCATIONS, MODEL_STATES
from . import table
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

    def last_reports(self) -> list[tuple[str, dict]]:
        """(label, last report) of each rank, as table.format_table takes them."""
        return [(s.label, s.last) for s in self.series]


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


_COLORS = {"param": "#4c72b0", "gradient": "#dd8452", "fp32_master": "#55a868",
           "optimizer_state": "#c44e52", "bucket": "#8172b3", "gathered_param": "#937860",
           "staging": "#da8bc3", "other": "#8c8c8c"}


def plot(series: list[Series], png: str, max_panels: int = 16) -> str:
    """One row per rank, one column per location that held bytes (device, host pinned, host
    pageable, NVMe): memory by category (stacked, current bytes) across steps, the location's
    peak so far (dashed; the band between it and the stack is what was transient during the
    steps: gathered parameters, device staging, gradient buckets), and the ZeRO formula's
    model states at that location (dotted). Each column has its own unit (MiB or GiB)."""
    plt = _pyplot()
    shown = series[:max_panels]
    names = table.ordered_categories([r for s in shown for r in s.reports])
    locations = used_locations(shown)
    formula_host = _formula_host(shown, locations)
    units = {}
    for loc in locations:
        values = [_location_peak(r, loc) or _location_current(r, loc) for s in shown
                  for r in s.reports]
        units[loc] = table.unit(values)
    cols = len(locations)
    fig, axes = plt.subplots(len(shown), cols, figsize=(1.0 + 5.4 * cols, 1.9 + 2.9 * len(shown)),
                             sharex=True, sharey="col", squeeze=False)
    handles = {}
    for row, s in enumerate(shown):
        for col, loc in enumerate(locations):
            _draw_panel(axes[row, col], s, loc, names, units[loc], formula_host, handles)
    for col in range(cols):
        axes[-1, col].set_xlabel("optimizer step")
    fig.suptitle(_suptitle(series, shown), fontsize=10.5)
    _add_legend(fig, handles, names)
    directory = os.path.dirname(os.path.abspath(png))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _pyplot():
    """matplotlib.pyplot on the Agg backend (drawing to a file, no display)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--png needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _category_bytes(report: dict, name: str, location: str, which: str = "current") -> int:
    return (report["categories"].get(name, {}).get("by_location", {}).get(location, {})
            .get(which, 0))


def _formula_host(shown: list[Series], locations: list[str]) -> str | None:
    """The host column that holds the offloaded model states: it gets the formula's host
    bytes."""
    host_columns = [loc for loc in locations if loc.startswith("host")]
    return max(host_columns, key=lambda loc: sum(
        _category_bytes(r, n, loc) for s in shown for r in s.reports for n in MODEL_STATES),
        default=None)


def _draw_panel(ax, s: Series, loc: str, names: list[str], scale_unit: tuple[float, str],
                formula_host: str | None, handles: dict) -> None:
    """One rank at one location: the categories stacked across steps (a bar for a single
    report), the location's peak so far, the formula's model states, and a title with the
    last report's numbers."""
    scale, unit = scale_unit
    steps = [r["step"] for r in s.reports]
    here = [n for n in names if any(_category_bytes(r, n, loc) for r in s.reports)]
    stacks = [[_category_bytes(r, n, loc) / scale for r in s.reports] for n in here]
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
    _draw_peak(ax, xs, peaks, tops, scale, len(steps), handles)
    _draw_formula(ax, xs, expected, scale, handles)
    ax.set_title(_panel_title(s, loc, scale, unit, formula_host), fontsize=9.5)
    _style_axes(ax, loc, unit)


def _draw_peak(ax, xs: list, peaks: list, tops: list, scale: float, step_count: int,
               handles: dict) -> None:
    """The location's peak so far (dashed), and the band between it and the stack (hatched):
    what was transient within the steps."""
    if not (all(p is not None for p in peaks) and any(peaks)):
        return
    peak = [p / scale for p in peaks]
    if any(p > t * 1.0001 for p, t in zip(peak, tops)):
        band = ax.fill_between(xs, tops, peak, facecolor="none", edgecolor="#777777",
                               hatch="///", linewidth=0)
        handles.setdefault("transient in steps (peak − now)", band)
    style = dict(marker="o", markersize=3) if 1 < step_count < 30 else {}
    (line,) = ax.plot(xs, peak, color="black", linestyle="--", linewidth=1.2, **style)
    handles.setdefault("peak so far (this location)", line)


def _draw_formula(ax, xs: list, expected: list, scale: float, handles: dict) -> None:
    """The ZeRO formula's model states at this location (dotted)."""
    if not any(value is not None for value in expected):
        return
    values = [(value or 0) / scale for value in expected]
    (line,) = ax.plot(xs, values, color="#111111", linestyle=":", linewidth=2.2)
    handles.setdefault("ZeRO formula: model states here", line)


def _panel_title(s: Series, loc: str, scale: float, unit: str, formula_host: str | None) -> str:
    """'rank 0 · device: 1.234 MiB now, peak 2.345 MiB' and the model states against the
    formula."""
    last = s.last
    now = _location_current(last, loc)
    peak_text = _location_peak(last, loc)
    title = (f"{s.label} · {table.LOCATION_TEXT.get(loc, loc)}: {now / scale:.3f} {unit} now"
             + (f", peak {peak_text / scale:.3f} {unit}" if peak_text is not None
                else ""))
    # model states at their most (stage 2 and 3 gradient shards are given back between steps)
    states = sum(_category_bytes(last, n, loc, "peak") for n in MODEL_STATES)
    formula = _formula_at(last, loc, formula_host)
    if formula is not None and (states or formula):
        title += "\nmodel states " + (
            f"{states / scale:.3f} {unit} = formula" if states == formula else
            f"{states / scale:.3f} {unit}, formula {formula / scale:.3f} {unit}")
    return title


def _style_axes(ax, loc: str, unit: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_ylabel(f"{table.LOCATION_TEXT.get(loc, loc)} memory ({unit})")
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.margins(x=0.01)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _suptitle(series: list[Series], shown: list[Series]) -> str:
    """The run: stage, ranks, dtype, Ψ (and Ψp), offload, the model-state formula."""
    first = shown[0].last
    extra = f" (first {len(shown)} of {len(series)} ranks)" if len(series) > len(shown) else ""
    dtype = {2: "16-bit", 4: "fp32"}.get(first["param_bytes"], f"{first['param_bytes']}-byte")
    persistent = first.get("persistent_numel")
    offload = table.offload_text(first).removeprefix(", ")
    return (f"zero memory by location and category{extra}: ZeRO stage {first['stage']}, "
            f"N = {first['world_size']} ranks, {dtype} parameters\n"
            f"Ψ = {first['numel']:,}" + (" partitioned" if persistent else "")
            + (f" + Ψp = {persistent:,} persistent" if persistent else "")
            + (f" + Ψf = {first['frozen_numel']:,} frozen" if first.get("frozen_numel") else "")
            + (f"; {offload}" if offload else "") + "\n"
            f"model states {first['model_state_formula']} · stacked: bytes after each "
            "reported step · hatched: transient within a step")


def _add_legend(fig, handles: dict, names: list[str]) -> None:
    """One legend under the panels (categories first, in order), the panels laid out above
    it."""
    ordered = {n: handles[n] for n in names if n in handles}
    ordered.update({k: v for k, v in handles.items() if k not in ordered})
    columns = max(1, min(len(ordered), int(fig.get_figwidth() / 2.9)))
    legend_rows = -(-len(ordered) // columns)
    height = fig.get_figheight()
    fig.legend(list(ordered.values()), list(ordered.keys()), loc="lower center",
               ncol=columns, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, (0.15 + 0.25 * legend_rows) / height, 1, 1))


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
