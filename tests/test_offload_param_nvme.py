"""Parameter offload to NVMe (ZeRO-Infinity, stage 3 offload_param device "nvme"): each rank's
parameter shard lives in a swap file, a few host buffers carry units in and out, the gather
schedule reads units ahead, and the optimizer step writes the new parameters back. It must
train exactly like the engine without offload (alone and with the optimizer on the host or
NVMe, with a partial or delayed update), resume exactly, place every byte where the formula
says, and fail with clear errors."""
import os

import pytest

import training
from distributed_harness import run_distributed
from test_offload import GAS, _assert_same_training, _config, _resume, _train, _truncated
from zero.boundary import as_dict


def _nvme_params(config, path, **keys):
    config["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": path, **keys}
    return config


def _swap_dirs(tmp_path, *names):
    dirs = []
    for name in names:
        (tmp_path / name).mkdir()
        dirs.append(str(tmp_path / name))
    return dirs


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("optimizer_offload", [False, "cpu", "nvme"])
def test_parameters_on_nvme_train_like_the_engine_without_offload(world, optimizer_offload, tmp_path):
    params_dir, optimizer_dir = _swap_dirs(tmp_path, "params", "optimizer")
    optimizer = optimizer_dir if optimizer_offload == "nvme" else optimizer_offload
    plain = run_distributed(_train, world, args=(_config(3, False),), timeout=180)
    # Two buffers: every gather reads from the file, every step writes every unit back.
    config = _nvme_params(_config(3, optimizer, tile=1000), params_dir, buffer_count=2)
    offloaded = run_distributed(_train, world, args=(config,), timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)


def _accounting(rank, world, config):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 2, GAS)
    groups = range(engine.core.group_count)
    infos = [as_dict(engine.core.group_offload_info(g)) for g in groups]
    unit_shards = [[engine.core.group_layout(g).unit(u).shard_numel
                    for u in range(engine.core.group_units(g))] for g in groups]
    return losses, infos, unit_shards, engine.memory_report()


def test_parameters_on_nvme_leave_only_buffers_on_the_host(tmp_path):
    (params_dir,) = _swap_dirs(tmp_path, "params")
    config = _nvme_params(_config(3, "cpu", "bf16"), params_dir, buffer_count=3)
    losses, infos, unit_shards, report = run_distributed(_accounting, 2, args=(config,))[0]
    by_location = report["model_state_by_location"]
    assert by_location["measured"] == by_location["expected"]
    param = report["categories"]["param"]["by_location"]
    assert param["nvme"]["current"] == 2 * report["numel"] // 2  # the whole bf16 shard
    assert param["device"]["current"] == 2 * report["persistent_numel"]
    assert "host_pageable" not in param or param["host_pageable"]["current"] == 0
    assert report["offload"]["param"] == "nvme"
    # Host buffers: buffer_count x the largest unit's shard, page-rounded; nothing else of the
    # parameters. The optimizer's step updates this CPU model in place (its new parameters go
    # to the swap file from there): it stages nothing.
    partitioned = [i for i, info in enumerate(infos) if info["params_offloaded"]]
    largest = max(max(unit_shards[g]) for g in partitioned)
    buffers = 3 * (-(-2 * largest // 4096) * 4096)
    assert infos[partitioned[0]]["param_swap"].startswith(params_dir)
    assert report["categories"]["staging"]["current"] == buffers


def test_max_in_cpu_keeps_the_first_units_in_host_memory(tmp_path):
    (params_dir,) = _swap_dirs(tmp_path, "params")
    plain = run_distributed(_train, 2, args=(_config(3, False),), timeout=180)
    probe = run_distributed(_accounting, 2, args=(_nvme_params(_config(3, "cpu"), params_dir),))[0]
    unit_shards = probe[2][[i for i, info in enumerate(probe[1]) if info["params_offloaded"]][0]]
    kept = unit_shards[0] + unit_shards[1]  # the first two units fit, the third does not
    config = _nvme_params(_config(3, "cpu"), params_dir, max_in_cpu=kept + unit_shards[2] - 1)
    offloaded = run_distributed(_train, 2, args=(config,), timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)
    _, infos, _, report = run_distributed(_accounting, 2, args=(config,))[0]
    on_nvme = sum(info["nvme_param_numel"] for info in infos)
    assert on_nvme == sum(unit_shards) - kept
    param = report["categories"]["param"]["by_location"]
    assert param["nvme"]["current"] == 4 * on_nvme
    assert param["host_pageable"]["current"] == 4 * kept
    assert report["model_state_by_location"]["measured"] == report["model_state_by_location"]["expected"]


def _reads_per_step(rank, world, config):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, GAS)  # the first step records the order
    group = next(g for g in range(engine.core.group_count)
                 if engine.core.group_offload_info(g).params_offloaded)
    before = engine.core.group_offload_info(group)
    training.train_engine(engine, rank, world, 2, GAS, first_step=2)
    after = engine.core.group_offload_info(group)
    reads = after.param_swap_reads - before.param_swap_reads
    read_aheads = after.param_swap_read_aheads - before.param_swap_read_aheads
    return reads, read_aheads, engine.core.group_units(group)


def test_with_a_buffer_per_unit_nothing_is_read_after_the_first_step(tmp_path):
    config = _nvme_params(_config(3, "cpu"), str(tmp_path), buffer_count=64)
    reads, read_aheads, units = run_distributed(_reads_per_step, 1, args=(config,))[0]
    assert units < 64 and reads == 0 and read_aheads == 0


def test_units_are_read_ahead_of_their_gather(tmp_path):
    # Two buffers for three units, and no all-gather prefetch (which would gather the next
    # units itself, reading them on demand): once the order is recorded, the schedule starts
    # the reads of the units ahead while the current one computes.
    config = _nvme_params(_config(3, "cpu"), str(tmp_path), buffer_count=2)
    config["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    reads, read_aheads, units = run_distributed(_reads_per_step, 1, args=(config,))[0]
    # 2 steps x GAS micro-batches x (forward + backward) gathers at most
    assert units > 2 and 0 < reads <= 2 * GAS * 2 * units
    assert 0 < read_aheads <= reads


def test_parameters_on_nvme_with_a_partial_and_with_a_delayed_update(tmp_path):
    params_dir, other = _swap_dirs(tmp_path, "params", "other")
    plain = run_distributed(_train, 2, args=(_config(3, False),), timeout=180)
    partial = _config(3, "cpu", tile=700)
    partial["zero_optimization"]["offload_optimizer"]["ratio"] = 0.6  # units straddle the cut
    offloaded = run_distributed(_train, 2, args=(_nvme_params(partial, params_dir, buffer_count=2),),
                                timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)
    delayed = _config(3, "cpu")
    delayed["zero_optimization"]["offload_optimizer"]["delayed_update"] = True
    reference = run_distributed(_train, 2, args=(delayed,), timeout=180)
    with_nvme = run_distributed(_train, 2, args=(_nvme_params(dict(delayed), other),), timeout=180)
    _assert_same_training(reference, with_nvme, 1e-6)


def test_resume_with_parameters_on_nvme_is_bit_for_bit(tmp_path):
    params_dir, ckpt = _swap_dirs(tmp_path, "params", "ckpt")
    config = _nvme_params(_config(3, "cpu", "bf16"), params_dir, buffer_count=2)
    full = run_distributed(_resume, 2, args=(config, ckpt, "full"))
    first = run_distributed(_resume, 2, args=(config, ckpt, "first"))
    second = run_distributed(_resume, 2, args=(config, ckpt, "second"))
    assert first[0] + second[0] == full[0]


def _zero_init_training(rank, world, config):
    import zero

    with zero.Init(config_dict_or_path=config):
        model = training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return training.train_engine(engine, rank, world, 3, GAS)


def test_a_model_built_under_zero_init_trains_with_parameters_on_nvme(tmp_path):
    (params_dir,) = _swap_dirs(tmp_path, "params")
    plain = run_distributed(_zero_init_training, 2, args=(_config(3, False),))
    config = _nvme_params(_config(3, "cpu"), params_dir, buffer_count=2)
    offloaded = run_distributed(_zero_init_training, 2, args=(config,))
    assert offloaded[0] == pytest.approx(plain[0], rel=1e-6)


@pytest.mark.parametrize("world", [1, 2])
def test_the_beyond_memory_path_trains_like_the_in_memory_engine(world, tmp_path):
    # bench_beyond_memory.py's path at a small scale: zero.Init, then parameters and optimizer
    # state on NVMe; the same losses as the engine without offload, and no swap file left
    params_dir, optimizer_dir = _swap_dirs(tmp_path, "params", "optimizer")
    plain = run_distributed(_zero_init_training, world, args=(_config(3, False),))
    config = _nvme_params(_config(3, optimizer_dir), params_dir, buffer_count=2)
    offloaded = run_distributed(_zero_init_training, world, args=(config,))
    assert offloaded[0] == pytest.approx(plain[0], rel=1e-6)
    assert not list((tmp_path / "params").iterdir()) and not list((tmp_path / "optimizer").iterdir())


# ---- errors --------------------------------------------------------------------------------

def _build_error(rank, world, config):
    import zero

    with pytest.raises(Exception) as info:
        zero.initialize(model=training.make_model(), config=config)
    return str(info.value)


def test_a_unit_larger_than_buffer_size_names_the_key_and_the_size_needed(tmp_path):
    config = _nvme_params(_config(3, "cpu"), str(tmp_path), buffer_size=100)
    message = run_distributed(_build_error, 1, args=(config,))[0]
    assert "offload_param.buffer_size = 100" in message and "raise buffer_size to at least" in message


def test_one_buffer_is_a_config_error(tmp_path):
    config = _nvme_params(_config(3, "cpu"), str(tmp_path), buffer_count=1)
    message = run_distributed(_build_error, 1, args=(config,))[0]
    assert "zero_optimization.offload_param.buffer_count" in message and "at least 2" in message


def test_a_truncated_parameter_swap_file_is_a_short_read_error(tmp_path):
    config = _nvme_params(_config(3, "cpu"), str(tmp_path), buffer_count=2)
    swap_file, message = run_distributed(_truncated, 1, args=(config, "param_swap"))[0]
    assert swap_file in message and "offset" in message


def _write_fails(rank, world, path):
    import os
    import resource
    import signal

    import zero

    config = _nvme_params(_config(3, "cpu"), path, buffer_count=64)  # every unit stays cached
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 1, GAS)
    infos = [engine.core.group_offload_info(g) for g in range(engine.core.group_count)]
    swap_file = next(info.param_swap for info in infos if info.param_swap).split(" (")[0]
    # The drive fills up: the file shrinks to one page and may not grow past it, so every
    # write-back but the first unit's fails (forward and backward run from the buffers).
    os.truncate(training.open_path(swap_file), 4096)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    with pytest.raises(Exception) as step_error:
        training.train_engine(engine, rank, world, 1, GAS, first_step=1)
    with pytest.raises(Exception) as later_error:  # the lost units are never read back silently
        training.train_engine(engine, rank, world, 1, GAS, first_step=2)
    return swap_file, str(step_error.value), str(later_error.value)


def test_a_failed_parameter_write_is_an_error_and_the_unit_is_not_read_back(tmp_path):
    swap_file, at_step, later = run_distributed(_write_fails, 1, args=(str(tmp_path),))[0]
    assert swap_file in at_step and "errno" in at_step
    assert "failed earlier" in later and "restore the run from a checkpoint" in later


def _with_free_space(rank, world, config, free_bytes):
    """Builds the engine on a model made under zero.Init, the drive reporting free_bytes
    free (None: as it is): (this rank's NVMe bytes after the build, or None; the error; the
    seconds initialize took; the swap files this process had open when it failed)."""
    import os
    import time
    from types import SimpleNamespace

    import zero

    if free_bytes is not None:
        os.statvfs = lambda _path: SimpleNamespace(f_bavail=free_bytes, f_frsize=1)
    with zero.Init(config_dict_or_path=config):
        model = training.make_model()
    start = time.monotonic()
    try:
        engine, *_ = zero.initialize(model=model, config=config)
    except Exception as error:  # noqa: BLE001 - the message is the result
        open_swap_files = sum("/zero-swap-" in link for link in training.open_files())
        return None, f"{type(error).__name__}: {error}", time.monotonic() - start, \
            open_swap_files
    nvme = engine.memory_report()["by_location"]["nvme"]["peak"]
    engine.destroy()
    return nvme, None, time.monotonic() - start, 0


def test_swap_files_that_do_not_fit_are_refused_on_every_rank_before_any_is_written(tmp_path):
    # both ranks write to one drive: it must hold their parameter and optimizer swap files
    # together, the bytes the engine then really uses (its registry) and not one more
    params_dir, optimizer_dir = _swap_dirs(tmp_path, "params", "optimizer")
    config = _nvme_params(_config(3, optimizer_dir), params_dir, buffer_count=2)
    built = run_distributed(_with_free_space, 2, args=(config, None))
    needed = sum(nvme for nvme, _, _, _ in built)
    assert needed > 0 and all(error is None for _, error, _, _ in built)
    refused = run_distributed(_with_free_space, 2, args=(config, needed - 1))
    for nvme, error, seconds, open_swap_files in refused:
        assert nvme is None and seconds < 10 and open_swap_files == 0  # none was made
        assert error.startswith("SwapSpaceError: zero: the NVMe swap files do not fit: 2 rank(s)")
        assert f"write {needed:,} bytes" in error and f"{needed - 1:,} bytes" in error
        assert "offload_optimizer.nvme_path and offload_param.nvme_path" in error
    exact = run_distributed(_with_free_space, 2, args=(config, needed))
    assert [nvme for nvme, _, _, _ in exact] == [nvme for nvme, _, _, _ in built]


KILLED_MID_RUN = """
import json, os, signal, sys
import zero, training
config = json.loads(sys.argv[1])
with zero.Init(config_dict_or_path=config):
    model = training.make_model()
engine, *_ = zero.initialize(model=model, config=config)
training.train_engine(engine, 0, 1, 1, 2)
print(len(os.listdir(config["zero_optimization"]["offload_param"]["nvme_path"])), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no destructor, no atexit: as a crash or the OOM killer
"""


def test_a_run_killed_mid_training_leaves_nothing_on_disk(tmp_path):
    # zero.Init's shard file and the engine's swap files have no names once made: the kernel
    # frees them with the process, however it ends
    import json
    import subprocess
    import sys

    from distributed_harness import free_port, subprocess_env

    (swap,) = _swap_dirs(tmp_path, "swap")
    config = _nvme_params(_config(3, swap), swap, buffer_count=2)
    env = subprocess_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_RUN, json.dumps(config)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0"]  # training, with its files open: none has a name
    assert os.listdir(swap) == []


def _per_rank_swap_dir(rank, world, config, missing):
    import copy
    import time

    import zero

    config = copy.deepcopy(config)
    if rank == 1:  # nvme_path is per host: this rank's does not exist
        config["zero_optimization"]["offload_optimizer"]["nvme_path"] = missing
    start = time.monotonic()
    try:
        zero.initialize(model=training.make_model(), config=config)
    except Exception as error:  # noqa: BLE001 - the message is the result
        return f"{type(error).__name__}: {error}", time.monotonic() - start
    return None, time.monotonic() - start


def test_a_swap_folder_missing_on_one_rank_is_named_on_every_rank(tmp_path):
    """The rank without it raised as it made its swap file; the others went on into their
    first collective and waited there (until the process group's timeout)."""
    optimizer_dir = _swap_dirs(tmp_path, "optimizer")[0]
    missing = str(tmp_path / "elsewhere")
    for error, seconds in run_distributed(_per_rank_swap_dir, 2,
                                          args=(_config(2, optimizer_dir), missing)):
        assert error is not None and seconds < 10
        assert error.startswith("SwapSpaceError: zero: rank 1 on ") and \
            f"offload_optimizer.nvme_path '{missing}' is not an existing directory" in error, error
