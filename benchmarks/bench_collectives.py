"""The collectives a step is made of, timed on gloo: which way a host reduce-scatter should go.

    python benchmarks/bench_collectives.py                      # the full run (~30 s)
    python benchmarks/bench_collectives.py --worlds 2 --sizes-mib 1 --repeats 3 --out /tmp/bench

gloo's reduce-scatter all-reduces a copy of its whole input and keeps one piece, so it moves
an all-reduce's bytes. zero's `Communicator.reduce_scatter` on host tensors is an all-to-all
(piece r of every rank's buffer goes to rank r) and a local sum of the N pieces it received
(csrc/adapter/collectives.cpp, host_reduce_scatter). This times, for each world size and
buffer size (the full buffer, fp32 and bf16), in one set of ranks per world size:

* gloo `reduce_scatter_single` (what zero called before),
* zero's reduce-scatter (all-to-all + sum), checked against the fp32 sum rounded once,
* gloo `all_to_all_single` alone (the transfer zero's reduce-scatter waits for),
* gloo `all_reduce` of the full buffer, for scale.

gloo's all-gather is not timed: on 4 ranks sharing 2 cores, torch's own loop of barriers and
1-16 MiB `all_gather_single` calls (no zero in the process) left a rank waiting for ever in
one run of three (torch 2.13).

Each time is the median over --repeats calls of rank 0, each call after a barrier.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchmarks.under_test  # noqa: E402,F401  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.launch import spawn_ranks  # noqa: E402
from benchmarks.report import engine_under_test, header, machine_section, markdown_table  # noqa: E402
from benchmarks.report import publish  # noqa: E402
from benchmarks.timing import collective_median  # noqa: E402
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402

OPS = ("gloo reduce_scatter", "zero reduce_scatter", "gloo all_to_all", "gloo all_reduce")
DTYPES = ("float32", "bfloat16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,4", help="comma-separated world sizes")
    p.add_argument("--sizes-mib", default="1,4,16",
                   help="comma-separated full-buffer sizes in MiB (fp32; bf16 has as many elements)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per collective")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="where collectives.md/.json go ('' = print only)")
    return p.parse_args(argv)


def _time_rank(rank, world, name, args):
    """Every (size, dtype, op) on this rank; zero's result checked against the exact sum."""
    import torch
    import torch.distributed as dist

    from zero import _C

    dist.init_process_group("gloo")
    communicator = _C.Communicator(dist.group.WORLD.group_name)
    times = {}
    for mib in args.sizes:
        numel = mib * 2**20 // 4 // world * world
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            gen = torch.Generator().manual_seed(rank)
            full = torch.randn(numel, generator=gen).to(dtype)
            received = torch.empty_like(full)
            shard = torch.empty(numel // world, dtype=dtype)
            exact = torch.empty(numel // world)  # the fp32 sum of the same values
            dist.reduce_scatter_single(exact, full.float())
            communicator.reduce_scatter(shard, full)
            torch.testing.assert_close(shard, exact.to(dtype))
            ops = {
                "gloo reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
                "zero reduce_scatter": lambda: communicator.reduce_scatter(shard, full),
                "gloo all_to_all": lambda: dist.all_to_all_single(received, full),
                "gloo all_reduce": lambda: dist.all_reduce(received),
            }
            for op, fn in ops.items():
                times[f"{mib} {dtype_name} {op}"] = collective_median(fn, args.repeats) * 1e3
    dist.destroy_process_group()
    return {"rank": rank, "times_ms": times}


def render(runs: dict, args, facts: dict, command: str, wall: float) -> str:
    lines = header("Collectives on gloo: gloo's reduce-scatter against zero's (all-to-all + sum)",
                   "bench_collectives.py", facts["date"], wall, command)
    lines += [f"Median of {args.repeats} calls on rank 0 (each after a barrier), ms; the size "
              "is the full buffer's (fp32; bf16 has as many elements). gloo RS / zero RS > 1: "
              "zero's is faster.", ""]
    rows = []
    for world, run in runs.items():
        if "error" in run:
            rows.append([world, "-", "-", *["-"] * len(OPS), run["error"][:200]])
            continue
        t = run["ranks"][0]["times_ms"]
        for mib in args.sizes:
            for dtype in DTYPES:
                cells = [t[f"{mib} {dtype} {op}"] for op in OPS]
                rows.append([world, mib, dtype, *(f"{c:.2f}" for c in cells),
                             f"{cells[0] / cells[1]:.2f}"])
    lines.append(markdown_table(["ranks", "MiB", "dtype", *OPS, "gloo RS / zero RS"], rows))
    lines += ["", f"{engine_under_test(facts)}.", *machine_section(facts)]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    args.sizes = [int(s) for s in args.sizes_mib.split(",") if s.strip()]
    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench_collectives_") as tmp:
        for world in worlds:
            ranks = SimpleNamespace(world_size=world, threads=1, sizes=args.sizes,
                                    repeats=args.repeats)
            runs[world] = spawn_ranks(_time_rank, f"world{world}", ranks, tmp)
    wall = time.perf_counter() - t0
    facts = {**machine.host_facts(), "date": machine.utc_now(),
             "zero_root": ZERO_ROOT, "zero_commit": machine.git_commit(ZERO_ROOT)}
    publish(args.out, "collectives", render(runs, args, facts, command, wall),
            {"command": command, "args": vars(args), "machine": facts, "wall_s": wall,
             "runs": runs})
    return 1 if any("error" in run for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
