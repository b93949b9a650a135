"""Read the engine's memory-report JSON lines (`memory_report: {"path": ..., "every_n_steps":
n}` makes rank r append one line per n steps to `<root>.rank<r>.jsonl`) and show them: a table
per rank and category (current, peak, the formula's expected bytes), and a PNG timeline of
memory by category, one subplot per rank.

A file that several runs appended to holds several runs; a new run starts where the step
does not increase or the layout (stage, world size, Ψ, dtype) changes. The last run is shown
unless another is asked for.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field

from .estimate import GiB, MiB

CATEGORY_ORDER = ("param", "gradient", "fp32_master", "optimizer_state", "bucket",
                  "gathered_param", "staging", "other")
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
    """Consecutive reports with increasing steps and one layout are one run."""
    runs: list[list[dict]] = []
    for report in reports:
        if runs and report.get("step", 0) > runs[-1][-1].get("step", 0) and \
                _layout_key(report) == _layout_key(runs[-1][-1]):
            runs[-1].append(report)
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


def format_table(series: list[Series]) -> str:
    """Per rank, the last report of the run: every category's current and peak bytes beside
    the ZeRO formula's expected bytes, then the totals."""
    names = ordered_categories(series)
    biggest = [s.last["total"]["peak"] for s in series]
    scale, unit = _unit(biggest)
    rows = []
    for s in series:
        report = s.last
        for name in names:
            entry = report["categories"].get(name, {"current": 0, "peak": 0})
            expected = entry.get("expected")
            check = "" if expected is None else ("= formula" if expected == entry["current"]
                                                 else "differs")
            rows.append([s.label, str(report["step"]), name, f"{entry['current'] / scale:.3f}",
                         f"{entry['peak'] / scale:.3f}",
                         "-" if expected is None else f"{expected / scale:.3f}",
                         entry.get("formula", ""), check])
        rows.append([s.label, str(report["step"]), "model states",
                     f"{report['model_state_bytes'] / scale:.3f}", "",
                     f"{report['model_state_expected_bytes'] / scale:.3f}",
                     report.get("model_state_formula", ""),
                     "= formula" if report["model_state_bytes"] ==
                     report["model_state_expected_bytes"] else "differs"])
        rows.append([s.label, str(report["step"]), "engine total",
                     f"{report['total']['current'] / scale:.3f}",
                     f"{report['total']['peak'] / scale:.3f}", "", "", ""])
        rss = report.get("process", {})
        if "rss_peak_bytes" in rss:
            # ru_maxrss is read before statm, so the current RSS can exceed it by a page or so.
            current = rss.get("rss_bytes", 0)
            rows.append([s.label, str(report["step"]), "process RSS", f"{current / scale:.3f}",
                         f"{max(current, rss['rss_peak_bytes']) / scale:.3f}", "", "",
                         "(whole process)"])
    headers = ["rank", "step", "category", f"current {unit}", f"peak {unit}",
               f"formula {unit}", "formula", "check"]
    widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
    left = {0, 2, 6, 7}

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    first = series[0].last
    out = [f"memory report: stage {first['stage']}, N = {first['world_size']}, "
           f"Ψ = {first['numel']:,}, {first['param_bytes']}-byte parameters "
           f"(last report of each rank)", line(headers), line(["-" * w for w in widths])]
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            out.append("")
        previous = row[0]
        out.append(line(row))
    return "\n".join(out)


_COLORS = {"param": "#4c72b0", "gradient": "#dd8452", "fp32_master": "#55a868",
           "optimizer_state": "#c44e52", "bucket": "#8172b3", "gathered_param": "#937860",
           "staging": "#da8bc3", "other": "#8c8c8c"}


def plot(series: list[Series], png: str, max_panels: int = 16) -> str:
    """One subplot per rank: memory by category (stacked, current bytes) across steps, the
    engine's total peak, and the formula's model-state bytes."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--png needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    shown = series[:max_panels]
    names = ordered_categories(shown)
    peaks = [r["total"]["peak"] for s in shown for r in s.reports]
    scale, unit = _unit(peaks)
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 1.2 + 2.6 * len(shown)),
                             sharex=True, sharey=True, squeeze=False)
    handles = {}
    for ax, s in zip(axes[:, 0], shown):
        steps = [r["step"] for r in s.reports]
        stacks = [[r["categories"].get(n, {}).get("current", 0) / scale for r in s.reports]
                  for n in names]
        colors = [_COLORS.get(n, None) for n in names]
        if len(steps) == 1:
            bottom = 0.0
            width = 0.6
            for name, values, color in zip(names, stacks, colors):
                bar = ax.bar(steps, values, width=width, bottom=bottom, color=color, label=name)
                handles.setdefault(name, bar)
                bottom += values[0]
            ax.set_xlim(steps[0] - 1, steps[0] + 1)
        else:
            polys = ax.stackplot(steps, *stacks, labels=names, colors=colors, alpha=0.85)
            for name, poly in zip(names, polys):
                handles.setdefault(name, poly)
        total_peak = [r["total"]["peak"] / scale for r in s.reports]
        formula = [r["model_state_expected_bytes"] / scale for r in s.reports]
        style = dict(marker="o", markersize=3) if len(steps) < 30 else {}
        xs = steps
        if len(steps) == 1:  # one report: the lines become segments across the bar
            xs = [steps[0] - 0.3, steps[0] + 0.3]
            total_peak, formula = total_peak * 2, formula * 2
            style = {}
        (peak_line,) = ax.plot(xs, total_peak, color="black", linestyle="--", linewidth=1.2,
                               **style)
        (formula_line,) = ax.plot(xs, formula, color="#111111", linestyle=":", linewidth=2.2)
        handles.setdefault("engine total peak (all categories)", peak_line)
        handles.setdefault("ZeRO formula: model states", formula_line)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        last = s.last
        agree = ("= formula" if last["model_state_bytes"] == last["model_state_expected_bytes"]
                 else f"formula {last['model_state_expected_bytes'] / scale:.3f} {unit}")
        ax.set_title(f"{s.label}: model states {last['model_state_bytes'] / scale:.3f} {unit} "
                     f"({last['model_state_formula']}, {agree}), engine total peak "
                     f"{last['total']['peak'] / scale:.3f} {unit}", fontsize=9.5)
        ax.set_ylabel(f"memory ({unit})")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.margins(x=0.01)
    axes[-1, 0].set_xlabel("optimizer step")
    first = shown[0].last
    extra = f" (first {len(shown)} of {len(series)} ranks)" if len(series) > len(shown) else ""
    dtype = {2: "16-bit", 4: "fp32"}.get(first["param_bytes"], f"{first['param_bytes']}-byte")
    fig.suptitle(f"zero memory by category across ranks{extra}: ZeRO stage {first['stage']}, "
                 f"N = {first['world_size']} ranks, Ψ = {first['numel']:,} ({dtype} parameters)",
                 fontsize=11)
    columns = min(4, len(handles))
    legend_rows = -(-len(handles) // columns)
    height = fig.get_figheight()
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
               ncol=columns, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, (0.12 + 0.25 * legend_rows) / height, 1, 1))
    directory = os.path.dirname(os.path.abspath(png))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
