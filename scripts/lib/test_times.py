"""Seconds per test file from pytest's JUnit XML: where CI's minutes go.

    python3 scripts/lib/test_times.py build/pytest-junit.xml [--top N]

Sums each file's test times (set-up and teardown included: a module fixture's job counts
against its file) and prints the longest files first, with their share of the total.
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ElementTree


def seconds_per_file(path: str) -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in module if part.startswith("test_")), module[0])
        totals[f"{name}.py"] += float(case.get("time", 0.0))
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    totals = seconds_per_file(args.junit_xml)
    whole = sum(totals.values()) or 1.0
    print(f"test seconds per file (all workers together: {whole:.0f} s)")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{seconds:8.1f} s {100 * seconds / whole:5.1f}%  {name}")


if __name__ == "__main__":
    main()
