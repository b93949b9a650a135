"""The sandbox the launcher tests run their real processes in (gloo on localhost).

`Sandbox` is a working dir with the test scripts, a clean env and process bookkeeping; the
`sandbox` fixture kills, by pid, the launchers it started and every rank pid the scripts
recorded, so a failing test leaves nothing running. Test files take the fixture with
`from launcher_sandbox import sandbox  # noqa: F401 (a fixture)`.
"""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from zero.launcher import env as envrule

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


def free_port():
    from distributed_harness import free_port as pick
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
