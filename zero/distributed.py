"""``init_distributed``: join the process group from whatever launched us.

Rank discovery is a pure function of the environment (:func:`discover`), so it
can be tested without processes. Sources, first match wins:

=============  =============================================  ==========================
source         rank / world size                              local rank
=============  =============================================  ==========================
arguments      ``rank=``, ``world_size=`` passed in           ``LOCAL_RANK`` or 0
torch          ``RANK``, ``WORLD_SIZE`` (zero, torchrun)      ``LOCAL_RANK``
openmpi        ``OMPI_COMM_WORLD_RANK``, ``..._SIZE``         ``OMPI_COMM_WORLD_LOCAL_RANK``
mpich (PMI)    ``PMI_RANK``, ``PMI_SIZE``                     ``MPI_LOCALRANKID``
slurm          ``SLURM_PROCID``, ``SLURM_NTASKS``             ``SLURM_LOCALID``
(nothing)      rank 0 of 1 on 127.0.0.1, free port
=============  =============================================  ==========================

The rendezvous is ``MASTER_ADDR``/``MASTER_PORT``; under SLURM the address
defaults to the first host of the job's node list and the port to
``distributed_port``. The resolved values are written back to ``os.environ``
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...), like
DeepSpeed does, so the script can read them after the call.

This module imports torch only inside :func:`init_distributed`.
"""

import os
import re
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

from . import clean_exit

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500


MAX_TIMEOUT_MINUTES = 100_000  # about 69 days; more overflows the rendezvous's milliseconds


def _timeout_from_env(names=("ZERO_TIMEOUT", "DEEPSPEED_TIMEOUT"), minutes="30"):
    """The first of `names` set (DeepSpeed's DEEPSPEED_TIMEOUT after zero's own), in minutes."""
    name = next((n for n in names if n in os.environ), names[0])
    value = os.environ.get(name, minutes)
    if not value.strip().isdigit() or not 1 <= int(value) <= MAX_TIMEOUT_MINUTES:
        raise ValueError(f"{name}={value!r} must be a whole number of minutes from 1 to "
                         f"{MAX_TIMEOUT_MINUTES} (the process group's timeout)")
    return timedelta(minutes=int(value))


DEFAULT_TIMEOUT = _timeout_from_env()   # process-group timeout, in minutes


class DistributedEnvError(RuntimeError):
    """The environment describes no consistent place for this process."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: Optional[int]
    master_addr: Optional[str]
    master_port: Optional[int]
    source: str

    def as_env(self):
        """The torch-style variables for ``os.environ``."""
        env = {"RANK": self.rank, "WORLD_SIZE": self.world_size, "LOCAL_RANK": self.local_rank,
               "LOCAL_WORLD_SIZE": self.local_world_size,
               "MASTER_ADDR": self.master_addr, "MASTER_PORT": self.master_port}
        return {k: str(v) for k, v in env.items() if v is not None}


# (source, rank var, size var, local rank vars, local size vars)
_MPI_SOURCES = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
     ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("mpich (PMI)", "PMI_RANK", ("PMI_SIZE",),
     ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID"), ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE")),
    ("slurm", "SLURM_PROCID", ("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS"),
     ("SLURM_LOCALID",), ()),
)
_SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def discover(environ, rank=-1, world_size=-1, default_port=TORCH_DISTRIBUTED_DEFAULT_PORT,
             auto_mpi_discovery=True, need_master=True):
    """Where this process sits in the job, from ``environ`` (see module doc)."""
    source, rank, world, local_rank, local_world = _find_ranks(
        environ, rank, world_size, auto_mpi_discovery)
    if not 0 <= rank < world:
        raise DistributedEnvError(f"{source} says rank {rank} of world size {world}; "
                                  f"the rank must be in [0, {world})")
    addr, port = _find_master(environ, source, world, default_port) if need_master else (None, None)
    return DistInfo(rank, world, local_rank, local_world, addr, port, source)


def _find_ranks(environ, rank, world_size, auto_mpi_discovery):
    if rank >= 0 or world_size >= 0:
        if rank < 0 or world_size < 0:
            raise DistributedEnvError("pass both rank= and world_size= to init_distributed, "
                                      "or neither (to read them from the environment)")
        local = _int_var(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0
        return "arguments", rank, world_size, local, None
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return _torch_ranks(environ)
    if auto_mpi_discovery:
        for source in _MPI_SOURCES:
            if source[1] in environ:
                return _mpi_ranks(environ, *source)
    if "LOCAL_RANK" in environ:
        return _torch_ranks(environ)  # raises: names RANK and WORLD_SIZE as missing
    return "single process", 0, 1, 0, 1


def _torch_ranks(environ):
    _require(environ, ("RANK", "WORLD_SIZE"))
    rank, world = _int_var(environ, "RANK"), _int_var(environ, "WORLD_SIZE")
    if "LOCAL_RANK" in environ:
        local = _int_var(environ, "LOCAL_RANK")
    elif world == 1:
        local = 0
    else:
        raise DistributedEnvError("RANK and WORLD_SIZE are set but LOCAL_RANK is missing; "
                                  "export LOCAL_RANK (the rank's index on its node) or launch "
                                  "with `zero` / torchrun, which set it")
    local_world = _int_var(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else None
    return "torch", rank, world, local, local_world


def _mpi_ranks(environ, source, rank_var, size_vars, local_vars, local_size_vars):
    size_var = next((v for v in size_vars if v in environ), None)
    if size_var is None:
        raise DistributedEnvError(f"{rank_var} is set but {size_vars[0]} is missing; "
                                  f"the {source} environment is incomplete — launch through "
                                  f"{source}'s launcher or export {size_vars[0]}")
    rank, world = _int_var(environ, rank_var), _int_var(environ, size_var)
    local_var = next((v for v in local_vars + ("LOCAL_RANK",) if v in environ), None)
    if local_var is not None:
        local = _int_var(environ, local_var)
    elif world == 1:
        local = 0
    else:
        raise DistributedEnvError(f"{source}: {local_vars[0]} is missing, so the local rank is "
                                  f"unknown; export LOCAL_RANK")
    local_world = _local_world_size(environ, source, local_size_vars)
    return source, rank, world, local, local_world


def _local_world_size(environ, source, local_size_vars):
    for var in local_size_vars + ("LOCAL_WORLD_SIZE",):
        if var in environ:
            return _int_var(environ, var)
    if source == "slurm":
        per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        node = environ.get("SLURM_NODEID")
        if per_node and node is not None:
            counts = expand_tasks_per_node(per_node)
            if int(node) < len(counts):
                return counts[int(node)]
    return None


def _find_master(environ, source, world, default_port):
    port = _int_var(environ, "MASTER_PORT") if "MASTER_PORT" in environ else None
    if port is not None and not 0 < port < 65536:
        raise DistributedEnvError(f"MASTER_PORT={port} is not a valid TCP port (1..65535)")
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"], port or default_port
    if source == "slurm":
        nodelist = next((environ[v] for v in _SLURM_NODELIST_VARS if environ.get(v)), None)
        if nodelist:
            return expand_nodelist(nodelist)[0], port or default_port
    if world == 1:
        return "127.0.0.1", port or free_port()
    raise DistributedEnvError(
        f"{source} places this process at a rank of {world}, but MASTER_ADDR is not set, so "
        f"there is no rendezvous address; export MASTER_ADDR=<host of rank 0> and MASTER_PORT "
        f"(the zero launcher does this), or pass init_method='tcp://HOST:PORT'")


def _require(environ, names):
    missing = [n for n in names if n not in environ]
    if missing:
        present = [n for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if n in environ]
        raise DistributedEnvError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: the "
            f"environment sets {', '.join(present)}, but torch-style launchers (zero, torchrun) "
            f"set RANK, WORLD_SIZE and LOCAL_RANK together; export the missing variable, or "
            f"unset the others to run as a single process")


def _int_var(environ, name):
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise DistributedEnvError(f"{name}={value!r} is not an integer") from None


def free_port(host="127.0.0.1"):
    """A TCP port that was free a moment ago (bind to port 0 and ask)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def expand_nodelist(text):
    """Expand a SLURM node list: ``"n[01-03,07],gpu1"`` -> n01 n02 n03 n07 gpu1."""
    hosts = []
    for item in _split_outside_brackets(text.strip()):
        hosts.extend(_expand_node(item, text))
    if not hosts:
        raise DistributedEnvError(f"SLURM node list {text!r} names no hosts")
    return hosts


def _split_outside_brackets(text):
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_node(item, whole):
    match = re.search(r"\[([^\[\]]*)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise DistributedEnvError(f"SLURM node list {whole!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    tails = _expand_node(tail, whole)
    hosts = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise DistributedEnvError(f"SLURM node list {whole!r}: bad range {part!r}")
        for n in range(int(lo), int(hi or lo) + 1):
            hosts.extend(f"{head}{n:0{len(lo)}d}{t}" for t in tails)
    return hosts


def expand_tasks_per_node(text):
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (SLURM_TASKS_PER_NODE format)."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise DistributedEnvError(f"cannot parse SLURM tasks per node {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def default_backend():
    import torch
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(dist_backend=None, auto_mpi_discovery=True,
                     distributed_port=TORCH_DISTRIBUTED_DEFAULT_PORT, verbose=True,
                     timeout=DEFAULT_TIMEOUT, init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """Initialise ``torch.distributed`` from the launcher's environment.

    DeepSpeed's signature. A no-op when the default process group already
    exists or when ``dist_init_required is False``. ``dist_backend`` defaults
    to nccl when CUDA is available, else gloo. ``config`` is accepted for
    signature compatibility and not used.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        if verbose:
            _log(f"torch.distributed is already initialised (rank {dist.get_rank()} of "
                 f"{dist.get_world_size()}); nothing to do")
        return
    if dist_init_required is False:
        return
    info = discover(os.environ, rank, world_size, distributed_port, auto_mpi_discovery,
                    need_master=init_method is None)
    os.environ.update(info.as_env())
    backend = dist_backend or default_backend()
    if verbose and info.rank == 0:
        where = init_method or f"{info.master_addr}:{info.master_port}"
        _log(f"initialising {backend} for {info.world_size} rank(s) from the {info.source} "
             f"environment, rendezvous at {where}")
    try:
        dist.init_process_group(backend=backend, init_method=init_method or "env://",
                                timeout=timeout, rank=info.rank, world_size=info.world_size)
    except RuntimeError as error:
        if "EADDRINUSE" not in str(error):
            raise
        raise DistributedEnvError(
            f"zero: the rendezvous port {info.master_port} on {info.master_addr} is in use (another "
            "job, or one still shutting down): pass another --master_port to the launcher (or "
            "set MASTER_PORT)") from error
    clean_exit.note_process_group()


def _log(message):
    print(f"[zero.init_distributed] {message}", file=sys.stderr, flush=True)
