"""The per-node launcher: start this node's ranks and supervise them.

Started by ``zero`` (in-process for local runs, through ssh/pdsh for remote
nodes)::

    python -m zero.launcher.launch --world_info=B64 --node_rank=1 \\
        --master_addr=10.0.0.1 --master_port=29500 train.py --lr 0.1

``--world_info`` is the job's ``{host: [slots]}`` (see hostfile.py), so every
node derives the same global ranks. Each rank gets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` (and ``CUDA_VISIBLE_DEVICES`` with
``--use_gpus``) and, unless ``--no_local_rank``, a ``--local_rank=N`` argument
before the script's own (DeepSpeed's order). Output passes through as the rank
wrote it (``--rank_prefix`` prefixes every line with ``[rank N] ``); when this
launcher's console is a terminal, ranks get ``ZERO_CONSOLE_IS_TTY=1`` (their own
output is a pipe) so that their progress bars draw.

``--rank_from_env`` is the one-rank mode used under srun/mpirun: read this
process's rank from the MPI/SLURM environment, set the same variables and
``exec`` the script.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

from .env import CONSOLE_IS_TTY
from .hostfile import rank_layout, world_size
from .supervisor import LaunchError, Supervisor, Worker

DEFAULT_KILL_GRACE = 5.0
RANK_STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_startup")


class LaunchConfigError(ValueError):
    """The launch arguments do not describe a runnable node."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m zero.launcher.launch",
                                description="Start and supervise one node's ranks.")
    p.add_argument("--world_info", default="", help="base64 JSON of [[host, [slots]], ...]")
    p.add_argument("--node_rank", default="0", help="index of this node, or its hostname")
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--use_gpus", action="store_true", help="set CUDA_VISIBLE_DEVICES from slots")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--enable_each_rank_log", default=None, metavar="DIR")
    p.add_argument("--rank_prefix", action="store_true",
                   help='prefix every output line with "[rank N] "')
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", default=None)
    p.add_argument("--save_pid", default=None, metavar="MAIN_PID",
                   help="write {launcher, ranks} pids to <tmpdir>/<MAIN_PID>.zero")
    p.add_argument("--pid_file", default=None, help="write this launcher's pid here")
    p.add_argument("--exit_on_stdin_eof", action="store_true",
                   help="stop all ranks when stdin closes (the ssh session ended)")
    p.add_argument("--kill_grace", type=float, default=DEFAULT_KILL_GRACE,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("--rank_from_env", action="store_true",
                   help="run ONE rank whose place comes from the MPI/SLURM environment")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


# -- world info --------------------------------------------------------------
def encode_world_info(active):
    text = json.dumps([[host, list(slots)] for host, slots in active.items()])
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_world_info(text):
    if not text:
        raise LaunchConfigError("--world_info is required (the zero runner passes it)")
    try:
        pairs = json.loads(base64.urlsafe_b64decode(text.encode()).decode())
        return OrderedDict((str(host), [int(s) for s in slots]) for host, slots in pairs)
    except (ValueError, TypeError) as e:
        raise LaunchConfigError(f"--world_info is not valid: {e}") from None


def node_index(active, node_rank):
    """``--node_rank`` as an index: a number, or one of the world's host names."""
    hosts = list(active)
    if str(node_rank) in hosts:
        return hosts.index(str(node_rank))
    try:
        index = int(node_rank)
    except ValueError:
        raise LaunchConfigError(f"--node_rank {node_rank!r} is neither a number nor one of "
                                f"the hosts {hosts}") from None
    if not 0 <= index < len(hosts):
        raise LaunchConfigError(f"--node_rank {index} is out of range: the job has "
                                f"{len(hosts)} node(s), so use 0..{len(hosts) - 1}")
    return index


# -- one rank ----------------------------------------------------------------
def user_command(script, script_args, local_rank, no_python=False, module=False,
                 no_local_rank=False):
    """The argv that runs the user's program for one rank."""
    if no_python and module:
        raise LaunchConfigError("--no_python and --module cannot be combined")
    if no_python:
        head = [script]
    else:
        head = [sys.executable, "-u"] + (["-m"] if module else []) + [script]
    local = [] if no_local_rank else [f"--local_rank={local_rank}"]
    return head + local + list(script_args)   # DeepSpeed's order: --local_rank=N first


def rank_env(base, active, node, global_rank, local_rank, master_addr, master_port,
             use_gpus=False):
    """``base`` plus the variables that place one rank in the job."""
    hosts = list(active)
    slots = active[hosts[node]]
    env = dict(base)
    env.update(RANK=str(global_rank), LOCAL_RANK=str(local_rank),
               WORLD_SIZE=str(world_size(active)), LOCAL_WORLD_SIZE=str(len(slots)),
               LOCAL_SIZE=str(len(slots)), CROSS_RANK=str(node), CROSS_SIZE=str(len(hosts)),
               GROUP_RANK=str(node), MASTER_ADDR=str(master_addr), MASTER_PORT=str(master_port))
    if use_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
    return with_exit_grace(env)


def with_exit_grace(env):
    """``env`` with rank_startup/ first on PYTHONPATH (before zero's `deepspeed` alias folder:
    each sitecustomize runs the next) and ZERO_EXIT_GRACE=1: the rank's first
    Python process takes zero.clean_exit's exit grace even if the script never imports zero
    (rank_startup/sitecustomize.py)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != RANK_STARTUP]
    return dict(env, PYTHONPATH=os.pathsep.join([RANK_STARTUP] + rest), ZERO_EXIT_GRACE="1")


# -- core binding ------------------------------------------------------------
def parse_core_list(text):
    """``"0,2-4,7"`` -> ``[0, 2, 3, 4, 7]``."""
    cores = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise LaunchConfigError(f"--bind_core_list {text!r}: expected numbers and ranges "
                                    f"like 0,2-4,7")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(cores))


def cores_for_rank(cores, local_rank, local_world):
    """An equal, contiguous share of ``cores`` for one local rank."""
    per_rank = len(cores) // local_world
    if per_rank == 0:
        raise LaunchConfigError(f"--bind_cores_to_rank: {len(cores)} core(s) cannot be shared "
                                f"by {local_world} ranks; give more cores or fewer ranks")
    return cores[local_rank * per_rank:(local_rank + 1) * per_rank]


def bind_prefix(cores):
    listed = ",".join(str(c) for c in cores)
    for tool, flag in (("numactl", "-C"), ("taskset", "-c")):
        if shutil.which(tool):
            return [tool, flag, listed]
    raise LaunchConfigError("--bind_cores_to_rank needs numactl or taskset on PATH; install "
                            "one of them or drop the flag")


# -- the node ----------------------------------------------------------------
def open_log_dir(each_rank_log):
    """``(dir, is_temporary)``: the user's log dir, or a fresh temp dir."""
    if each_rank_log:
        os.makedirs(each_rank_log, exist_ok=True)
        return each_rank_log, False
    return tempfile.mkdtemp(prefix="zero-rank-logs-"), True


def build_workers(args, active, node, log_dir, base_env):
    layout = rank_layout(active, node)
    all_cores = None
    if args.bind_cores_to_rank:
        all_cores = (parse_core_list(args.bind_core_list) if args.bind_core_list
                     else sorted(os.sched_getaffinity(0)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stdin = subprocess.DEVNULL if args.exit_on_stdin_eof else None
    console_is_tty = sys.stderr.isatty()   # ranks write to pipes: tell their progress bars
    workers = []
    for global_rank, local_rank, _slot in layout:
        env = rank_env(base_env, active, node, global_rank, local_rank, args.master_addr,
                       args.master_port, args.use_gpus)
        argv = user_command(args.user_script, args.user_args, local_rank, args.no_python,
                            args.module, args.no_local_rank)
        if console_is_tty:
            env[CONSOLE_IS_TTY] = "1"
        if all_cores is not None:
            cores = cores_for_rank(all_cores, local_rank, len(layout))
            env["OMP_NUM_THREADS"] = str(len(cores))
            argv = bind_prefix(cores) + argv
        name = f"rank{global_rank}.log"
        if args.enable_each_rank_log:
            name = f"{stamp}_{name}"
        prefix = f"[rank {global_rank}] " if args.rank_prefix else ""
        workers.append(Worker(f"rank {global_rank}", argv, env, os.path.join(log_dir, name),
                              prefix=prefix, stdin=stdin))
    return workers


def exec_rank_from_env(args):
    """srun/mpirun mode: become the one rank this process is (returns only on error)."""
    from ..distributed import DistributedEnvError, discover
    try:
        info = discover(os.environ, default_port=args.master_port)
    except DistributedEnvError as e:
        _say(f"error: {e}")
        return 2
    env = with_exit_grace(dict(os.environ, **info.as_env()))
    argv = user_command(args.user_script, args.user_args, info.local_rank, args.no_python,
                        args.module, args.no_local_rank)
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        _say(f"error: cannot run {argv[0]}: {e.strerror}")
        return 127


def _write_pid_file(args):
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")


def _save_pids(args, workers):
    if args.save_pid:
        path = os.path.join(tempfile.gettempdir(), f"{args.save_pid}.zero")
        with open(path, "w") as f:
            json.dump({"launcher": os.getpid(),
                       "ranks": {w.label: w.proc.pid for w in workers if w.proc}}, f)


def _remove_pid_files(args):
    paths = [args.pid_file] if args.pid_file else []
    if args.save_pid:
        paths.append(os.path.join(tempfile.gettempdir(), f"{args.save_pid}.zero"))
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass


def run_node(args, base_env=None):
    """Run this node's ranks to completion; returns the exit code."""
    active = decode_world_info(args.world_info)
    node = node_index(active, args.node_rank)
    log_dir, temporary = open_log_dir(args.enable_each_rank_log)
    workers = build_workers(args, active, node, log_dir,
                            os.environ if base_env is None else base_env)
    supervisor = Supervisor(workers, grace=args.kill_grace, watch_stdin=args.exit_on_stdin_eof,
                            on_started=lambda: _save_pids(args, workers))
    try:
        _write_pid_file(args)
        code = supervisor.run()
    finally:
        _remove_pid_files(args)
    if temporary and code == 0:
        shutil.rmtree(log_dir, ignore_errors=True)
    elif temporary:
        _say(f"rank logs kept in {log_dir}")
    return code


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.rank_from_env:
            return exec_rank_from_env(args)
        return run_node(args)
    except (LaunchConfigError, LaunchError) as e:
        _say(f"error: {e}")
        return 2


def _say(message):
    print(f"[zero.launch] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
