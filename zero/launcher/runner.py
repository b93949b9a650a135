"""``zero``: the job launcher, used like ``deepspeed``.

    zero [flags] train.py [script args]

1. Work out the job's resources, ``{host: [slots]}``: from the hostfile
   (filtered by --include/--exclude, trimmed by --num_nodes/--num_gpus/
   --num_procs), or from this machine when there is no hostfile.
2. Pick the mode:
   * local  - one node, or ``--no_ssh`` (one ``zero`` per node, torchrun
     style): run this node's ranks here, supervised by launch.py.
   * remote - several hosts: ssh/pdsh start one node launcher per host;
     slurm/openmpi/mpich start every rank.
3. Apply the environment rule (env.py) and run; the exit code is the job's.

See docs/LAUNCHER.md.
"""

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import OrderedDict

from zero.compat import deepspeed_alias

from . import env as envrule
from . import launch, multinode
from .hostfile import (HostfileError, limit_resources, read_hostfile, resolve_resources,
                       world_size)
from .supervisor import LaunchError, Supervisor, Worker

DLTS_HOSTFILE = "/job/hostfile"
LAUNCHERS = ("pdsh", "ssh", "slurm", "openmpi", "mpich")
RANK_LAUNCHERS = ("slurm", "openmpi", "mpich")   # the backend starts every rank
BACKEND_BINARY = {"pdsh": "pdsh", "ssh": "ssh", "slurm": "srun", "openmpi": "mpirun",
                  "mpich": "mpirun"}


class RunnerError(ValueError):
    """A command line that cannot be turned into a job."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="zero", description="Launch a (multi-node) zero job.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-H", "--hostfile", default=None,
                   help=f"MPI-style hostfile ('host slots=N' lines); {DLTS_HOSTFILE} is used "
                        f"if it exists and no hostfile is given")
    p.add_argument("-i", "--include", default="",
                   help="HOST[:SLOT,...][@HOST...]: use only these hosts/slots")
    p.add_argument("-e", "--exclude", default="",
                   help="HOST[:SLOT,...][@HOST...]: use everything but these hosts/slots")
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1,
                   help="GPUs (ranks) per node: slots 0..N-1")
    p.add_argument("--num_procs", type=int, default=-1,
                   help="CPU processes (ranks) per node; no CUDA_VISIBLE_DEVICES is set")
    p.add_argument("--master_addr", default="", help="rank 0's address (default: 127.0.0.1 "
                   "for one node, else the first host)")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--launcher", default="pdsh", type=str.lower, choices=LAUNCHERS,
                   help="multi-node backend")
    p.add_argument("--launcher_args", default="",
                   help="extra arguments for the backend, as one quoted string")
    p.add_argument("--no_ssh", action="store_true",
                   help="run only this node's ranks (start one zero per node, same flags, "
                        "own --node_rank)")
    p.add_argument("--node_rank", type=int, default=-1, help="this node's index with --no_ssh")
    p.add_argument("--no_ssh_check", action="store_true",
                   help="skip the passwordless-ssh check before a ssh/pdsh launch")
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--force_multi", action="store_true",
                   help="use the multi-node backend even for a single host")
    p.add_argument("--module", action="store_true", help="run the script as 'python -m'")
    p.add_argument("--no_python", action="store_true", help="run the script as an executable")
    p.add_argument("--no_local_rank", action="store_true",
                   help="do not append --local_rank=N to the script's arguments")
    p.add_argument("--enable_each_rank_log", default=None, metavar="DIR",
                   help="keep each rank's output in DIR/<time>_rank<N>.log (it is still "
                        "printed too); without it logs go to a temp dir kept on failure")
    p.add_argument("--rank_prefix", action="store_true",
                   help='prefix every line a rank prints with "[rank N] " (off by default, as '
                        'in deepspeed: output a script parses stays as it wrote it)')
    p.add_argument("--bind_cores_to_rank", action="store_true",
                   help="give each local rank an equal share of the cores (numactl/taskset)")
    p.add_argument("--bind_core_list", default=None, help="cores to share, e.g. 0-7,16-23")
    p.add_argument("--save_pid", action="store_true",
                   help="write the launcher's and ranks' pids to <tmpdir>/<zero pid>.zero")
    p.add_argument("--kill_grace", type=float, default=launch.DEFAULT_KILL_GRACE,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("--comment", default="", help="slurm: srun --comment")
    p.add_argument("--account", default="", help="slurm: srun --account")
    p.add_argument("--no_deepspeed_alias", action="store_true",
                   help="do not let the ranks import zero as `deepspeed` (by default zero's "
                        "launcher puts zero/compat/as_deepspeed first on their PYTHONPATH, so "
                        "the HF Trainer and Accelerate find it; also ZERO_DEEPSPEED_ALIAS=0)")
    p.add_argument("user_script", help="the training script (or module / executable)")
    p.add_argument("user_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p.parse_args(argv)


def check_numbers(args):
    """Flags whose value cannot describe a job are errors that name the flag (-1 is "unset")."""
    for flag in ("num_nodes", "num_gpus", "num_procs"):
        value = getattr(args, flag)
        if value != -1 and value < 1:
            raise RunnerError(f"--{flag} {value}: must be at least 1 (leave it out to use "
                              f"{'every host' if flag == 'num_nodes' else 'the default'})")
    if not 1 <= args.master_port <= 65535:
        raise RunnerError(f"--master_port {args.master_port}: must be a TCP port, 1..65535")
    if args.node_rank < -1:
        raise RunnerError(f"--node_rank {args.node_rank}: must be 0 or more (this node's index)")
    if args.kill_grace < 0:
        raise RunnerError(f"--kill_grace {args.kill_grace}: must be 0 or more seconds")
    if args.ssh_port is not None and not 1 <= args.ssh_port <= 65535:
        raise RunnerError(f"--ssh_port {args.ssh_port}: must be a TCP port, 1..65535")


# -- resources -----------------------------------------------------------------
def resolve_world(args, environ):
    """``(active, use_gpus, from_hostfile)`` for the command line."""
    if args.num_procs > 0 and args.num_gpus > 0:
        raise RunnerError("--num_procs (CPU ranks) and --num_gpus (GPU ranks) exclude each "
                          "other; pass one")
    if (args.include or args.exclude) and (args.num_nodes > 0 or args.num_gpus > 0
                                           or args.num_procs > 0):
        raise RunnerError("--include/--exclude cannot be combined with --num_nodes/--num_gpus/"
                          "--num_procs; express the selection with one of them")
    hostfile = args.hostfile
    if not hostfile and os.path.isfile(DLTS_HOSTFILE):
        hostfile = DLTS_HOSTFILE
        _note(f"using {DLTS_HOSTFILE} (no -H given)")
    if hostfile:
        active = resolve_resources(read_hostfile(hostfile), args.include, args.exclude)
        per_node = args.num_procs if args.num_procs > 0 else args.num_gpus
        return limit_resources(active, args.num_nodes, per_node), args.num_procs <= 0, True
    slots, use_gpus = _local_slots(args, environ)
    nodes = max(args.num_nodes, 1)
    if nodes > 1 and not args.no_ssh and args.launcher != "slurm":
        raise RunnerError(f"--num_nodes {nodes} needs a hostfile (-H) listing the hosts, or "
                          f"--no_ssh with one zero per node (--node_rank 0..{nodes - 1})")
    if nodes == 1:
        pool = OrderedDict(localhost=len(slots))
        active = resolve_resources(pool, args.include, args.exclude)
        active = OrderedDict((h, [slots[i] for i in s]) for h, s in active.items())
    else:
        active = OrderedDict((f"node{i}", list(slots)) for i in range(nodes))
    return active, use_gpus, False


def _local_slots(args, environ):
    """Slots of this machine: ``([ids], use_gpus)``."""
    if args.num_procs > 0:
        return list(range(args.num_procs)), False
    if args.num_gpus > 0:
        return list(range(args.num_gpus)), True
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    count = detect_gpu_count()
    if count == 0:
        _note("no GPU found and no --num_procs given: running 1 process "
              "(pass --num_procs N for N CPU processes)")
        return [0], False
    if visible and not (args.include or args.exclude):
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        if len(ids) == count:
            return ids, True   # deepspeed: respect CUDA_VISIBLE_DEVICES on a single node
    return list(range(count)), True


def detect_gpu_count():
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # no torch / broken driver: treat as no GPU
        return 0


# -- mode: local (this node) -----------------------------------------------------
def launch_flags(args, active, master_addr, use_gpus):
    """Flags for zero.launcher.launch shared by every node."""
    flags = [f"--world_info={launch.encode_world_info(active)}",
             f"--master_addr={master_addr}", f"--master_port={args.master_port}",
             f"--kill_grace={args.kill_grace}"]
    for name in ("no_python", "module", "no_local_rank", "rank_prefix", "bind_cores_to_rank"):
        if getattr(args, name):
            flags.append(f"--{name}")
    if use_gpus:
        flags.append("--use_gpus")
    if args.enable_each_rank_log:
        flags.append(f"--enable_each_rank_log={os.path.abspath(args.enable_each_rank_log)}")
    if args.bind_core_list:
        flags.append(f"--bind_core_list={args.bind_core_list}")
    if args.save_pid:
        flags.append(f"--save_pid={os.getpid()}")
    return flags


def local_node_rank(args, nodes):
    """This node's index: 0 for a plain single-node run, --node_rank with --no_ssh."""
    if not args.no_ssh:
        return 0
    node = args.node_rank if args.node_rank >= 0 else (0 if nodes == 1 else -1)
    if not 0 <= node < nodes:
        raise RunnerError(f"--no_ssh: the job has {nodes} node(s) (from --num_nodes or the "
                          f"hostfile), so it needs --node_rank in 0..{nodes - 1} "
                          f"(this node's index)")
    if nodes > 1 and not args.master_addr:
        raise RunnerError("--no_ssh with several nodes needs --master_addr (node 0's "
                          "address) and the same --master_port on every node")
    return node


def run_local(args, active, use_gpus, file_vars):
    node = local_node_rank(args, len(active))
    if not (args.no_python or args.module) and not os.path.isfile(args.user_script):
        raise RunnerError(f"{args.user_script}: no such file (the training script; give its "
                          f"path from {os.getcwd()}, or --module for 'python -m')")
    master_addr = args.master_addr or "127.0.0.1"
    argv = (launch_flags(args, active, master_addr, use_gpus) + [f"--node_rank={node}"]
            + [args.user_script] + args.user_args)
    ranks = len(active[list(active)[node]])
    _note(f"starting {ranks} of {world_size(active)} rank(s) on node {node}, "
          f"rendezvous {master_addr}:{args.master_port}")
    return launch.run_node(launch.parse_args(argv), envrule.local_env(os.environ, file_vars))


# -- mode: remote (several hosts) ------------------------------------------------
def remote_job(args, active, use_gpus, file_vars, from_hostfile):
    exports = envrule.remote_exports(os.environ, file_vars)
    cwd = os.path.abspath(".")
    exports["PYTHONPATH"] = ":".join(p for p in (cwd, exports.get("PYTHONPATH")) if p)
    srun_picks_hosts = args.launcher == "slurm" and not from_hostfile
    master_addr = args.master_addr or (None if srun_picks_hosts else list(active)[0])
    return multinode.RemoteJob(
        active={} if srun_picks_hosts else active, user_script=args.user_script,
        user_args=args.user_args, launch_flags=launch_flags(args, active, master_addr, use_gpus),
        exports=exports, master_addr=master_addr, master_port=args.master_port, cwd=cwd,
        job_id=uuid.uuid4().hex[:12], launcher_args=args.launcher_args, ssh_port=args.ssh_port,
        no_python=args.no_python, module=args.module, no_local_rank=args.no_local_rank)


def build_remote_workers(args, job, active, file_vars, log_dir):
    """``(workers, supervisor_options)`` for the chosen backend."""
    local = envrule.local_env(os.environ, file_vars)
    log = lambda name: os.path.join(log_dir, f"{name}.log")  # noqa: E731
    if args.launcher == "ssh":
        workers = [Worker(f"node {i} ({host})", argv, local, log(f"node{i}"),
                          stdin=subprocess.PIPE)
                   for i, (host, argv) in enumerate(multinode.ssh_commands(job))]
        return workers, {"what": "node"}
    if args.launcher == "pdsh":
        argv, env_updates, kill_argv = multinode.pdsh_command(job)
        env = dict(local, **env_updates)
        stop = lambda: _run_quietly(kill_argv, env)  # noqa: E731
        return [Worker("pdsh", argv, env, log("pdsh"))], {"watch_marker": True, "on_stop": stop}
    if args.launcher == "slurm":
        argv, env_updates = multinode.slurm_command(
            job, max(args.num_nodes, 1), len(next(iter(active.values()))), args.comment,
            args.account)
        return [Worker("srun", argv, dict(local, **env_updates), log("srun"))], {}
    build = multinode.openmpi_command if args.launcher == "openmpi" else multinode.mpich_command
    return [Worker("mpirun", build(job), local, log("mpirun"))], {}


def run_remote(args, active, use_gpus, file_vars, from_hostfile):
    binary = BACKEND_BINARY[args.launcher]
    if shutil.which(binary) is None:
        raise RunnerError(f"--launcher {args.launcher} needs `{binary}` on PATH; install it or "
                          f"choose another --launcher ({', '.join(LAUNCHERS)})")
    if args.launcher in ("ssh", "pdsh") and not args.no_ssh_check:
        check_ssh(list(active)[0], args.ssh_port)
    job = remote_job(args, active, use_gpus, file_vars, from_hostfile)
    log_dir = tempfile.mkdtemp(prefix="zero-node-logs-")
    workers, options = build_remote_workers(args, job, active, file_vars, log_dir)
    hidden = dataclasses.replace(job, exports={k: "***" for k in job.exports})
    for shown in build_remote_workers(args, hidden, active, file_vars, log_dir)[0]:
        _note(f"{shown.label}: {shlex.join(shown.argv)}")   # values may be secrets
    code = Supervisor(workers, grace=args.kill_grace, **options).run()
    if code == 0:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        _note(f"backend logs kept in {log_dir}")
    return code


def check_ssh(host, port):
    argv = ["ssh", "-o", "BatchMode=yes"] + (["-p", str(port)] if port else []) + [host, "true"]
    try:
        ok = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    if not ok:
        raise RunnerError(f"cannot reach {host} with passwordless ssh ({shlex.join(argv)} "
                          f"failed); set up ssh keys, fix the hostfile, or pass --no_ssh_check")


def _run_quietly(argv, env):
    try:
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


# -- entry point ----------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    try:
        check_numbers(args)
        _alias_deepspeed(args)
        env_file, file_vars = envrule.load_env_file()
        if env_file:
            _note(f"env file {env_file}: {', '.join(sorted(file_vars)) or '(empty)'}")
        active, use_gpus, from_hostfile = resolve_world(args, os.environ)
        remote = not args.no_ssh and (len(active) > 1 or args.force_multi)
        if remote:
            return run_remote(args, active, use_gpus, file_vars, from_hostfile)
        return run_local(args, active, use_gpus, file_vars)
    except (RunnerError, HostfileError, envrule.EnvFileError, launch.LaunchConfigError,
            multinode.MultiNodeError, LaunchError) as e:
        print(f"zero: error: {e}", file=sys.stderr, flush=True)
        return 2


def _alias_deepspeed(args):
    """The ranks import zero as `deepspeed` (zero/compat/deepspeed_alias.py), unless asked not
    to; a real DeepSpeed installed here is named, since the ranks will not see it."""
    if args.no_deepspeed_alias:
        os.environ[deepspeed_alias.ENV_SWITCH] = "0"
    added = deepspeed_alias.launcher_environment(os.environ)
    if not added:
        return
    real = deepspeed_alias.real_deepspeed_origin()
    if real:
        _note(f"the ranks import zero as `deepspeed`, not the DeepSpeed installed at "
              f"{os.path.dirname(real)}; --no_deepspeed_alias keeps that one")
    os.environ.update(added)


def _note(message):
    print(f"[zero] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
