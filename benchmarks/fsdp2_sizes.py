"""zero stage 3 against FSDP2 across model sizes and world sizes: one table from several runs
of bench_fsdp2.py (each run's JSON), every zero row beside FSDP2's in the same precision and
run.

    python benchmarks/fsdp2_sizes.py benchmarks/results/fsdp2_sizes/*/fsdp2_vs_zero3.json \
        --out benchmarks/results/fsdp2_sizes.md

Per row: Ψ, ranks; the interleaved step time and its ratio to FSDP2 paired per round; the step
peak (profiler: owned at the step's start + the peak of what it allocated) and the RSS peak
growth (ru_maxrss at the end - RSS after start-up), each as the slower / larger rank and as a
ratio to FSDP2's. Nothing is measured here: the numbers are the runs'.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.fsdp2_summary import split_name  # noqa: E402


def rows_of(record: dict) -> list[list[str]]:
    inter = record["interleaved"].get("summary", {})
    by_name = {s["config"]: s for s in record["summary"] if "error" not in s}
    args = record["args"]
    out = []
    for name, s in by_name.items():
        kind, precision = split_name(name)
        anchor = by_name.get(f"fsdp2-{precision}")
        if anchor is None:
            continue
        peak, anchor_peak = _step_peak(s), _step_peak(anchor)
        growth, anchor_growth = _rss_growth(s), _rss_growth(anchor)
        timed = inter.get(name, {}).get("total", {})
        paired = inter.get("paired", {}).get(f"{name}/fsdp2-{precision}")
        out.append([
            f"{s['numel'] / 1e6:.1f}M", str(args["world_size"]), name,
            f"{timed['median']:.0f}" if timed else "-",
            "-" if name == anchor["config"] else
            (f"{paired['median']:.2f} ({paired['p10']:.2f}-{paired['p90']:.2f})" if paired
             else "-"),
            _mib(peak), "-" if name == anchor["config"] else f"{peak / anchor_peak:.2f}",
            _mib(growth), "-" if name == anchor["config"] else f"{growth / anchor_growth:.2f}"])
    return out


def _step_peak(summary: dict) -> int:
    return max(summary["profiled"]["step_peak_bytes"])


def _rss_growth(summary: dict) -> int:
    return max(p - s for p, s in zip(summary["rss_peak_bytes"], summary["rss_start_bytes"]))


def _mib(value: int) -> str:
    return f"{value / 2 ** 20:.1f}"


def render(records: list[tuple[str, dict]]) -> str:
    lines = ["# zero stage 3 vs FSDP2 by model and world size (gloo, CPU)", "",
             "Built by `benchmarks/fsdp2_sizes.py` from these runs of "
             "`benchmarks/bench_fsdp2.py` (each run's command, machine and date are in its "
             "report beside its JSON):", ""]
    for path, record in records:
        lines.append(f"- `{path}`: `{record['command']}` "
                     f"({record['machine'].get('date', record['machine'].get('started', ''))}, "
                     f"{record['wall_s']:.0f} s)")
    lines += ["", "| Ψ | ranks | config | step ms (interleaved median) | / FSDP2 paired "
              "(p10-p90) | step peak MiB | / FSDP2 | RSS peak growth MiB | / FSDP2 |",
              "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for _, record in records:
        lines += ["| " + " | ".join(row) + " |" for row in rows_of(record)]
    lines += ["", "*step peak*: the profiled step's bytes owned at its start plus the peak "
              "of the live bytes it allocated (torch.profiler), the larger rank. *RSS peak "
              "growth*: ru_maxrss before the profiled step minus RSS after start-up, the "
              "larger rank. Ratios to FSDP2 in the same run and precision; step-time ratios "
              "paired per interleaved round."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="bench_fsdp2.py JSON files")
    parser.add_argument("--out", default="", help="markdown file ('' prints only)")
    args = parser.parse_args(argv)
    records = []
    for path in args.runs:
        with open(path) as f:
            records.append((path, json.load(f)))
    text = render(records)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
