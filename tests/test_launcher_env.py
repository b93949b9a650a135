"""The zero launcher's environment forwarding: the env file and the allow list, to a local rank
and over (stand-ins for) ssh and pdsh, and the rules themselves (lookup order, parsing,
exports)."""
import os
import sys
from pathlib import Path

import pytest

from launcher_sandbox import sandbox  # noqa: F401 (a fixture)
from launcher_sandbox import RECORD_PID, explain, is_alive, wait_until
from zero.launcher import env as envrule

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
