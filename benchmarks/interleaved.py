"""The driver of a round-robin comparison (bench_monitoring.py, bench_zeropp.py): one set of
args.world_size ranks holds every configuration's engine and steps them in turn; the rank
results are summarized, rendered and published with the command, machine facts and wall time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from benchmarks import facts as machine
from benchmarks.cli import add_comparison_args, add_model_args, add_run_args
from benchmarks.launch import spawn_ranks
from benchmarks.report import machine_section, publish
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line


def parser(doc: str, stem: str, configs: list[str], warmup: int, steps: int):
    """The flags of a round-robin comparison on bench_ddp.py's TinyGPT (the script adds its
    own): world size, steps, model sizes, threads, clipping, configurations, --out."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_run_args(p, steps=0, steps_help="(unused: only the interleaved run)", warmup=warmup,
                 interleaved_steps=steps)
    add_model_args(p, micro_batch=4, vocab=4096, n_layer=4, n_embd=256)
    add_comparison_args(p, configs)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help=f"where {stem}.md/.json go ('' = print only)")
    return p


def run(stem: str, run_rank, args, summarize, render, prepare=None) -> int:
    """run_rank(rank, world, name, args) -> dict on every rank; summarize(result, configs) ->
    summary; render(summary, args, facts, command, wall) -> markdown, published as stem.md /
    stem.json in args.out. prepare(args, tmp) runs first with the run's temporary folder."""
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench_{stem}_") as tmp:
        if prepare is not None:
            prepare(args, tmp)
        result = spawn_ranks(run_rank, "interleaved", args, tmp)
    wall = time.perf_counter() - t0
    if result.get("error"):
        print(result["error"], file=sys.stderr)
        return 1
    facts = {**machine.host_facts(), "date": machine.utc_now(),
             "zero_commit": machine.git_commit(ZERO_ROOT)}
    summary = summarize(result, args.config_list)
    publish(args.out, stem, render(summary, args, facts, command, wall),
            {"command": command, "args": vars(args), "machine": facts, "wall_s": wall,
             "summary": summary, "raw": result})
    return 0


def footer(facts: dict) -> list[str]:
    """The engine under test and the machine, the last lines of a report."""
    return ["", f"Engine under test: `{ZERO_ROOT}` at commit {facts['zero_commit']}.",
            *machine_section(facts)]
