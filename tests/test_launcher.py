"""The zero launcher end to end (real processes, gloo on localhost) and its pure parts.

Every process test has a timeout; the `sandbox` fixture kills, by pid, the
launchers it started and every rank pid the scripts recorded, so a failing test
leaves nothing running.
"""
import json
import os
import pty
import select
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import pytest

from zero.launcher import env as envrule
from zero.launcher import launch, multinode, runner
from zero.launcher.supervisor import Supervisor, Worker, describe_exit

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60

RECORD_PID = """
import os, sys, json
from pathlib import Path
OUT = Path(os.environ["OUT_DIR"])
(OUT / "pids").mkdir(parents=True, exist_ok=True)
(OUT / "pids" / str(os.getpid())).write_text("rank")
"""

SCRIPTS = {
    # init_distributed + one all_reduce; records what the rank saw
    "dist_job.py": RECORD_PID + """
import torch, torch.distributed as dist
from zero.distributed import init_distributed
init_distributed(verbose=False)
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CROSS_RANK", "CROSS_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"]
(OUT / f"rank{dist.get_rank()}.json").write_text(json.dumps(
    {"env": {k: os.environ.get(k) for k in keys}, "sum": t.item(), "argv": sys.argv[1:]}))
print(f"hello from rank {dist.get_rank()}", flush=True)
dist.destroy_process_group()
""",
    # rank 1 raises at step 3; rank 0 ignores SIGTERM there, so it needs the SIGKILL
    "fail_job.py": RECORD_PID + """
import signal, time, torch, torch.distributed as dist
from zero.distributed import init_distributed
init_distributed(verbose=False)
rank = dist.get_rank()
for step in range(1, 10):
    if step == 3:
        if rank == 1:
            raise RuntimeError("boom at step 3")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("rank 0 busy in step 3", flush=True)
        time.sleep(120)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} ok", flush=True)
""",
    # no torch: dumps its environment, arguments and cpu affinity
    "env_probe.py": RECORD_PID + """
rank = os.environ.get("RANK", "x")
(OUT / f"env{rank}.json").write_text(json.dumps(
    {"env": dict(os.environ), "argv": sys.argv[1:], "cpus": sorted(os.sched_getaffinity(0))}))
""",
    # no torch: starts a grandchild, says it is ready, sleeps
    "sleeper.py": RECORD_PID + """
import subprocess, time
child = subprocess.Popen(["sleep", "120"])
(OUT / "pids" / str(child.pid)).write_text("grandchild")
(OUT / f"ready{os.environ['RANK']}").write_text("")
time.sleep(120)
""",
    # no torch: says it is ready, sleeps (no children)
    "idle.py": RECORD_PID + """
import time
(OUT / f"ready{os.environ['RANK']}").write_text("")
time.sleep(120)
""",
    # no torch: a progress bar's redraw (no newline), then waits until the test has seen it
    "redraw.py": RECORD_PID + """
import time
sys.stdout.write("progress 50%\\r")
sys.stdout.flush()
deadline = time.monotonic() + 30
while not (OUT / "seen").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("done", flush=True)
""",
    "probe.sh": """#!/bin/sh
echo "$RANK $*" > "$OUT_DIR/probe_sh_$RANK.txt"
""",
}

# A stand-in for ssh: runs the remote command on this machine in a *clean*
# environment, like a fresh login on another node would.
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -o|-p) shift 2 ;; -*) shift ;; *) break ;; esac
done
host="$1"; shift
exec env -i HOME="$HOME" PATH=/usr/bin:/bin FAKE_SSH_HOST="$host" sh -c "$*"
"""

# A stand-in for pdsh: runs the command once per -w host (with %n replaced by
# the host) in a clean environment and its own session (out of reach of
# signals sent to pdsh, like a real remote machine), prefixing output with "host: ".
FAKE_PDSH = """#!{python}
import os, subprocess, sys, threading
args, hosts = sys.argv[1:], []
while args[0].startswith("-"):
    if args[0] == "-w":
        hosts = args[1].split(",")
    args = args[2:] if args[0] in ("-w", "-f") else args[1:]
codes = []
def run(host):
    env = {{"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin"}}
    proc = subprocess.Popen(["sh", "-c", " ".join(args).replace("%n", host)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    for line in proc.stdout:
        sys.stdout.buffer.write(host.encode() + b": " + line)
        sys.stdout.flush()
    codes.append(proc.wait())
threads = [threading.Thread(target=run, args=(h,)) for h in hosts]
[t.start() for t in threads]
[t.join() for t in threads]
sys.exit(max(codes))
"""

# Node B's rank fails; node A's rank would sleep for two minutes.
PDSH_JOB = RECORD_PID + """
import time
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    sys.exit(7)
time.sleep(120)
"""


def free_port():
    from zero.distributed import free_port as pick
    return pick()


def is_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


class Sandbox:
    """A working dir with the test scripts, a clean env and process bookkeeping."""

    def __init__(self, root):
        self.cwd, self.out, self.home = root / "work", root / "out", root / "home"
        self.tmp = root / "tmp"   # kept rank logs of failing jobs land here, not in /tmp
        for d in (self.cwd, self.out, self.home, self.tmp):
            d.mkdir()
        for name, text in SCRIPTS.items():
            path = self.cwd / name
            path.write_text(textwrap.dedent(text))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
                envrule.ENV_FILE_VARIABLE)
        self.env = {k: v for k, v in os.environ.items() if k not in drop
                    and not k.startswith(("MASTER_", "SLURM_", "OMPI_", "PMI_"))}
        self.env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HOME=str(self.home),
                        OUT_DIR=str(self.out), TMPDIR=str(self.tmp))
        self.procs = []

    def start(self, args, module="zero.launcher.runner", env=None, **popen):
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=self.cwd,
                                env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                **popen)
        proc.started = time.monotonic()
        self.procs.append(proc)
        return proc

    def finish(self, proc, timeout=TIMEOUT):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            out, err = proc.communicate()
            pytest.fail(f"launcher still running after {timeout}s\n--- stdout\n{out}\n"
                        f"--- stderr\n{err}")
        proc.elapsed = time.monotonic() - proc.started
        proc.out, proc.err = out, err
        return proc

    def run(self, args, timeout=TIMEOUT, **kwargs):
        return self.finish(self.start(args, **kwargs), timeout)

    def rank_pids(self):
        folder = self.out / "pids"
        return [int(p.name) for p in folder.iterdir()] if folder.exists() else []

    def result(self, name):
        return json.loads((self.out / name).read_text())

    def cleanup(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in self.rank_pids():
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sandbox(tmp_path):
    box = Sandbox(tmp_path)
    yield box
    box.cleanup()


def explain(proc):
    return f"rc={proc.returncode}\n--- stdout\n{proc.out}\n--- stderr\n{proc.err}"


# -- single node ---------------------------------------------------------------
def test_cpu_ranks_init_and_all_reduce(sandbox):
    """A 2-rank and a 4-rank job, run side by side to save time."""
    jobs = {}
    for nprocs in (2, 4):   # the 4-rank job prefixes its output lines
        out = sandbox.out / f"job{nprocs}"
        prefix = ["--rank_prefix"] if nprocs == 4 else []
        jobs[nprocs] = sandbox.start(
            ["--num_procs", str(nprocs), "--master_port", str(free_port()), *prefix,
             "--enable_each_rank_log", str(out / "logs"), "dist_job.py", "--lr", "0.1"],
            env={"OUT_DIR": str(out)})
    for nprocs, proc in jobs.items():
        sandbox.finish(proc)
        assert proc.returncode == 0, explain(proc)
        out = sandbox.out / f"job{nprocs}"
        for rank in range(nprocs):
            seen = json.loads((out / f"rank{rank}.json").read_text())
            env = seen["env"]
            assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(nprocs), str(nprocs))
            assert (env["CROSS_RANK"], env["CROSS_SIZE"]) == ("0", "1")
            assert env["MASTER_ADDR"] == "127.0.0.1" and env["CUDA_VISIBLE_DEVICES"] is None
            assert seen["sum"] == nprocs * (nprocs + 1) / 2
            assert seen["argv"] == [f"--local_rank={rank}", "--lr", "0.1"]   # deepspeed's order
            lines = proc.out.splitlines()
            if nprocs == 4:
                assert f"[rank {rank}] hello from rank {rank}" in lines
            else:   # as the rank wrote it, like deepspeed's launcher
                assert f"hello from rank {rank}" in lines and "[rank" not in proc.out
            (log,) = (out / "logs").glob(f"*_rank{rank}.log")
            assert f"hello from rank {rank}" in log.read_text()


def test_two_nodes_on_one_machine_with_no_ssh(sandbox):
    port = str(free_port())
    common = ["--no_ssh", "--num_nodes", "2", "--num_procs", "2", "--master_addr", "127.0.0.1",
              "--master_port", port, "dist_job.py"]
    nodes = [sandbox.start(["--node_rank", str(i)] + common) for i in (0, 1)]
    for node in nodes:
        sandbox.finish(node)
        assert node.returncode == 0, explain(node)
    for rank in range(4):
        seen = sandbox.result(f"rank{rank}.json")
        env = seen["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["CROSS_RANK"] == str(rank // 2)
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["CROSS_SIZE"] == "2"
        assert seen["sum"] == 10
        assert seen["argv"] == [f"--local_rank={rank % 2}"]


def test_failing_rank_stops_every_rank_and_is_named(sandbox):
    proc = sandbox.run(["--num_procs", "2", "--kill_grace", "1", "--master_port",
                        str(free_port()), "fail_job.py"], timeout=30)
    # rank 1 exits 1, or SIGABRT when torch's teardown of the un-destroyed group crashes
    assert proc.returncode in (1, 128 + signal.SIGABRT), explain(proc)
    assert proc.elapsed < 30
    assert "FAILED: rank 1 " in proc.err, explain(proc)
    tail = proc.err.split("last ", 1)[1]
    assert "RuntimeError: boom at step 3" in tail
    assert "rank logs kept in" in proc.err
    wait_until(lambda: not any(is_alive(p) for p in sandbox.rank_pids()), 5, "ranks to be gone")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_all_ranks_and_their_children(sandbox, signum, code):
    proc = sandbox.start(["--num_procs", "2", "--kill_grace", "2", "sleeper.py"])
    wait_until(lambda: all((sandbox.out / f"ready{r}").exists() for r in (0, 1)), 30, "ranks")
    pids = sandbox.rank_pids()
    assert len(pids) == 4 and all(is_alive(p) for p in pids)      # 2 ranks + 2 grandchildren
    os.kill(proc.pid, signum)
    sandbox.finish(proc, timeout=20)
    assert proc.returncode == code, explain(proc)
    assert f"received {signal.Signals(signum).name}" in proc.err
    wait_until(lambda: not any(is_alive(p) for p in pids), 5, "every rank pid to be gone")


def test_sigkilled_launcher_leaves_no_rank_behind(sandbox):
    """SIGKILL cannot be caught: the kernel's parent-death signal ends the ranks."""
    proc = sandbox.start(["--num_procs", "2", "idle.py"])
    wait_until(lambda: all((sandbox.out / f"ready{r}").exists() for r in (0, 1)), 30, "ranks")
    pids = sandbox.rank_pids()
    assert len(pids) == 2 and all(is_alive(p) for p in pids)
    os.kill(proc.pid, signal.SIGKILL)
    sandbox.finish(proc, timeout=10)
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: not any(is_alive(p) for p in pids), 5, "every rank pid to be gone")


def test_a_progress_bar_redraw_reaches_the_console_before_its_line_ends(sandbox):
    proc = sandbox.start(["--num_procs", "1", "--rank_prefix", "redraw.py"])
    seen, deadline = b"", time.monotonic() + 30
    while b"progress 50%\r" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            seen += os.read(proc.stdout.fileno(), 4096)
    assert seen == b"[rank 0] progress 50%\r", seen   # not held back until "\n"
    (sandbox.out / "seen").write_text("")
    sandbox.finish(proc)
    assert proc.returncode == 0 and "[rank 0] done" in proc.out, explain(proc)


def test_ranks_are_told_when_the_launchers_console_is_a_terminal(sandbox):
    for terminal in (False, True):
        out = sandbox.out / ("tty" if terminal else "pipe")
        master, console = pty.openpty() if terminal else (None, subprocess.PIPE)
        proc = subprocess.Popen([sys.executable, "-m", "zero.launcher.runner", "--num_procs", "1",
                                 "env_probe.py"], cwd=sandbox.cwd, stdout=console, stderr=console,
                                env=dict(sandbox.env, OUT_DIR=str(out)), start_new_session=True)
        sandbox.procs.append(proc)
        try:
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            if terminal:
                os.close(master)
                os.close(console)
        seen = json.loads((out / "env0.json").read_text())["env"]
        assert seen.get("ZERO_CONSOLE_IS_TTY") == ("1" if terminal else None)


def test_node_launcher_stops_when_stdin_closes(sandbox):
    """How remote nodes stop when their ssh session ends."""
    world = launch.encode_world_info({"localhost": [0]})
    proc = sandbox.start([f"--world_info={world}", "--node_rank=0", "--exit_on_stdin_eof",
                          "sleeper.py"], module="zero.launcher.launch", stdin=subprocess.PIPE)
    wait_until(lambda: (sandbox.out / "ready0").exists(), 30, "the rank")
    proc.stdin.close()
    proc.stdin = None          # communicate() must not flush it
    sandbox.finish(proc, timeout=20)
    assert proc.returncode == 128 + signal.SIGHUP, explain(proc)
    wait_until(lambda: not any(is_alive(p) for p in sandbox.rank_pids()), 5, "ranks to be gone")


# -- script modes ----------------------------------------------------------------
def test_module_no_local_rank_and_core_binding(sandbox):
    cores = sorted(os.sched_getaffinity(0))
    bind = ["--bind_cores_to_rank", "--bind_core_list", f"{cores[0]},{cores[-1]}"] \
        if len(cores) >= 2 else []
    proc = sandbox.run(["--num_procs", "2", "--module", "--no_local_rank", *bind,
                        "env_probe", "x"])
    assert proc.returncode == 0, explain(proc)
    for rank in (0, 1):
        seen = sandbox.result(f"env{rank}.json")
        assert seen["argv"] == ["x"]
        if bind:
            assert seen["cpus"] == [cores[0] if rank == 0 else cores[-1]]
            assert seen["env"]["OMP_NUM_THREADS"] == "1"


def test_no_python_runs_an_executable(sandbox):
    proc = sandbox.run(["--num_procs", "1", "--no_python", "./probe.sh", "a b"])
    assert proc.returncode == 0, explain(proc)
    assert (sandbox.out / "probe_sh_0.txt").read_text().strip() == "0 --local_rank=0 a b"


def test_rank_from_env_mode_maps_openmpi_env_and_execs(sandbox):
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "head"}
    proc = sandbox.run(["--rank_from_env", "--master_port=4321", "env_probe.py"],
                       module="zero.launcher.launch", env=ompi)
    assert proc.returncode == 0, explain(proc)
    seen = sandbox.result("env1.json")
    assert {k: seen["env"][k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                        "MASTER_PORT")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "head",
        "MASTER_PORT": "4321"}
    assert seen["argv"] == ["--local_rank=1"]


# -- environment forwarding ------------------------------------------------------
ENV_FILE = """\
# forwarded to every rank
export FROM_FILE="x = y # kept"
PLAIN=a=b   # trailing comment

QUOTED='single'
"""


def test_env_file_and_allow_listed_vars_reach_a_local_rank(sandbox):
    (sandbox.cwd / ".zero_env").write_text(ENV_FILE)
    proc = sandbox.run(["--num_procs", "1", "env_probe.py"], env={"NCCL_DEBUG": "INFO"})
    assert proc.returncode == 0, explain(proc)
    env = sandbox.result("env0.json")["env"]
    assert (env["FROM_FILE"], env["PLAIN"], env["QUOTED"]) == ("x = y # kept", "a=b", "single")
    assert env["NCCL_DEBUG"] == "INFO"


def test_ssh_launch_forwards_only_the_allow_list_and_env_file(sandbox):
    bin_dir = sandbox.cwd / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    (sandbox.cwd / ".zero_env").write_text(ENV_FILE + f"OUT_DIR={sandbox.out}\n")
    (sandbox.cwd / "hosts").write_text("hostA slots=2\nhostB slots=2\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NCCL_DEBUG": "INFO",
           "SECRET_TOKEN": "do-not-forward"}
    proc = sandbox.run(["-H", "hosts", "--launcher", "ssh", "--num_procs", "1",
                        "--master_addr", "127.0.0.1", "env_probe.py", "it's quoted"], env=env)
    assert proc.returncode == 0, explain(proc)
    for rank, host in ((0, "hostA"), (1, "hostB")):
        seen = sandbox.result(f"env{rank}.json")
        remote = seen["env"]
        assert remote["FAKE_SSH_HOST"] == host and remote["CROSS_RANK"] == str(rank)
        assert remote["RANK"] == str(rank) and remote["WORLD_SIZE"] == "2"
        assert remote["FROM_FILE"] == "x = y # kept" and remote["NCCL_DEBUG"] == "INFO"
        assert "SECRET_TOKEN" not in remote and "CUDA_VISIBLE_DEVICES" not in remote
        assert seen["argv"] == ["--local_rank=0", "it's quoted"]


def test_pdsh_launch_fails_fast_and_stops_other_nodes_by_pid(sandbox):
    bin_dir = sandbox.cwd / "bin"
    bin_dir.mkdir()
    fakes = {"pdsh": FAKE_PDSH.format(python=sys.executable), "ssh": "#!/bin/sh\n"}
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (sandbox.cwd / "pdsh_job.py").write_text(PDSH_JOB)
    (sandbox.cwd / ".zero_env").write_text(f"OUT_DIR={sandbox.out}\nTMPDIR={sandbox.tmp}\n")
    (sandbox.cwd / "hosts").write_text("hostA slots=1\nhostB slots=1\n")
    pid_files = lambda: set(Path("/tmp").glob("zero-launch-*-host[AB].pid"))  # noqa: E731
    before = pid_files()
    proc = sandbox.run(["-H", "hosts", "--num_procs", "1", "--kill_grace", "1",
                        "--master_addr", "127.0.0.1", "pdsh_job.py"],
                       env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=30)
    assert proc.returncode != 0 and proc.elapsed < 30, explain(proc)
    assert "hostB: [zero.launch] FAILED: rank 1 exited with code 7" in proc.out, explain(proc)
    assert "pdsh reported a failure" in proc.err
    # node A is reachable only through the kill command and the pid file its launcher wrote
    wait_until(lambda: not any(is_alive(p) for p in sandbox.rank_pids()), 10, "ranks to be gone")
    wait_until(lambda: pid_files() <= before, 10,
               "the node launchers to exit and remove their pid files")


def test_env_file_lookup_order(tmp_path):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir(), home.mkdir()
    assert envrule.find_env_file({}, str(cwd), str(home)) is None
    (home / ".deepspeed_env").write_text("A=1\n")
    assert envrule.find_env_file({}, str(cwd), str(home)) == str(home / ".deepspeed_env")
    (cwd / ".deepspeed_env").write_text("A=2\n")
    assert envrule.find_env_file({}, str(cwd), str(home)) == str(cwd / ".deepspeed_env")
    (cwd / ".zero_env").write_text("A=3\n")
    assert envrule.find_env_file({}, str(cwd), str(home)) == str(cwd / ".zero_env")
    explicit = tmp_path / "my.env"
    explicit.write_text("A=4\n")
    chosen = envrule.find_env_file({"ZERO_ENV_FILE": str(explicit)}, str(cwd), str(home))
    assert chosen == str(explicit)
    with pytest.raises(envrule.EnvFileError, match="does not exist"):
        envrule.find_env_file({"ZERO_ENV_FILE": str(tmp_path / "nope")}, str(cwd), str(home))


@pytest.mark.parametrize("line, message", [
    ("JUST_A_NAME", "expected NAME=value"),
    ("1BAD=x", "expected NAME=value"),
    ('OPEN="no end', "unterminated"),
    ('A="x" junk', "after the closing quote"),
])
def test_env_file_bad_line_names_file_and_line(line, message):
    with pytest.raises(envrule.EnvFileError, match=rf"env:2: {message}|env:2: .*{message}"):
        envrule.parse_env_lines(["OK=1\n", line + "\n"], source="env")


def test_remote_exports_follow_the_allow_list():
    environ = {"NCCL_IB_HCA": "mlx5", "PATH": "/bin", "PYTHONPATH": "/src", "HOME": "/root",
               "SECRET": "x", "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "4"}
    exports = envrule.remote_exports(environ, {"SECRET": "from-file"})
    assert exports == {"NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "4", "PATH": "/bin",
                       "PYTHONPATH": "/src", "SECRET": "from-file"}
    assert envrule.local_env(environ, {"X": "1"}) == dict(environ, X="1")


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
                   "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "2,5"}


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
