"""The zero launcher's pure parts, in process: command-line errors, the rank command and
environment, world info, core lists, the supervisor's failure marker, and the command lines of
the multi-node backends (ssh, pdsh, OpenMPI, MPICH, Slurm)."""
import os
import signal
import sys
import time
from collections import OrderedDict

import pytest

from zero.launcher import env as envrule
from zero.launcher import launch, multinode, runner
from zero.launcher.supervisor import Supervisor, Worker, describe_exit


# -- command-line errors (in process, nothing is started) -------------------------
@pytest.mark.parametrize("args, message", [
    (["-H", "{bad}", "s.py"], "{bad}:2: cannot parse"),
    (["-H", "{hosts}", "-i", "h9", "s.py"], "'h9' is not in the hostfile"),
    (["--num_procs", "2", "--num_gpus", "2", "s.py"], "exclude each other"),
    (["-i", "localhost:0", "--num_nodes", "1", "s.py"], "cannot be combined"),
    (["--num_nodes", "2", "--num_procs", "1", "s.py"], "needs a hostfile"),
    (["--no_ssh", "--num_nodes", "2", "--num_procs", "1", "s.py"], "needs --node_rank in 0..1"),
    (["--no_ssh", "--num_nodes", "2", "--node_rank", "1", "--num_procs", "1", "s.py"],
     "needs --master_addr"),
    (["-H", "{hosts}", "--launcher", "openmpi", "-e", "h1:0", "--no_ssh_check", "s.py"],
     "runs whole hosts"),
    (["--num_procs", "0", "s.py"], "--num_procs 0: must be at least 1"),
    (["--num_gpus", "-2", "s.py"], "--num_gpus -2: must be at least 1"),
    (["--num_nodes", "0", "s.py"], "--num_nodes 0: must be at least 1"),
    (["--num_procs", "2", "--master_port", "70000", "s.py"], "--master_port 70000: must be"),
    (["--num_procs", "2", "--kill_grace", "-1", "s.py"], "--kill_grace -1.0: must be 0 or more"),
    (["--num_procs", "2", "missing.py"], "missing.py: no such file"),
])
def test_cli_errors_are_clear(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)                       # no env file can leak in
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(envrule.ENV_FILE_VARIABLE, raising=False)
    (tmp_path / "bad").write_text("h1 slots=2\nh2 slots=two\n")
    (tmp_path / "hosts").write_text("h1 slots=2\nh2 slots=2\n")
    monkeypatch.setattr(runner.shutil, "which", lambda name: f"/usr/bin/{name}")
    paths = {"bad": str(tmp_path / "bad"), "hosts": str(tmp_path / "hosts")}
    assert runner.main([a.format(**paths) for a in args]) == 2
    assert message.format(**paths) in capsys.readouterr().err


# -- pure pieces -------------------------------------------------------------------
def test_user_command_and_rank_env():
    py = sys.executable
    assert launch.user_command("t.py", ["-a"], 1) == [py, "-u", "t.py", "--local_rank=1", "-a"]
    assert launch.user_command("pkg.m", [], 0, module=True, no_local_rank=True) == \
        [py, "-u", "-m", "pkg.m"]
    assert launch.user_command("./run", [], 2, no_python=True) == ["./run", "--local_rank=2"]
    active = OrderedDict([("a", [0, 1]), ("b", [2, 5])])
    env = launch.rank_env({"X": "1"}, active, 1, 3, 1, "a", 29500, use_gpus=True)
    assert env == {"X": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                   "LOCAL_WORLD_SIZE": "2", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
                   "CROSS_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "a",
                   "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "2,5",
                   "PYTHONPATH": launch.RANK_STARTUP, "ZERO_EXIT_GRACE": "1"}
    # The rank start-up folder goes first, once, before what the job had.
    env = launch.rank_env({"PYTHONPATH": f"/x{os.pathsep}{launch.RANK_STARTUP}"}, active, 0, 0,
                          0, "a", 29500)
    assert env["PYTHONPATH"] == os.pathsep.join([launch.RANK_STARTUP, "/x"])


def test_world_info_round_trip_and_node_rank_by_name():
    active = OrderedDict([("w0", [0, 1]), ("w1", [3])])
    assert launch.decode_world_info(launch.encode_world_info(active)) == active
    assert launch.node_index(active, "w1") == 1 and launch.node_index(active, "0") == 0
    with pytest.raises(launch.LaunchConfigError, match="out of range"):
        launch.node_index(active, "2")


def test_core_lists():
    assert launch.parse_core_list("0,2-4,7") == [0, 2, 3, 4, 7]
    assert launch.cores_for_rank(list(range(8)), 1, 3) == [2, 3]
    with pytest.raises(launch.LaunchConfigError, match="cannot be shared"):
        launch.cores_for_rank([0], 0, 2)


def test_failure_marker_in_backend_output_stops_the_job(tmp_path, capfd):
    """pdsh: one process for all nodes, so a node's FAILED line ends the job."""
    stopped = []
    line = "hostB: [zero.launch] FAILED: rank 3 exited with code 1"
    worker = Worker("pdsh", ["sh", "-c", f"echo '{line}'; exec sleep 30"], dict(os.environ),
                    str(tmp_path / "pdsh.log"))
    started = time.monotonic()
    code = Supervisor([worker], grace=1, watch_marker=True,
                      on_stop=lambda: stopped.append(True)).run()
    assert code == 1 and stopped == [True] and time.monotonic() - started < 10
    assert worker.proc.returncode == -signal.SIGTERM
    assert "pdsh reported a failure" in capfd.readouterr().err


def test_describe_exit():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGSEGV) == "was killed by signal SIGSEGV"


# -- multi-node command lines (cannot run here: no ssh/pdsh/slurm/mpi) -------------
def make_job(**overrides):
    fields = dict(active=OrderedDict([("w0", [0, 1]), ("w1", [0, 1])]), user_script="train.py",
                  user_args=["--cfg", "a b.json"], launch_flags=["--world_info=WI", "--use_gpus"],
                  exports={"NCCL_DEBUG": "INFO", "X": "it's"}, master_addr="w0",
                  master_port=29500, cwd="/home/me/proj", job_id="j1", python="/py")
    fields.update(overrides)
    return multinode.RemoteJob(**fields)


def test_ssh_commands():
    (host0, argv0), (host1, argv1) = multinode.ssh_commands(make_job(ssh_port=2222,
                                                                     launcher_args="-A"))
    assert (host0, host1) == ("w0", "w1")
    assert argv0[:6] == ["ssh", "-o", "BatchMode=yes", "-p", "2222", "-A"] and argv0[6] == "w0"
    assert argv0[7] == ("cd /home/me/proj && export NCCL_DEBUG=INFO X='it'\"'\"'s' && exec /py -u "
                        "-m zero.launcher.launch --node_rank=0 --world_info=WI --use_gpus "
                        "--exit_on_stdin_eof train.py --cfg 'a b.json'")
    assert "--node_rank=1" in argv1[-1]


def test_pdsh_command():
    argv, env, kill = multinode.pdsh_command(make_job(exports={}))
    assert argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "w0,w1"]
    assert argv[6] == ("cd /home/me/proj && exec /py -u -m zero.launcher.launch --node_rank=%n "
                       "--world_info=WI --use_gpus --pid_file=/tmp/zero-launch-j1-%n.pid "
                       "train.py --cfg 'a b.json'")
    assert env == {"PDSH_RCMD_TYPE": "ssh"}
    assert kill == argv[:6] + ["kill -TERM $(cat /tmp/zero-launch-j1-%n.pid) 2>/dev/null; true"]


RANK_PROGRAM = ["/py", "-u", "-m", "zero.launcher.launch", "--rank_from_env",
                "--master_port=29500", "train.py", "--cfg", "a b.json"]


def test_openmpi_command():
    assert multinode.openmpi_command(make_job(launcher_args="--mca btl tcp,self")) == [
        "mpirun", "-np", "4", "-H", "w0:2,w1:2", "--bind-to", "none", "--mca", "btl",
        "tcp,self", "-x", "NCCL_DEBUG=INFO", "-x", "X=it's", "-x", "MASTER_ADDR=w0",
        "-x", "MASTER_PORT=29500"] + RANK_PROGRAM


def test_mpich_command_and_uneven_hosts():
    assert multinode.mpich_command(make_job(exports={}, module=True)) == [
        "mpirun", "-n", "4", "-ppn", "2", "-hosts", "w0,w1", "-genv", "MASTER_ADDR", "w0",
        "-genv", "MASTER_PORT", "29500"] + RANK_PROGRAM[:6] + ["--module"] + RANK_PROGRAM[6:]
    with pytest.raises(multinode.MultiNodeError, match="same number of ranks"):
        multinode.mpich_command(make_job(active=OrderedDict([("w0", [0, 1]), ("w1", [0])])))


def test_slurm_command_with_and_without_hostfile():
    argv, env = multinode.slurm_command(make_job(), comment="c", account="acct")
    assert argv == ["srun", "-n", "4", "--nodes", "2", "--ntasks-per-node", "2", "--nodelist",
                    "w0,w1", "--comment", "c", "--account", "acct", "--export=ALL"] + RANK_PROGRAM
    assert env == {"NCCL_DEBUG": "INFO", "X": "it's", "MASTER_ADDR": "w0", "MASTER_PORT": "29500"}
    argv, env = multinode.slurm_command(make_job(active={}, master_addr=None), num_nodes=3,
                                        ranks_per_node=8)
    assert argv[:7] == ["srun", "-n", "24", "--nodes", "3", "--ntasks-per-node", "8"]
    assert "MASTER_ADDR" not in env       # each rank finds it from SLURM_NODELIST


def test_python_dash_m_zero_launcher_is_the_zero_command():
    """`python -m zero.launcher` (it was "'zero.launcher' is a package and cannot be directly
    executed"), as `python -m zero.launcher.runner` and `zero` are."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "zero.launcher", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: zero ")
    assert "--num_procs" in done.stdout
