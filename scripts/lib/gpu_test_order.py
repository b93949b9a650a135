"""The CUDA tests in the order a lent GPU's few minutes should run them: first those no
committed GPU run has seen pass (never run, cut by the budget, or failed), then those that
have passed before; one pytest node id per line.

    python scripts/lib/gpu_test_order.py [--results DIR] [--first REGEX] TEST_FILE...

"Seen pass" is a `PASSED tests/...` line in DIR's `*cuda_tests*.txt` (gpu_check.sh's `-rA`
summaries, committed under benchmarks/results/gpu/). --first: the ids it matches go before
all others (tests whose code changed since they passed on a GPU)."""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

PASSED = re.compile(r"PASSED (tests/\S+)")


def passed_before(results: str) -> set[str]:
    seen: set[str] = set()
    for path in glob.glob(os.path.join(results, "*cuda_tests*.txt")):
        with open(path, encoding="utf-8", errors="replace") as text:
            seen.update(PASSED.findall(text.read()))
    return seen


def collected(files: list[str]) -> list[str]:
    """The node ids pytest collects from `files`, in its order."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *files], capture_output=True, text=True)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    if proc.returncode != 0 or not ids:
        raise SystemExit(f"gpu_test_order: pytest could not collect {files}:\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return ids


def ordered(ids: list[str], seen: set[str], first: str = "") -> list[str]:
    rank = {i: (0 if first and re.search(first, i) else 1 if i not in seen else 2) for i in ids}
    return sorted(ids, key=rank.__getitem__)  # (stable: pytest's order within a rank)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/results/gpu")
    parser.add_argument("--first", default="", help="a regular expression")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    print("\n".join(ordered(collected(args.files), passed_before(args.results), args.first)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
