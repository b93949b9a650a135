"""Loading a checkpoint at another world size: each rank's peak memory and time.

    python benchmarks/bench_reshard.py                          # the full run (~2 min)
    python benchmarks/bench_reshard.py --n-layer 2 --worlds 2 --out /tmp/bench   # smoke test
    ZERO_ROOT=/tmp/zero_snap ZERO_COMMIT=<sha> python benchmarks/bench_reshard.py  # another zero

A TinyGPT trains one step at ZeRO stage --stage on --saved-world ranks (fp32, AdamW) and is
saved; then, for each of --worlds, fresh ranks build the same engine and load it. A load at
another world size cuts each rank's new shard of the fp32 master and of Adam's two moments
out of the saved ranks' memory-mapped files (zero/checkpoint_pieces.py). Per rank the report
gives the growth of its peak RSS during `load_checkpoint` (VmHWM reset just before; file
pages read through the mapping count), its time, and two yardsticks: the rank's share of what
it must read, the rank files over the new world size (what its new shards hold) plus the model
file (the module, which every rank loads whole), and the rank files' whole size (what a load
that put every array back together first would hold at least). The growth exceeds the share
by about the new shards themselves: they are built from the file pages, then copied in.
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
from benchmarks.memory import proc_status, reset_peak_rss  # noqa: E402
from benchmarks.report import engine_under_test, header, machine_section  # noqa: E402
from benchmarks.report import markdown_table, mib, publish  # noqa: E402
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", type=int, default=2, choices=(1, 2, 3))
    p.add_argument("--saved-world", type=int, default=1, help="ranks that save")
    p.add_argument("--worlds", default="2,4", help="comma-separated world sizes that load")
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="where reshard.md/.json go ('' = print only)")
    return p.parse_args(argv)


def _engine(args):
    import torch

    import zero
    from zero.models.tiny_gpt import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=args.vocab, block_size=128, n_layer=args.n_layer,
                              n_head=8, n_embd=args.n_embd))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "zero_optimization": {"stage": args.stage}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


def _save_rank(rank, world, name, args):
    import torch

    engine = _engine(args)
    tokens = torch.randint(0, args.vocab, (1, 128), generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(tokens, tokens))
    engine.step()
    engine.save_checkpoint(args.path, tag="saved")
    return {"params": sum(p.numel() for p in engine.module.parameters())}


def _load_rank(rank, world, name, args):
    engine = _engine(args)
    reset_peak_rss()
    before = proc_status()["VmRSS"]
    start = time.perf_counter()
    engine.load_checkpoint(args.path, tag="saved")
    seconds = time.perf_counter() - start
    return {"peak_growth": proc_status()["VmHWM"] - before, "seconds": seconds}


def _file_bytes(path: str) -> tuple[int, int]:
    """(the model file's bytes, all rank files' bytes) of the saved tag."""
    tag = os.path.join(path, "saved")
    sizes = {name: os.path.getsize(os.path.join(tag, name)) for name in os.listdir(tag)}
    ranks = sum(size for name, size in sizes.items() if name.endswith("_optim_states.pt"))
    return sizes.get("model_states.pt", 0), ranks


def render(saved: dict, loads: dict, files: tuple, args, facts: dict, command: str,
           wall: float) -> str:
    model_file, rank_files = files
    lines = header(f"Loading a checkpoint at another world size (stage {args.stage}, saved by "
                   f"{args.saved_world} rank(s))", "bench_reshard.py", facts["date"], wall,
                   command)
    params = saved["ranks"][0]["params"] if saved.get("ranks") else 0
    lines += [f"TinyGPT, Ψ = {params:,} parameters, fp32, AdamW: rank files {mib(rank_files)} "
              f"MiB in all, model file {mib(model_file)} MiB. Peak RSS growth during "
              "`load_checkpoint`, per rank (rank 0 / the others' median); share = rank files "
              "/ world + model file; whole = the rank files.", ""]
    rows = []
    for world, run in loads.items():
        if "error" in run:
            rows.append([world, "-", "-", "-", "-", run["error"][:200]])
            continue
        growth = sorted(r["peak_growth"] for r in run["ranks"])
        seconds = max(r["seconds"] for r in run["ranks"])
        share = rank_files / world + model_file
        rows.append([world, f"{mib(run['ranks'][0]['peak_growth'])} / "
                            f"{mib(growth[len(growth) // 2])}",
                     mib(share), mib(rank_files), f"{seconds:.2f}", ""])
    lines.append(markdown_table(["ranks", "peak RSS growth MiB", "share MiB", "whole MiB",
                                 "load s (slowest rank)", "error"], rows))
    lines += ["", f"{engine_under_test(facts)}.", *machine_section(facts)]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_reshard_") as tmp:
        ranks = SimpleNamespace(**vars(args), world_size=args.saved_world, threads=1,
                                path=os.path.join(tmp, "checkpoint"))
        saved = spawn_ranks(_save_rank, "save", ranks, tmp)
        files = _file_bytes(ranks.path) if "error" not in saved else (0, 0)
        loads = {}
        for world in worlds:
            ranks.world_size = world
            loads[world] = spawn_ranks(_load_rank, f"load{world}", ranks, tmp)
    wall = time.perf_counter() - t0
    facts = {**machine.host_facts(), "date": machine.utc_now(),
             "zero_root": ZERO_ROOT, "zero_commit": os.environ.get("ZERO_COMMIT") or
             machine.git_commit(ZERO_ROOT)}
    publish(args.out, "reshard", render(saved, loads, files, args, facts, command, wall),
            {"command": command, "args": vars(args), "machine": facts, "wall_s": wall,
             "saved": saved, "loads": loads, "model_file_bytes": files[0],
             "rank_files_bytes": files[1]})
    return 1 if "error" in saved or any("error" in run for run in loads.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
