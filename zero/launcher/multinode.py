"""Command lines that start a job on several machines.

Pure functions: they build argv lists and never run anything, so they are
unit-tested as strings. Two families:

* ssh / pdsh start ``zero.launcher.launch`` once per node; it starts and
  supervises that node's ranks (same code as a local run).
* slurm / openmpi / mpich start every rank themselves; each rank runs
  ``zero.launcher.launch --rank_from_env``, which reads its rank from the
  SLURM/MPI environment, sets the same variables as a local run and ``exec``s
  the script. These backends work on whole hosts (no per-slot selection).
"""

import shlex
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

PDSH_FAN_OUT = 1024


class MultiNodeError(ValueError):
    """The job cannot be expressed with the chosen backend."""


@dataclass
class RemoteJob:
    active: Dict[str, List[int]]        # {host: [slots]} in rank order
    user_script: str
    user_args: List[str]
    launch_flags: List[str]             # flags shared by every node's zero.launcher.launch
    exports: Dict[str, str]             # variables to set on the remote side (env.py rule)
    master_addr: Optional[str]
    master_port: int
    cwd: str
    job_id: str = "job"
    launcher_args: str = ""
    ssh_port: Optional[int] = None
    no_python: bool = False
    module: bool = False
    no_local_rank: bool = False
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def hosts(self):
        return list(self.active)

    @property
    def total_ranks(self):
        return sum(len(s) for s in self.active.values())


# -- ssh / pdsh: one zero.launcher.launch per node ----------------------------
def remote_shell_command(job, node_rank, node_flags=()):
    """The shell line a remote node runs: cd, export, exec the node launcher."""
    launch = [job.python, "-u", "-m", "zero.launcher.launch", f"--node_rank={node_rank}",
              *job.launch_flags, *node_flags, job.user_script, *job.user_args]
    steps = [f"cd {shlex.quote(job.cwd)}"]
    if job.exports:
        steps.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in job.exports.items()))
    steps.append("exec " + " ".join(shlex.quote(a) for a in launch))
    return " && ".join(steps)


def ssh_commands(job):
    """``[(host, argv)]``: one ssh per node. The node launcher watches its
    stdin, so when our ssh process ends (job stopped) the remote ranks stop."""
    base = ["ssh", "-o", "BatchMode=yes"]
    if job.ssh_port is not None:
        base += ["-p", str(job.ssh_port)]
    base += shlex.split(job.launcher_args)
    return [(host, base + [host, remote_shell_command(job, i, ["--exit_on_stdin_eof"])])
            for i, host in enumerate(job.hosts)]


def pdsh_pid_file(job):
    return f"/tmp/zero-launch-{job.job_id}-%n.pid"   # pdsh replaces %n by the host


def pdsh_command(job):
    """``(argv, env_updates, kill_argv)``. pdsh puts the host name in ``%n``;
    the node launcher accepts it as ``--node_rank``. ``kill_argv`` signals each
    node launcher by the pid it wrote, which stops its ranks."""
    hosts = ",".join(job.hosts)
    pdsh = ["pdsh", "-S", "-f", str(PDSH_FAN_OUT), "-w", hosts] + shlex.split(job.launcher_args)
    pid_file = pdsh_pid_file(job)
    argv = pdsh + [remote_shell_command(job, "%n", [f"--pid_file={pid_file}"])]
    kill_argv = pdsh + [f"kill -TERM $(cat {pid_file}) 2>/dev/null; true"]
    env = {"PDSH_RCMD_TYPE": "ssh"}
    if job.ssh_port is not None:
        env["PDSH_SSH_ARGS_APPEND"] = f"-p {job.ssh_port}"
    return argv, env, kill_argv


# -- slurm / openmpi / mpich: the backend starts every rank -------------------
def rank_program(job):
    """What srun/mpirun runs once per rank."""
    argv = [job.python, "-u", "-m", "zero.launcher.launch", "--rank_from_env",
            f"--master_port={job.master_port}"]
    for flag in ("no_python", "module", "no_local_rank"):
        if getattr(job, flag):
            argv.append(f"--{flag}")
    return argv + [job.user_script] + list(job.user_args)


def _rendezvous_exports(job):
    env = dict(job.exports)
    if job.master_addr:
        env["MASTER_ADDR"] = job.master_addr
    env["MASTER_PORT"] = str(job.master_port)
    return env


def _uniform_ranks_per_host(job, backend):
    for host, slots in job.active.items():
        if list(slots) != list(range(len(slots))):
            raise MultiNodeError(f"--launcher {backend} runs whole hosts, but {host} uses slots "
                                 f"{slots}; select slots with --launcher ssh/pdsh, or use "
                                 f"--num_gpus/--num_procs instead of slot lists")
    counts = {len(s) for s in job.active.values()}
    return counts


def openmpi_command(job):
    _uniform_ranks_per_host(job, "openmpi")
    hosts = ",".join(f"{h}:{len(s)}" for h, s in job.active.items())
    argv = ["mpirun", "-np", str(job.total_ranks), "-H", hosts, "--bind-to", "none"]
    argv += shlex.split(job.launcher_args)
    for k, v in _rendezvous_exports(job).items():
        argv += ["-x", f"{k}={v}"]
    return argv + rank_program(job)


def mpich_command(job):
    counts = _uniform_ranks_per_host(job, "mpich")
    if len(counts) != 1:
        raise MultiNodeError("--launcher mpich needs the same number of ranks on every host; "
                             "use --num_gpus/--num_procs to make them equal")
    argv = ["mpirun", "-n", str(job.total_ranks), "-ppn", str(counts.pop()),
            "-hosts", ",".join(job.hosts)] + shlex.split(job.launcher_args)
    for k, v in _rendezvous_exports(job).items():
        argv += ["-genv", k, v]
    return argv + rank_program(job)


def slurm_command(job, num_nodes=None, ranks_per_node=None, comment="", account=""):
    """``(argv, env_updates)`` for srun inside an allocation.

    With a hostfile the hosts come from ``job.active``; without one pass
    ``num_nodes``/``ranks_per_node`` and SLURM picks the nodes (rank 0's node
    is then found from SLURM_NODELIST). ``--export=ALL`` forwards srun's whole
    environment, so the env-file and rendezvous variables travel as
    ``env_updates`` to srun's own environment (values may contain commas)."""
    if job.active:
        counts = _uniform_ranks_per_host(job, "slurm")
        if len(counts) != 1:
            raise MultiNodeError("--launcher slurm needs the same number of ranks on every "
                                 "host; use --num_gpus/--num_procs to make them equal")
        num_nodes, ranks_per_node = len(job.active), counts.pop()
    argv = ["srun", "-n", str(num_nodes * ranks_per_node), "--nodes", str(num_nodes),
            "--ntasks-per-node", str(ranks_per_node)]
    if job.active:
        argv += ["--nodelist", ",".join(job.hosts)]
    if comment:
        argv += ["--comment", comment]
    if account:
        argv += ["--account", account]
    argv += shlex.split(job.launcher_args) + ["--export=ALL"]
    return argv + rank_program(job), _rendezvous_exports(job)
