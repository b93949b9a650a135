"""A finished job exits 0: let torch.distributed's worker threads finish before Python finalizes.

A gloo worker thread drops its finished work object, and the tensors in it, just after the
collective completes. Dropping a tensor that has a Python object takes the GIL. When the main
thread has meanwhile run off the end of the script into interpreter finalization, CPython ends
the worker with ``pthread_exit``; unwinding through the work's ``noexcept`` destructor calls
``std::terminate`` and the rank dies of SIGABRT ("terminate called without an active
exception") after its last line ran. Seen here in about 1 of 5 two-rank gloo jobs, with or
without zero's code (pytorch/pytorch#190489).

The cure is to hand such threads the GIL before finalization starts: :func:`release_workers`
sleeps briefly with the GIL released. It is registered with ``atexit`` when zero is imported, so
it runs after every exit handler registered later (zero's engine teardown included), and only
in processes that used a process group, or in a rank that zero's launcher started (its
rank_startup/sitecustomize.py loads this file before the user's script, which may never import
zero: a plain DDP script under the launcher failed 6 runs in 25 without it). This module imports
nothing but the standard library, so that it can be loaded on its own.
"""
import atexit
import sys
import time

# Long enough for a worker already waiting for the GIL to take it and drop its work, with room
# for a busy machine; short enough not to be noticed at exit.
GRACE_SECONDS = 0.2

_used_process_group = False
_launched_rank = False


def note_process_group() -> None:
    """Record that this process joined a process group (called by init_distributed and the
    engine), so the grace applies even when the group was destroyed before exit."""
    global _used_process_group
    _used_process_group = True


def note_launched_rank() -> None:
    """This process is a rank that zero's launcher started: the grace applies if it used
    torch.distributed at all (a script may destroy its group before the end and still race)."""
    global _launched_rank
    _launched_rank = True


def _used_torch_distributed() -> bool:
    return "torch.distributed" in sys.modules


def _process_group_alive() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


@atexit.register
def release_workers() -> None:
    if _used_process_group or (_launched_rank and _used_torch_distributed()) \
            or _process_group_alive():
        time.sleep(GRACE_SECONDS)  # releases the GIL
