"""The memory estimate (zero.reports.estimate) held to what an engine's memory report says a
rank holds, category by category: what a rank's run returns (`held`) and the comparison
(`assert_held_as_estimated`), shared by the tests that check a layout's estimate."""
from __future__ import annotations


def held(engine) -> tuple[dict, dict, int]:
    """(each category's bytes: its peak where the report expects one, else now; each
    category's peak; the total's peak) of `engine`'s memory report."""
    report = engine.memory_report()
    return ({name: value["peak" if "expected" in value else "current"]
             for name, value in report["categories"].items()},
            {name: value["peak"] for name, value in report["categories"].items()},
            report["total"]["peak"])


def assert_held_as_estimated(estimate, results, stage: int) -> None:
    """Every rank's `held` equal to `estimate` per category; the working buffers (bucket,
    gathered parameters) at the backward's peak; the device total equal below stage 3, at
    stage 3 an upper bound by at most the buckets (the categories' peaks added up)."""
    for found, peaks, total in results:
        estimated = {name: row["bytes"] for name, row in estimate.categories.items()}
        bucket = estimated["bucket"]
        for working in ("bucket", "gathered_param"):  # at the backward's peak, none after
            assert peaks.get(working, 0) == estimated.pop(working, 0), working
            found.pop(working, None)
        for name in set(estimated) | set(found):
            assert estimated.get(name, 0) == found.get(name, 0), (name, estimated, found)
        if stage < 3:
            assert estimate.device_bytes == total
        else:
            assert total <= estimate.device_bytes <= total + bucket
