"""zero.distributed: the environment -> rank mapping, and real single-process inits."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zero.distributed import (DistributedEnvError, discover, expand_nodelist,
                              expand_tasks_per_node)

REPO = Path(__file__).resolve().parents[1]


def test_torch_style_env_from_zero_or_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    info = discover(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert (info.master_addr, info.master_port, info.source) == ("10.0.0.1", 1234, "torch")
    assert info.as_env() == env


def test_slurm_env_takes_master_from_first_node_of_compressed_list():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_NODELIST": "gpu[07-09,11],cpu1"}
    info = discover(env, default_port=29511)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 2)
    assert (info.master_addr, info.master_port, info.source) == ("gpu07", 29511, "slurm")


def test_openmpi_env():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "MASTER_ADDR": "head", "MASTER_PORT": "4000"}
    info = discover(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (2, 4, 0, 2)
    assert (info.master_addr, info.master_port, info.source) == ("head", 4000, "openmpi")


def test_mpich_pmi_env():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "MASTER_ADDR": "head"}
    info = discover(env)
    assert (info.rank, info.world_size, info.local_rank, info.master_port) == (1, 2, 1, 29500)
    assert info.source == "mpich (PMI)"


def test_torch_env_wins_over_mpi_and_explicit_arguments_win_over_env():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "a",
           "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "9"}
    assert discover(env).world_size == 2
    assert discover(env, auto_mpi_discovery=False).world_size == 2
    explicit = discover({"MASTER_ADDR": "a"}, rank=0, world_size=3)
    assert (explicit.rank, explicit.world_size, explicit.source) == (0, 3, "arguments")


def test_mpi_is_ignored_without_auto_discovery():
    info = discover({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
                    auto_mpi_discovery=False)
    assert (info.world_size, info.source) == (1, "single process")


def test_nothing_set_is_one_process_on_localhost_with_a_free_port():
    info = discover({})
    assert (info.rank, info.world_size, info.master_addr) == (0, 1, "127.0.0.1")
    assert 0 < info.master_port < 65536


@pytest.mark.parametrize("env, missing", [
    ({"RANK": "0"}, "WORLD_SIZE is missing"),
    ({"WORLD_SIZE": "2"}, "RANK is missing"),
    ({"LOCAL_RANK": "0"}, "RANK and WORLD_SIZE are missing"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "LOCAL_RANK is missing"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "MASTER_ADDR is not set"),
    ({"SLURM_PROCID": "0"}, "SLURM_NTASKS is missing"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is missing"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "a"}, "MPI_LOCALRANKID is missing"),
    ({"RANK": "4", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "a"}, "in \\[0, 2\\)"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "not a valid TCP port"),
])
def test_partial_or_bad_env_names_the_problem(env, missing):
    with pytest.raises(DistributedEnvError, match=missing):
        discover(env)


def test_rank_without_world_size_argument_is_an_error():
    with pytest.raises(DistributedEnvError, match="both rank= and world_size="):
        discover({}, rank=0)


def test_init_method_needs_no_master():
    info = discover({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, need_master=False)
    assert info.master_addr is None and "MASTER_ADDR" not in info.as_env()


@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a,b[1-2]", ["a", "b1", "b2"]),
    ("r[1-2]-n[8-9]", ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]),
    ("gpu[9-10]-ib", ["gpu9-ib", "gpu10-ib"]),
])
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-", "node[a-b]", ""])
def test_bad_nodelist(text):
    with pytest.raises(DistributedEnvError):
        expand_nodelist(text)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


REAL_INIT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from zero.distributed import init_distributed

    def one_run(env, expect_source_vars):
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
            os.environ.pop(k, None)
        os.environ.update(env)
        init_distributed(dist_backend="gloo", verbose=False)
        init_distributed()                       # second call: a no-op
        t = torch.ones(2); dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
        assert dist.get_rank() == 0 and dist.get_world_size() == 1
        got = {k: os.environ[k] for k in expect_source_vars}
        dist.destroy_process_group()
        for k in env:
            del os.environ[k]
        return got

    port = os.environ["TEST_PORT"]
    slurm = one_run({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                     "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": port},
                    ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"])
    assert slurm == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                     "MASTER_ADDR": "localhost", "MASTER_PORT": port}, slurm
    os.environ.pop("MASTER_PORT", None)
    ompi = one_run({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
                    "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, ["RANK", "WORLD_SIZE", "MASTER_ADDR"])
    assert ompi == {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}, ompi
    print("OK")
""")


def test_real_init_from_slurm_then_openmpi_env():
    from distributed_harness import free_port
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO), TEST_PORT=str(free_port()), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", REAL_INIT], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("OK")


@pytest.mark.parametrize("env,minutes", [({}, 30), ({"ZERO_TIMEOUT": "5"}, 5),
                                         ({"DEEPSPEED_TIMEOUT": "7"}, 7),
                                         ({"ZERO_TIMEOUT": "5", "DEEPSPEED_TIMEOUT": "7"}, 5)])
def test_the_timeout_comes_from_zero_timeout_then_deepspeeds(monkeypatch, env, minutes):
    from datetime import timedelta

    from zero.distributed import _timeout_from_env

    for name in ("ZERO_TIMEOUT", "DEEPSPEED_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _timeout_from_env() == timedelta(minutes=minutes)


@pytest.mark.parametrize("value", ["0", "999999999999", "-1", "1.5", "abc"])
def test_a_timeout_out_of_range_is_named(monkeypatch, value):
    """0 failed every rendezvous at once ("timed out after 0ms") and a huge value overflowed,
    neither naming ZERO_TIMEOUT."""
    from zero.distributed import _timeout_from_env

    monkeypatch.setenv("ZERO_TIMEOUT", value)
    with pytest.raises(ValueError, match="ZERO_TIMEOUT=.* whole number of minutes from 1 to"):
        _timeout_from_env()


def test_a_rendezvous_port_in_use_names_master_port():
    """torch's EADDRINUSE traceback, after about 9 s, named no fix."""
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy.getsockname()[1]))
    try:
        result = subprocess.run([sys.executable, "-c", "import zero; zero.init_distributed()"],
                                env=env, capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert result.returncode != 0
    assert "is in use" in result.stderr and "--master_port" in result.stderr, result.stderr
