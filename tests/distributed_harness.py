"""Run a function on N local ranks (gloo on localhost) and collect what each returns.

    results = run_distributed(fn, world_size=2, args=(...), timeout=60)

`fn(rank, world_size, *args)` must be a module-level function (it is pickled by reference).
Children come from a forkserver that has already imported torch, zero, pytest and
transformers, so each rank starts in well under a second and never inherits the test
runner's threads. The test's own process serves the rendezvous store, on a port the OS picks
as it binds it (a port found free and bound later by a rank could be taken meanwhile:
EADDRINUSE); the ranks leave together.

Failure handling, so that no test can hang CI:
  * the first rank that raises ends the run: the others are killed and the test fails with
    that rank's traceback;
  * a rank that dies without reporting (segfault, os._exit) fails the run with its exit code;
  * after `timeout` seconds every rank is killed and the test fails naming the ranks that
    had not finished.
"""
from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from typing import Any, Callable, Sequence

_CONTEXT = mp.get_context("forkserver")
# What nearly every rank imports (test modules import pytest; the Hugging Face models' tests,
# transformers at their top): imported once in the forkserver, not again in each rank (0.1 s
# and 1.7 s a rank on a 2-core machine). Then what the heavier ranks import on top: torch's
# compiler stack (torch._dynamo, sympy: 2.2 s a rank; torch.optim's and torch.distributed.
# tensor's users import it) and transformers' model classes (modeling_utils: 2.1 s more), which
# every rank that builds a Hugging Face model paid (2026-11-30: 169 of 538 ranks of ten engine
# test files; test_auto_ep's 94 ranks spent 5 s of CPU each, most of it these imports). A
# module that is not installed is skipped.
_CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "zero.engine", "zero.api",
                                 "pytest", "transformers", "torch._dynamo",
                                 "transformers.modeling_utils", "forkserver_frozen"])


class RankFailed(AssertionError):
    """A rank raised, died, or did not finish in time."""


_PORTS_GIVEN: set[int] = set()
_PORT_BAND = 2000  # ports per pytest-xdist worker, below the kernel's ephemeral range


def free_port() -> int:
    """A port for a job a test launches, which binds it later. bind(0) would answer from the
    kernel's ephemeral range, where any client socket (a gloo connection of a job running
    beside this one) may take it before the job binds; so the port comes from below that
    range, from a band of this xdist worker's own, and is never handed out twice here."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    low = ephemeral_low - _PORT_BAND * (worker + 1)
    if low < 1024:  # no room below the range (many workers, or a range that starts low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    start = os.getpid() % _PORT_BAND
    for offset in range(_PORT_BAND):
        port = low + (start + offset) % _PORT_BAND
        if port in _PORTS_GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{low + _PORT_BAND - 1}")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_SITE = os.path.join(REPO, "tests", "job_site")
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a job started as a subprocess (a launcher, a script):
    without the rank variables a test runner may carry, the checkout on PYTHONPATH, after
    tests/job_site (its sitecustomize lets each process's garbage collector run less often,
    and hides comet_ml, as most machines are without it)."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([JOB_SITE, REPO])
    env["ZERO_TEST_WITHOUT"] = "comet_ml"
    env.update(extra)
    return env


def launcher_argv(procs: int, *rest: str) -> list[str]:
    """`zero --num_procs N --master_port <free> REST...` as this Python runs it."""
    import sys

    return [sys.executable, "-m", "zero.launcher.runner", "--num_procs", str(procs),
            "--master_port", str(free_port()), *map(str, rest)]


def run_job(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd=None):
    """Runs a job started as a subprocess (launcher_argv's, or a launcher of its own) to its
    end, one OpenMP thread per rank unless `env` says otherwise; a non-zero exit fails the
    test with the tails of its output. Returns the finished process."""
    import subprocess

    env = subprocess_env(OMP_NUM_THREADS="1") if env is None else env
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, \
        f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _rank_main(fn, rank, world_size, port, args, kwargs, results, timeout, env, backend):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    os.environ.update(env)  # after the defaults: a test may put every rank on LOCAL_RANK 0
    torch.set_num_threads(1)  # N ranks share 2 cores
    # A rank still running just before the run's deadline prints where it is stuck (stderr).
    faulthandler.dump_traceback_later(max(timeout - 3, 1))
    try:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle copies tensors into the message; the queue's own pickler would share
        # them through file descriptors that die with this process.
        results.put((rank, "ok", pickle.dumps(value)))
        _leave_together(store, rank, world_size)
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1)
    finally:
        faulthandler.cancel_dump_traceback_later()
        if dist.is_initialized():
            dist.destroy_process_group()


_FINISHED = "distributed_harness/finished"
_LEFT = "distributed_harness/left"


def _leave_together(store, rank, world_size, patience=30.0):
    """No rank exits while another is still in its function: a rank still in a last
    collective's set-up loses the connection to a peer that has returned from its side and
    exited (gloo's new_group connects every pair of ranks: "Connection closed by peer"; it
    also reads its peers' addresses from the store: "Connection reset by peer"). Rank 0
    leaves last, once the others have stopped reading the store."""
    store.add(_FINISHED, 1)
    _wait_for(store, _FINISHED, world_size, patience)
    if rank != 0:
        store.add(_LEFT, 1)
        return
    _wait_for(store, _LEFT, world_size - 1, patience)


def _wait_for(store, key, count, patience):
    deadline = time.monotonic() + patience
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill_all(processes):
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


def run_distributed(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
                    kwargs: dict | None = None, timeout: float = 90.0,
                    env: dict[str, str] | None = None, backend: str = "gloo") -> list[Any]:
    """Runs fn on `world_size` ranks; returns the per-rank results in rank order. `env` is
    set in every rank after the harness's own variables (RANK, LOCAL_RANK, ...), so it may
    override them; `backend` is the process group's ("nccl" sets the CUDA device first)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))  # bound here, port 0
    port = store.port
    results = _CONTEXT.Queue()
    processes = [
        _CONTEXT.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, tuple(args), kwargs or {}, results, timeout,
                  env or {}, backend),
            name=f"rank{rank}", daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()

    deadline = time.monotonic() + timeout
    values: dict[int, Any] = {}
    try:
        while len(values) < world_size:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue_module.Empty:
                _check_alive(processes, values, results)
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise RankFailed(f"timed out after {timeout:.0f}s; ranks {missing} of "
                                     f"{world_size} did not finish")
                continue
            if status == "error":
                raise RankFailed(_silent_deaths(processes, rank) +
                                 f"rank {rank} of {world_size} raised:\n{value}")
            values[rank] = pickle.loads(value)
    finally:
        if len(values) < world_size:
            _kill_all(processes)
        else:
            _join_all(processes)
        del store  # (after the ranks: they read it to the end)
    return [values[rank] for rank in range(world_size)]


def _check_alive(processes, values, results):
    """Fails the run if a rank exited non-zero, preferring its own error report."""
    for rank, process in enumerate(processes):
        if rank in values or process.is_alive() or process.exitcode in (None, 0):
            continue
        try:  # a rank that raised reported first; its traceback is the better message
            reporter, status, value = results.get(timeout=1.0)
            if status == "error":  # (after any rank that died silently: a peer's error follows)
                raise RankFailed(_silent_deaths(processes, reporter) +
                                 f"rank {reporter} of {len(processes)} raised:\n{value}")
            values[reporter] = pickle.loads(value)
        except queue_module.Empty:
            pass
        raise RankFailed(f"rank {rank} died with exit code {process.exitcode} "
                         "without reporting an error")


def _silent_deaths(processes, reporter) -> str:
    """A rank that died silently is usually why a peer's collective failed: name it first."""
    time.sleep(0.3)  # let a dying rank's exit code settle
    lines = [f"rank {rank} died with exit code {process.exitcode} without reporting an error\n"
             for rank, process in enumerate(processes)
             if rank != reporter and not process.is_alive() and process.exitcode not in (None, 0, 1)]
    return "".join(lines)


def _join_all(processes):
    for process in processes:
        process.join(timeout=10)
    _kill_all(processes)
