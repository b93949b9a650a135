"""Offload: the fp32 master and the optimizer state in host memory (offload_optimizer cpu) or
in an NVMe swap file (nvme), the step streamed in chunks through the fused CPU Adam, and at
stage 3 the parameter shard in host memory (offload_param cpu). Each must train exactly like
the engine without offload, resume exactly, and account for every byte where it lives; NVMe
failures must be clear errors."""
import pytest
import torch

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict

STEPS = 12
GAS = 2


def _config(stage, offload, precision="fp32", tile=None, pin=False, optimizer=None,
            params=False):
    """offload: False, "cpu", or an NVMe directory (a path string); params: offload_param cpu."""
    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    config = training.engine_config(stage, gas=GAS, precision=precision, **extra)
    if params:
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": pin}
    if offload == "cpu" or offload is True:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    elif offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": offload}
    if tile is not None:
        config["zero_optimization"]["sub_group_size"] = tile
    if optimizer is not None:
        config["optimizer"] = optimizer
    return config


def _train(rank, world, config, steps=STEPS):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, steps, GAS)
    state = engine.module_state_dict()
    report = engine.memory_report()
    params = {k: v.float() for k, v in state.items()} if rank == 0 else None
    report["shard_numels"] = [engine.core.group_numel(g) // world
                              for g in range(engine.core.group_count)]
    return losses, params, report


def _assert_same_training(expected, actual, tolerance, param_tolerance=None):
    for (ref_losses, _, _), (losses, _, _) in zip(expected, actual):
        assert losses == pytest.approx(ref_losses, rel=tolerance)
    for name, value in expected[0][1].items():
        error = training.relative_error(actual[0][1][name], value)
        assert error <= (param_tolerance or tolerance), name


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fp32_offload_matches_the_engine_without_it(stage, world):
    # Tiles of 1,000 elements: the step's chunks cut through every unit's shard.
    plain = run_distributed(_train, world, args=(_config(stage, False),), timeout=180)
    offloaded = run_distributed(_train, world, args=(_config(stage, True, tile=1000),), timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_offload_matches_the_engine_without_it(stage):
    plain = run_distributed(_train, 2, args=(_config(stage, False, "bf16"),), timeout=180)
    offloaded = run_distributed(_train, 2, args=(_config(stage, True, "bf16"),), timeout=180)
    # The CPU kernel and the device path round the same fp32 master to bf16 the same way.
    _assert_same_training(plain, offloaded, 1e-6)


@pytest.mark.parametrize("stage", [2, 3])
def test_gradients_kept_on_the_device_train_the_same_and_stay_there(stage):
    """offload_optimizer.grads_on_device: the gradient shard is the device's (here the CPU's
    device buffer, given back between steps), not the host pool's; training is unchanged."""
    plain = run_distributed(_train, 2, args=(_config(stage, True, "bf16"),), timeout=180)
    config = _config(stage, True, "bf16", tile=1000)
    config["zero_optimization"]["offload_optimizer"]["grads_on_device"] = True
    kept = run_distributed(_train, 2, args=(config,), timeout=180)
    _assert_same_training(plain, kept, 0.0)
    for (_, _, before), (_, _, after) in zip(plain, kept):
        assert set(before["categories"]["gradient"]["by_location"]) >= {"host_pageable"}
        gradient = after["categories"]["gradient"]["by_location"]
        assert set(gradient) == {"device"}, gradient
        assert gradient["device"]["peak"] == before["categories"]["gradient"]["peak"]
        assert after["model_state_by_location"]["measured"] == \
            after["model_state_by_location"]["expected"]


def test_round_robin_gradients_is_taken_and_trains_the_same():
    """DeepSpeed's round_robin_gradients reorders its partitions so every rank copies
    gradients to the CPU throughout backward; zero's reduce-scatter hands every rank 1/N of
    each unit as it completes, so a config asking for it trains exactly as one without."""
    config = _config(2, True, "bf16")
    plain = run_distributed(_train, 2, args=(config,), timeout=180)
    config["zero_optimization"]["round_robin_gradients"] = True
    _assert_same_training(plain, run_distributed(_train, 2, args=(config,), timeout=180), 0.0)


def test_sgd_with_momentum_offloads_too():
    sgd = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
    plain = run_distributed(_train, 2, args=(_config(2, False, optimizer=sgd),), timeout=180)
    offloaded = run_distributed(_train, 2, args=(_config(2, True, tile=777, optimizer=sgd),),
                                timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)


@pytest.mark.parametrize("stage", [2, 3])
def test_model_states_move_to_the_host_exactly_as_the_formula_says(stage):
    plain = run_distributed(_train, 2, args=(_config(stage, False, "bf16"), 2), timeout=180)[0][2]
    report = run_distributed(_train, 2, args=(_config(stage, True, "bf16", tile=1000), 2),
                             timeout=180)[0][2]
    by_location = report["model_state_by_location"]
    assert by_location["measured"] == by_location["expected"]
    # The device keeps the params only: master, Adam state and the gradient shard left it,
    # byte for byte (stage 3's persistent small parameters, a stage-1 group, keep their full
    # gradients on the device).
    persistent_grads = 2 * report["persistent_numel"]
    moved = sum(plain["categories"][c]["peak"] for c in ("fp32_master", "optimizer_state",
                                                          "gradient")) - persistent_grads
    assert by_location["measured"]["device"] == plain["model_state_bytes"] - moved
    assert by_location["measured"]["host"] == moved
    gradient = report["categories"]["gradient"]["by_location"]
    assert gradient["host_pageable"]["current"] == 2 * report["numel"] // 2
    assert gradient.get("device", {"current": 0})["current"] == persistent_grads
    for category in ("fp32_master", "optimizer_state", "gradient"):
        # a CPU build of torch cannot pin: the host pool is pageable
        assert "host_pageable" in report["categories"][category]["by_location"]
        assert "host_pinned" not in report["categories"][category]["by_location"]
    # A model on the host is updated in place: no staging (a device model's two slots of
    # gradients and parameters per group are priced by the estimator, test_estimate_offload).
    assert "staging" not in report["categories"]


def _resume(rank, world, config, save_dir, phase):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    if phase == "full":
        return training.train_engine(engine, rank, world, 6, GAS)
    if phase == "first":
        losses = training.train_engine(engine, rank, world, 3, GAS)
        engine.save_checkpoint(save_dir)
        return losses
    engine.load_checkpoint(save_dir)
    return training.train_engine(engine, rank, world, 3, GAS, first_step=3)


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_with_offload_is_bit_for_bit(stage, tmp_path):
    config = _config(stage, True, "bf16", tile=1000)
    full = run_distributed(_resume, 2, args=(config, str(tmp_path), "full"))
    first = run_distributed(_resume, 2, args=(config, str(tmp_path), "first"))
    second = run_distributed(_resume, 2, args=(config, str(tmp_path), "second"))
    assert first[0] + second[0] == full[0]


def _pinned(rank, world):
    import warnings

    import zero

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, _, _, _ = zero.initialize(model=training.make_model(),
                                          config=_config(2, True, pin=True))
    info = as_dict(engine.core.group_offload_info(0))
    return info, [str(w.message) for w in caught]


def test_pin_memory_falls_back_to_pageable_memory_with_the_reason():
    info, messages = run_distributed(_pinned, 1)[0]
    assert info["offloaded"]
    if torch.cuda.is_available():
        pytest.skip("a CUDA build pins; this checks the CPU-build fallback")
    assert not info["pinned"] and "CPU build" in info["why_not_pinned"]
    assert any("could not be pinned" in m and "CPU build" in m for m in messages)


# ---- NVMe (ZeRO-Infinity): the state lives in a swap file ------------------------------------

@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_nvme_offload_matches_the_engine_without_it(stage, world, tmp_path):
    plain = run_distributed(_train, world, args=(_config(stage, False),), timeout=180)
    nvme = run_distributed(_train, world, args=(_config(stage, str(tmp_path), tile=1000),),
                           timeout=180)
    _assert_same_training(plain, nvme, 1e-6)
    assert list(tmp_path.iterdir()) == []  # swap files are removed on clean exit


def test_nvme_offload_bf16_and_its_accounting(tmp_path):
    plain = run_distributed(_train, 2, args=(_config(2, False, "bf16"),), timeout=180)
    nvme = run_distributed(_train, 2, args=(_config(2, str(tmp_path), "bf16", tile=1024),),
                           timeout=180)
    _assert_same_training(plain, nvme, 1e-6)
    report = nvme[0][2]
    by_location = report["model_state_by_location"]
    assert by_location["measured"] == by_location["expected"]
    # Master and Adam state are on NVMe only; the host holds the bf16 gradient shard.
    assert by_location["measured"]["host"] == plain[0][2]["categories"]["gradient"]["peak"]
    moved = sum(plain[0][2]["categories"][c]["current"] for c in ("fp32_master", "optimizer_state"))
    assert by_location["measured"]["nvme"] == moved
    # On the host: two chunks of each of the 3 arrays (page-rounded); the model is on the host,
    # so no gradient or parameter staging.
    assert report["categories"]["staging"]["current"] == 3 * 2 * 4096


def test_nvme_resume_is_bit_for_bit(tmp_path):
    swap, ckpt = tmp_path / "swap", tmp_path / "ckpt"
    swap.mkdir()
    config = _config(3, str(swap), "bf16", tile=1000)
    full = run_distributed(_resume, 2, args=(config, str(ckpt), "full"))
    first = run_distributed(_resume, 2, args=(config, str(ckpt), "first"))
    second = run_distributed(_resume, 2, args=(config, str(ckpt), "second"))
    assert first[0] + second[0] == full[0]


def _fails_to_build(rank, world, path, file_size_limit=None):
    import resource
    import signal

    import zero

    if file_size_limit is not None:  # a disk that is full past this many bytes per file
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    with pytest.raises(Exception) as info:
        zero.initialize(model=training.make_model(), config=_config(2, path))
    return str(info.value)


def test_an_nvme_path_that_cannot_hold_files_is_a_clear_error(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    message = run_distributed(_fails_to_build, 1, args=(str(not_a_directory),))[0]
    assert f"nvme_path '{not_a_directory}' is not an existing directory" in message


def test_a_full_disk_while_preallocating_the_swap_file_is_a_clear_error(tmp_path):
    message = run_distributed(_fails_to_build, 1, args=(str(tmp_path), 4096))[0]
    assert str(tmp_path) in message and "errno" in message
    assert "File too large" in message or "No space left" in message


def _truncated(rank, world, config, swap_key="swap"):
    """Trains a step, truncates the first group's swap file named by group_offload_info's
    `swap_key` to one page (the drive lost the rest), trains again; returns the file and the
    error."""
    import os

    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 1, GAS)
    infos = [engine.core.group_offload_info(g) for g in range(engine.core.group_count)]
    swap_file = next(getattr(info, swap_key) for info in infos
                     if getattr(info, swap_key)).split(" (")[0]
    os.truncate(training.open_path(swap_file), 4096)
    with pytest.raises(Exception) as info:
        training.train_engine(engine, rank, world, 1, GAS, first_step=1)
    return swap_file, str(info.value)


def test_a_truncated_swap_file_is_a_short_read_error_not_silent_corruption(tmp_path):
    config = _config(2, str(tmp_path), tile=1000)
    swap_file, message = run_distributed(_truncated, 1, args=(config,))[0]
    assert swap_file in message and "offset" in message


# ---- parameter offload (stage 3): the parameter shard lives in host memory -------------------

@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("optimizer_offload", [False, "cpu"], ids=["params-only", "params+optimizer"])
def test_parameter_offload_matches_the_engine_without_it(world, optimizer_offload):
    plain = run_distributed(_train, world, args=(_config(3, False),), timeout=180)
    offloaded = run_distributed(_train, world, args=(_config(3, optimizer_offload, params=True),),
                                timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)


def test_parameter_offload_bf16_accounting(tmp_path):
    plain = run_distributed(_train, 2, args=(_config(3, False, "bf16"), 2), timeout=180)
    offloaded = run_distributed(_train, 2, args=(_config(3, "cpu", "bf16", params=True), 2),
                                timeout=180)
    _assert_same_training(plain, offloaded, 1e-6)
    report, base = offloaded[0][2], plain[0][2]
    by_location = report["model_state_by_location"]
    assert by_location["measured"] == by_location["expected"]
    # The partitioned parameter and gradient shards left the device; the persistent small
    # parameters (a stage-1 group, whole on every rank) stay there with their gradients.
    param = report["categories"]["param"]["by_location"]
    assert param["host_pageable"]["current"] == 2 * report["numel"] // 2
    assert param["device"]["current"] == 2 * report["persistent_numel"]
    # Of the partitioned model only the gathered working set (and the buckets) remain on the
    # device: its model states are the persistent parameters and their gradients, nothing else.
    assert by_location["measured"]["device"] == 2 * 2 * report["persistent_numel"]
    assert report["categories"]["gradient"]["by_location"]["host_pageable"]["current"] == \
        2 * report["numel"] // 2
    assert report["categories"]["gathered_param"]["peak"] > 0


def test_resume_with_parameter_offload_is_bit_for_bit(tmp_path):
    config = _config(3, "cpu", "bf16", params=True)
    full = run_distributed(_resume, 2, args=(config, str(tmp_path), "full"))
    first = run_distributed(_resume, 2, args=(config, str(tmp_path), "first"))
    second = run_distributed(_resume, 2, args=(config, str(tmp_path), "second"))
    assert first[0] + second[0] == full[0]


# ---- delayed parameter update (ZeRO-Offload's DPU) -------------------------------------------

def _dpu_config(stage):
    config = _config(stage, "cpu", tile=1000)
    config["zero_optimization"]["offload_optimizer"]["delayed_update"] = True
    return config


def _train_dpu(rank, world, config, steps=STEPS):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    pending = []

    def watch(step, loss):
        pending.append(engine.core.group_offload_info(0).delayed_pending)
        return loss
    losses = training.train_engine(engine, rank, world, steps, GAS, on_step=watch)
    engine.apply_delayed_update()
    state = engine.module_state_dict()
    params = {k: v.float().cpu() for k, v in state.items()} if rank == 0 else None
    return losses, params, pending


def _dpu_reference(world, steps, config):
    """Single process, global batch: forward/backward on the model's (lagging) parameters,
    then the previous update's parameters become the model's and torch.optim.AdamW updates
    the master with this step's gradients."""
    import copy

    from zero.schedulers import build_scheduler

    model = training.make_model()
    master = copy.deepcopy(model)
    hyper = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(master.parameters(), lr=hyper["lr"], betas=tuple(hyper["betas"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"],
                                  foreach=False)
    scheduler = build_scheduler(config["scheduler"]["type"],
                                copy.deepcopy(config["scheduler"]["params"]), optimizer)
    data = training.batches(world, steps, GAS)
    losses, pending = [], None
    for step in range(steps):
        model.zero_grad()
        total = 0.0
        for micro in range(GAS):
            parts = [data[(step * GAS + micro) * world + r] for r in range(world)]
            loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            (loss / GAS).backward()
            total += loss.item()
        losses.append(total / GAS)
        grads = [p.grad.clone() for p in model.parameters()]
        with torch.no_grad():
            if pending is not None:
                for p, value in zip(model.parameters(), pending):
                    p.copy_(value)
        for p, g in zip(master.parameters(), grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(list(master.parameters()), config["gradient_clipping"])
        optimizer.step()
        scheduler.step()
        pending = [p.detach().clone() for p in master.parameters()]
    with torch.no_grad():
        for p, value in zip(model.parameters(), pending):
            p.copy_(value)
    return losses, training.parameters_of(model)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_delayed_update_trains_one_update_behind_exactly(stage):
    config = _dpu_config(stage)
    ref_losses, ref_params = _dpu_reference(2, STEPS, config)
    results = run_distributed(_train_dpu, 2, args=(config,), timeout=180)
    for losses, _, pending in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        # After the first step an update is always in flight while the next step computes.
        assert pending[GAS:] == [True] * (len(pending) - GAS)
    for name, expected in ref_params.items():
        assert training.relative_error(results[0][1][name], expected) < 1e-5, name
    plain = run_distributed(_train, 2, args=(_config(stage, "cpu", tile=1000),), timeout=180)
    assert plain[0][0][2:] != results[0][0][2:]  # it really is a different trajectory


def test_resume_with_a_delayed_update_in_flight_is_bit_for_bit(tmp_path):
    config = _dpu_config(2)
    full = run_distributed(_resume, 2, args=(config, str(tmp_path), "full"))
    first = run_distributed(_resume, 2, args=(config, str(tmp_path), "first"))
    second = run_distributed(_resume, 2, args=(config, str(tmp_path), "second"))
    assert first[0] + second[0] == full[0]


# ---- partial offload (ratio < 1): the shard's tail on the host, its head on the device -------

def _ratio_config(stage, ratio, target="cpu", precision="fp32"):
    config = _config(stage, target, precision, tile=700)
    config["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
    return config


def _ratio_split(rank, world, config):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    split = [(engine.core.group_numel(g) // world,
              engine.core.group_offload_info(g).offloaded_numel)
             for g in range(engine.core.group_count)]
    state = engine.module_state_dict()
    report = engine.memory_report()
    params = {k: v.float() for k, v in state.items()} if rank == 0 else None
    return losses, params, report, split


@pytest.mark.parametrize("stage,ratio", [(1, 0.5), (2, 0.3), (3, 0.75)])
def test_partial_offload_matches_the_engine_without_it(stage, ratio):
    plain = run_distributed(_train, 2, args=(_config(stage, False),), timeout=180)
    partial = run_distributed(_ratio_split, 2, args=(_ratio_config(stage, ratio),), timeout=180)
    _assert_same_training(plain, [r[:3] for r in partial], 1e-6)
    for shard, offloaded in partial[0][3]:
        assert offloaded == round(ratio * shard)  # the tail: this fraction of every shard


def test_partial_nvme_offload_and_resume(tmp_path):
    swap, ckpt = tmp_path / "swap", tmp_path / "ckpt"
    swap.mkdir()
    config = _ratio_config(2, 0.6, target=str(swap), precision="bf16")
    plain = run_distributed(_train, 2, args=(_config(2, False, "bf16"),), timeout=180)
    partial = run_distributed(_ratio_split, 2, args=(config,), timeout=180)
    _assert_same_training(plain, [r[:3] for r in partial], 1e-6)
    full = run_distributed(_resume, 2, args=(config, str(ckpt), "full"))
    first = run_distributed(_resume, 2, args=(config, str(ckpt), "first"))
    second = run_distributed(_resume, 2, args=(config, str(ckpt), "second"))
    assert first[0] + second[0] == full[0]


def test_fp16_offload_with_loss_scaling_matches_the_engine_without_it():
    # Dynamic loss scale starts at 2^8 (training.engine_config): the host step must unscale
    # and clip as the device step does and skip the same overflowing steps. The fused CPU
    # kernel follows torch's fused Adam and the device path torch's for-loop Adam: their
    # masters can differ by an ulp, which rounding to fp16 (11-bit mantissa) occasionally
    # turns into an fp16 ulp of a weight (~5e-4 relative). Stated tolerances: 1e-4 on the
    # losses (observed 3.5e-6), 1e-3 on the weights (observed 1.7e-4).
    plain = run_distributed(_train, 2, args=(_config(2, False, "fp16"),), timeout=180)
    offloaded = run_distributed(_train, 2, args=(_config(2, "cpu", "fp16", tile=1000),),
                                timeout=180)
    _assert_same_training(plain, offloaded, 1e-4, param_tolerance=1e-3)


def _offload_timings(rank, world, config, steps):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, steps, GAS)
    timings = [engine.core.group_offload_timings(g) for g in range(engine.core.group_count)]
    return [(t.steps, t.grads_in_wait_s, t.cpu_optimizer_s, t.params_out_wait_s, t.step_s)
            for t in timings]


def test_the_offloaded_step_accounts_for_its_time():
    """Each offloaded group counts its steps and splits their time into waiting for
    gradients, the CPU optimizer and waiting for parameters, parts of the whole."""
    for groups in run_distributed(_offload_timings, 2, args=(_config(2, True, tile=1000), 3)):
        assert groups
        for steps, grads_in, optimizer, params_out, whole in groups:
            assert steps == 3
            assert optimizer > 0 and grads_in >= 0 and params_out >= 0
            assert grads_in + optimizer + params_out <= whole


def _backward_copies(rank, world, config, steps):
    import time

    import offload
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    start = time.perf_counter()
    training.train_engine(engine, rank, world, steps, GAS)
    elapsed = time.perf_counter() - start
    units = sum(engine.core.group_layout(g).unit_count for g in range(engine.core.group_count))
    return units, offload.backward_copy_timings(engine.core), elapsed


def test_backward_accounts_for_its_copies_into_the_host_gradient_shard():
    """After a window's first micro-step, every unit's reduced 1/N is added into the host
    shard by one copy-engine batch (the first goes straight into it here, where the buckets
    are host memory too; a GPU's first is a batch as well); the copy engine's time for them
    and the engine thread's wait are counted."""
    steps = 3
    for units, copies, elapsed in run_distributed(_backward_copies, 2,
                                                  args=(_config(2, True, "bf16"), steps)):
        assert units > 1
        assert copies["batches"] == units * (GAS - 1) * steps
        # both within the training's wall time (the copies run beside it, the waits in it)
        assert 0 < copies["copy_s"] < elapsed and copies["wait_s"] < elapsed


def _steps_on_threads(rank, world, config, threads):
    """Three steps of a 4 x 256-wide MLP (its shard takes several of the host Adam's ranges)
    with the host Adam on `threads` threads (the engine's pool takes torch's thread count)."""
    import zero

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    engine, _, _, _ = zero.initialize(model=model, config=config)
    dtype = next(engine.module.parameters()).dtype
    for step in range(3):
        inputs = torch.randn(4, 256, generator=torch.Generator().manual_seed(step))
        loss = engine(inputs.to(dtype)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    return {name: value.float().clone() for name, value in engine.module_state_dict().items()}


@pytest.mark.parametrize("precision", ["fp32", "bf16-states"])
def test_the_host_adam_on_several_threads_gives_the_same_bits(precision):
    """The host Adam's ranges (core/range_pool.h) on 4 threads against 1: the same weights bit
    for bit, for fp32 state (the fused kernel on each range) and bf16 state (widened a tile at
    a time on each range)."""
    config = training.engine_config(2, gas=1, precision="bf16" if "bf16" in precision else "fp32")
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if precision == "bf16-states":
        config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    one = run_distributed(_steps_on_threads, 1, args=(config, 1))[0]
    four = run_distributed(_steps_on_threads, 1, args=(config, 4))[0]
    torch.manual_seed(0)
    start = torch.nn.Linear(256, 256).weight.to(torch.bfloat16 if "bf16" in precision else None)
    assert not torch.equal(one["0.weight"], start.float())  # the steps moved the weights
    assert one.keys() == four.keys()
    for name, value in one.items():
        assert torch.equal(four[name], value), name
