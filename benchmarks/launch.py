"""Starting the processes a benchmark measures in. Every configuration runs in fresh
processes, so a process's peak RSS belongs to that configuration alone:

* spawn_ranks: one rank per process (torch.multiprocessing spawn, gloo rendezvous on a free
  local port); each rank writes what it measured, or its traceback, to a JSON file;
* run_worker: one process running this script again with a flag that makes it a worker,
  which writes its result to a JSON file.

Both come back as a result the report can show: what was measured, or why nothing was."""
from __future__ import annotations

import json
import os
import statistics
import socket
import subprocess
import tempfile
import time
import traceback


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_env(rank: int, world: int, port: int) -> dict:
    """The environment torch.distributed's env:// rendezvous reads, on this machine."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}


def outcome(name: str, t0: float, ranks: list | None = None, error: str | None = None) -> dict:
    """One run of a configuration: every rank's result, or the error; its wall time since t0."""
    if error:
        return {"config": name, "error": error, "wall_s": time.perf_counter() - t0}
    return {"config": name, "ranks": ranks, "wall_s": time.perf_counter() - t0}


def measured_steps(train, batches, warmup: int) -> dict:
    """`train(batches)` -> (step times, losses) run with the peak RSS reset first: what a
    rank returns for step_summary (the times after `warmup`, the losses, the peak growth)."""
    from benchmarks.memory import proc_status, reset_peak_rss, rss_now

    reset_peak_rss()
    before = rss_now()
    times, losses = train(batches)
    return {"times": times[warmup:], "losses": losses,
            "peak_growth": proc_status()["VmHWM"] - before}


def step_summary(result: dict) -> dict:
    """spawn_ranks' outcome of ranks that return their step `times`, `losses` and
    `peak_growth` (bytes): the slower rank's median step (s), the largest peak growth (MiB)
    and rank 0's losses; or the error's last line."""
    if "error" in result:
        return {"error": result["error"].strip().splitlines()[-1]}
    ranks = result["ranks"]
    slowest = [max(step) for step in zip(*(r["times"] for r in ranks))]
    return {"step_s": statistics.median(slowest),
            "peak_growth_mib": max(r["peak_growth"] for r in ranks) / (1 << 20),
            "losses": ranks[0]["losses"]}


def run_and_publish(names, run_rank, args, stem: str, render) -> None:
    """Each configuration name in order on fresh ranks (spawn_ranks, its step_summary printed
    as it ends), then `render(rows, args, facts, wall_s)` and the rows published under
    args.out as `stem`.md and .json."""
    from benchmarks import facts as machine
    from benchmarks.report import publish

    t0 = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp:
        for name in names:
            rows[name] = step_summary(spawn_ranks(run_rank, name, args, tmp))
            print(name, rows[name], flush=True)
    facts = machine.cpu_and_load()
    publish(args.out, stem, render(rows, args, facts, time.perf_counter() - t0),
            {"args": vars(args), "facts": facts, "rows": rows})


def spawn_ranks(run_rank, name: str, args, tmp: str) -> dict:
    """run_rank(rank, world, name, args) -> dict on args.world_size fresh processes, each with
    args.threads torch threads; run_rank must be a module-level function (it is pickled)."""
    import torch.multiprocessing as mp

    t0 = time.perf_counter()
    error = None
    try:
        mp.spawn(_rank_process, args=(args.world_size, name, free_port(), run_rank, args, tmp),
                 nprocs=args.world_size, join=True)
    except Exception as exc:  # noqa: BLE001 -- keep going; the table shows the failure
        error = f"{type(exc).__name__}: {exc}"
    ranks = []
    for r in range(args.world_size):
        path = os.path.join(tmp, f"{name}.rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    errors = [r["error"] for r in ranks if "error" in r]
    return outcome(name, t0, ranks, errors[0] if errors else error)


def _rank_process(rank, world, name, port, run_rank, args, out_dir):
    import torch

    _die_with_parent()
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(args.threads)
    path = os.path.join(out_dir, f"{name}.rank{rank}.json")
    try:
        result = run_rank(rank, world, name, args)
    except Exception:  # noqa: BLE001 -- report, then let spawn see the failure
        with open(path, "w") as f:
            json.dump({"error": traceback.format_exc()}, f)
        raise
    with open(path, "w") as f:
        json.dump(result, f)


def _die_with_parent() -> None:
    """SIGTERM this rank when the benchmark process that spawned it dies (killed, crashed):
    a rank left running would hold memory and disk and skew the next run."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: nothing to set


def run_worker(command: list[str], result_flag: str, env: dict, timeout: float | None = None,
               capture: bool = False):
    """Runs `command result_flag <file>` and returns (the JSON the worker wrote to <file>, or
    None when it wrote nothing, and the CompletedProcess). subprocess.TimeoutExpired passes."""
    with tempfile.TemporaryDirectory(prefix="bench_worker_") as tmp:
        path = os.path.join(tmp, "result.json")
        proc = subprocess.run(command + [result_flag, path], env=env, capture_output=capture,
                              text=True, timeout=timeout)
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return None, proc
        with open(path) as f:
            return json.load(f), proc


def spawn_interleaved(run_rank, args, tmp: str, summarize) -> dict | None:
    """The interleaved timing run: every configuration in one set of ranks, stepping
    round-robin (run_rank handles the name "interleaved"); None with --interleaved-steps 0.
    Its summary (summarize(result)) is added and printed."""
    if args.interleaved_steps <= 0:
        return None
    interleaved = spawn_ranks(run_rank, "interleaved", args, tmp)
    interleaved["summary"] = summarize(interleaved)
    print(f"[interleaved] {json.dumps(interleaved['summary'], default=str)[:2000]}", flush=True)
    return interleaved
