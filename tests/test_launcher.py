"""The zero launcher end to end on one node: real processes, gloo on localhost.

Every process test has a timeout; the `sandbox` fixture (launcher_sandbox.py) kills, by pid,
the launchers it started and every rank pid the scripts recorded, so a failing test leaves
nothing running.
"""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from launcher_sandbox import sandbox  # noqa: F401 (a fixture)
from launcher_sandbox import TIMEOUT, explain, free_port, is_alive, wait_until
from zero.launcher import launch


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


STARTUP_PROBE = """
import json, os, subprocess, sys
from pathlib import Path
child = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ['ZERO_EXIT_GRACE'], "
                        "'zero.clean_exit' in sys.modules)"], capture_output=True, text=True)
exit_module = sys.modules.get("zero.clean_exit")
Path(os.environ["OUT_DIR"], "startup.json").write_text(json.dumps({
    "hidden_ran": os.environ.get("HIDDEN_SITECUSTOMIZE_RAN"), "zero_imported": "zero" in sys.modules,
    "torch_imported": "torch" in sys.modules,
    "launched_rank": exit_module is not None and exit_module._launched_rank,
    "child": child.stdout.split()}))
"""


def test_each_rank_gets_the_exit_grace_and_the_sitecustomize_it_hides_still_runs(sandbox):
    """zero's rank start-up (rank_startup/sitecustomize.py) runs before the script without
    importing zero or torch, marks the rank's first Python process only (not the processes it
    starts), and then runs the job's own sitecustomize, which it would otherwise hide."""
    hidden = sandbox.cwd / "site"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(
        "import os\nos.environ['HIDDEN_SITECUSTOMIZE_RAN'] = 'yes'\n")
    (sandbox.cwd / "startup_probe.py").write_text(STARTUP_PROBE)
    proc = sandbox.run(["--num_procs", "1", "--no_deepspeed_alias", "startup_probe.py"],
                       env={"PYTHONPATH": f"{hidden}{os.pathsep}{sandbox.env['PYTHONPATH']}"})
    assert proc.returncode == 0, explain(proc)
    seen = sandbox.result("startup.json")
    assert seen == {"hidden_ran": "yes", "zero_imported": False, "torch_imported": False,
                    "launched_rank": True, "child": ["taken", "False"]}


TWO_NODE_TRAINING = """
import json, os, sys
from pathlib import Path
import torch
import zero
from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

layout = json.loads(sys.argv[-1])
fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
torch.manual_seed(0)
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, **layout}}
engine, _, _, _ = zero.initialize(model=TinyGPT(GPTConfig()), config=config)
rank, world = engine.global_rank, engine.world_size
batches = synthetic_batches(GPTConfig(), 2, 3 * world)
losses = []
for step in range(3):
    if step == 1 and rank == fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    loss = engine(*batches[step * world + rank])
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
Path(os.environ["OUT_DIR"], f"train{rank}.json").write_text(json.dumps({
    "local_rank": engine.local_rank, "shard_world": engine.core.group_layout(0).world_size,
    "secondary_gathered": engine.core.secondary_comm_stats().all_gather_bytes > 0,
    "replicated": engine.core.mics_replicate_comm_stats().all_reduce_bytes > 0,
    "losses": losses}))
"""


@pytest.mark.parametrize("layout", [{"zero_hpz_partition_size": 2}, {"mics_shard_size": 2}],
                         ids=["hpz", "mics"])
def test_two_nodes_on_one_machine_train_with_node_local_groups(sandbox, layout):
    """Two launcher invocations against one rendezvous (2 nodes x 2 ranks, --no_ssh) train
    a stage-3 engine whose hpZ or MiCS groups come from the node layout the launcher exports
    (LOCAL_WORLD_SIZE 2): every rank trains, its groups are its node's."""
    (sandbox.cwd / "train_two_nodes.py").write_text(TWO_NODE_TRAINING)
    port = str(free_port())
    common = ["--no_ssh", "--num_nodes", "2", "--num_procs", "2", "--master_addr", "127.0.0.1",
              "--master_port", port, "--no_local_rank", "train_two_nodes.py", json.dumps(layout)]
    nodes = [sandbox.start(["--node_rank", str(i)] + common) for i in (0, 1)]
    for node in nodes:
        sandbox.finish(node, timeout=120)
        assert node.returncode == 0, explain(node)
    seen = [sandbox.result(f"train{rank}.json") for rank in range(4)]
    for rank, result in enumerate(seen):
        assert result["local_rank"] == rank % 2 and len(result["losses"]) == 3
        if "mics_shard_size" in layout:
            assert result["shard_world"] == 2 and result["replicated"]
        else:
            assert result["shard_world"] == 4 and result["secondary_gathered"]


def test_a_rank_failing_on_one_node_stops_both_nodes(sandbox):
    """The same fail-fast rules across nodes: rank 3 (node 1) raises in its second step; node
    1's launcher names it and exits non-zero, and node 0's ranks, left waiting in a collective,
    are stopped by their launcher when the rendezvous breaks, well before the test's timeout."""
    (sandbox.cwd / "train_two_nodes.py").write_text(TWO_NODE_TRAINING)
    port = str(free_port())
    common = ["--no_ssh", "--num_nodes", "2", "--num_procs", "2", "--master_addr", "127.0.0.1",
              "--master_port", port, "--kill_grace", "1", "--no_local_rank",
              "train_two_nodes.py", json.dumps({"mics_shard_size": 2})]
    nodes = [sandbox.start(["--node_rank", str(i)] + common, env={"FAIL_RANK": "3"})
             for i in (0, 1)]
    for node in nodes:
        sandbox.finish(node, timeout=120)
        assert node.returncode != 0, explain(node)
    assert "rank 3" in nodes[1].err and "fails on purpose" in nodes[1].err + nodes[1].out
