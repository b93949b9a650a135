"""DeepSpeed's monitor blocks (tensorboard, csv_monitor, wandb, comet) and wall_clock_breakdown
on two gloo ranks: what the files hold is checked against what each rank's engine saw."""
import contextlib
import csv
import glob
import io
import json
import os
import struct
import sys
import zipfile

import pytest

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict

pytestmark = pytest.mark.timeout(180)

STEPS, GAS, WORLD = 3, 2, 2
SAMPLES_PER_STEP = training.MICRO_BATCH * GAS * WORLD


def _train(rank, world, extra, steps=STEPS, stage=2, precision="fp16", **zero_extra):
    """Trains with `extra` config blocks; returns what this rank saw, step by step."""
    import zero
    from zero.monitor import events

    config = training.engine_config(stage, gas=GAS, precision=precision, **zero_extra)
    config.update(extra)
    engine, *_ = zero.initialize(model=training.make_model(), config=config)
    seen = {"losses": [], "lrs": [], "loss_scales": [], "comm": [], "stdout": ""}
    micro_losses = []
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for step in range(steps):
            def keep(_, loss):
                micro_losses.append(float(loss.detach()))
                return loss
            training.train_engine(engine, rank, world, 1, GAS, first_step=step, on_step=keep)
            seen["losses"].append(sum(micro_losses[-GAS:]) / GAS)
            seen["lrs"].append(engine.get_lr()[0])
            seen["loss_scales"].append(engine.optimizer.cur_scale)
            seen["comm"].append(as_dict(engine.core.comm_stats()))
        seen["memory"] = events.memory_scalars(engine.core.registry(), engine.watch.activation_bytes)
        seen["memory_names"] = events.memory_names()
        seen["numel"] = sum(engine.core.group_numel(g) for g in range(engine.core.group_count))
        seen["wall_clock"] = engine.get_wall_clock_timers()
        engine.destroy()
    seen["stdout"] = out.getvalue()
    return seen


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("monitors"))
    extra = {"tensorboard": {"enabled": True, "output_path": out, "job_name": "tb"},
             "csv_monitor": {"enabled": True, "output_path": out, "job_name": "csv"}}
    ranks = run_distributed(_train, WORLD, args=(extra,), timeout=150)
    return out, ranks


def test_tensorboard_writes_deepspeeds_scalars_at_the_sample_counts(monitored):
    out, _ = monitored
    scalars = _scalars(os.path.join(out, "tb"))
    expected_steps = [SAMPLES_PER_STEP * (i + 1) for i in range(STEPS)]
    for tag in ("Train/Samples/lr", "Train/Samples/train_loss", "Train/Samples/loss_scale",
                "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
                "Train/Samples/elapsed_time_ms_backward_inner",
                "Train/Samples/elapsed_time_ms_backward_allreduce",
                "Train/Samples/elapsed_time_ms_step", "Comm/total_bytes"):
        assert [step for step, _ in scalars[tag]] == expected_steps, tag


def test_only_rank_0_writes_event_files(monitored):
    out, _ = monitored
    assert len(glob.glob(os.path.join(out, "tb", "events.out.tfevents.*"))) == 1


def test_tensorboard_loss_lr_and_loss_scale_are_rank_0s(monitored):
    out, ranks = monitored
    scalars = _scalars(os.path.join(out, "tb"))
    assert [v for _, v in scalars["Train/Samples/lr"]] == pytest.approx(ranks[0]["lrs"], rel=1e-6)
    assert [v for _, v in scalars["Train/Samples/train_loss"]] == pytest.approx(ranks[0]["losses"], rel=1e-5)
    assert [v for _, v in scalars["Train/Samples/loss_scale"]] == ranks[0]["loss_scales"]


def test_tensorboard_memory_per_rank_is_each_ranks_registry(monitored):
    out, ranks = monitored
    scalars = _scalars(os.path.join(out, "tb"))
    for rank, seen in enumerate(ranks):
        for name, value in zip(seen["memory_names"], seen["memory"]):
            if name == "process/rss":
                continue  # moves between the last step and the end of the run
            series = scalars[f"Memory/rank{rank}/{name}_bytes"]
            assert series[-1] == (SAMPLES_PER_STEP * STEPS, value), name
    assert scalars["Memory/rank1/category/param_bytes"][-1][1] > 0


def test_comm_bytes_per_step_are_the_stage_2_formula(monitored):
    out, ranks = monitored
    scalars = _scalars(os.path.join(out, "tb"))
    psi_bytes = ranks[0]["numel"] * 2  # fp16 parameters and gradients
    # stage 2: every micro-batch reduce-scatters the gradients, the step all-gathers the parameters
    assert {v for _, v in scalars["Comm/reduce_scatter_bytes"]} == {GAS * psi_bytes}
    assert {v for _, v in scalars["Comm/all_gather_bytes"]} == {psi_bytes}
    totals = [after["total_bytes"] - before["total_bytes"]
              for before, after in zip([{"total_bytes": 0}] + ranks[0]["comm"], ranks[0]["comm"])]
    assert [v for _, v in scalars["Comm/total_bytes"]][1:] == totals[1:]


def test_csv_monitor_writes_deepspeeds_files(monitored):
    out, _ = monitored
    scalars = _scalars(os.path.join(out, "tb"))
    for tag in ("Train/Samples/lr", "Train/Samples/train_loss", "Memory/rank1/location/device_bytes"):
        path = os.path.join(out, "csv", tag.replace("/", "_") + ".csv")
        with open(path) as handle:
            rows = list(csv.reader(handle))
        assert rows[0] == ["step", tag.split("/")[-1]]
        assert [(int(step), float(value)) for step, value in rows[1:]] == \
            [(step, pytest.approx(value, rel=1e-6)) for step, value in scalars[tag]]


def test_wall_clock_breakdown_prints_deepspeeds_line_every_steps_per_print():
    ranks = run_distributed(_train, WORLD, args=({"wall_clock_breakdown": True, "steps_per_print": 2},),
                            kwargs={"steps": 4}, timeout=150)
    lines = [line for line in ranks[0]["stdout"].splitlines() if line.startswith("time (ms)")]
    assert len(lines) == 2  # steps 2 and 4
    names = [part.split(":")[0].strip() for part in lines[0].split(" | ")[1:]]
    assert names == ["fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"]
    values = {part.split(":")[0].strip(): float(part.split(":")[1]) for part in lines[0].split(" | ")[1:]}
    assert values["bwd"] >= values["bwd_inner"] > 0 and values["fwd"] > 0
    assert not [line for line in ranks[1]["stdout"].splitlines() if line.startswith("time (ms)")]
    for rank in ranks:  # DeepSpeed's engine.get_wall_clock_timers(): the last step's, every rank
        last = rank["wall_clock"]
        assert list(last) == names and last["bwd"] >= last["bwd_inner"] > 0 and last["fwd"] > 0


def test_wall_clock_breakdown_with_offload_splits_the_step():
    ranks = run_distributed(_train, WORLD, args=({"wall_clock_breakdown": True},),
                            kwargs={"steps": 1, "precision": "bf16",
                                    "offload_optimizer": {"device": "cpu"}}, timeout=150)
    line = next(line for line in ranks[0]["stdout"].splitlines() if line.startswith("time (ms)"))
    for name in ("step_offload_in", "step_cpu_adam", "step_offload_out", "bwd_offload_wait"):
        assert f"| {name}: " in line
    cpu_adam = float(line.split("| step_cpu_adam: ")[1].split(" ")[0])
    assert cpu_adam > 0


def _wandb_history(path):
    """The history rows of an offline wandb run file: W&B's 7-byte header, then records in
    LevelDB's log format (32 KiB blocks; chunks with a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data, rows, pending, pos, block = open(path, "rb").read(), [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        pending = (pending if kind in (3, 4) else b"") + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record.FromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_wandb_offline_run_holds_every_steps_scalars(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    ranks = run_distributed(_train, WORLD, args=({"wandb": {"enabled": True, "project": "zero-test"}},),
                            env=env, timeout=150)
    runs = glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(runs) == 1  # rank 0's
    rows = _wandb_history(runs[0])
    assert [row["_step"] for row in rows] == [SAMPLES_PER_STEP * (i + 1) for i in range(STEPS)]
    assert [row["Train/Samples/lr"] for row in rows] == pytest.approx(ranks[0]["lrs"])
    assert [row["Train/Samples/train_loss"] for row in rows] == pytest.approx(ranks[0]["losses"], rel=1e-5)
    assert all("Memory/rank1/category/param_bytes" in row for row in rows)


def test_comet_offline_experiment_logs_every_samples_log_interval(tmp_path):
    env = {"COMET_OFFLINE_DIRECTORY": str(tmp_path)}
    comet = {"enabled": True, "online": False, "project": "zero-test",
             "samples_log_interval": 2 * SAMPLES_PER_STEP}
    ranks = run_distributed(_train, WORLD, args=({"comet": comet},), env=env, timeout=150)
    archives = glob.glob(os.path.join(tmp_path, "*.zip"))
    assert len(archives) == 1  # rank 0's
    messages = zipfile.ZipFile(archives[0]).read("messages.json").decode()
    metrics = [json.loads(line)["payload"]["metric"] for line in messages.splitlines()
               if line.strip() and json.loads(line)["type"] == "metric_msg"]
    lr = [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "Train/Samples/lr"]
    # samples 8, 16, 24 with an interval of 16: the first, then 24
    assert [step for step, _ in lr] == [SAMPLES_PER_STEP, 3 * SAMPLES_PER_STEP]
    assert float(lr[-1][1]) == pytest.approx(ranks[0]["lrs"][-1])


def test_a_missing_monitor_package_names_the_package_and_the_fix(monkeypatch):
    import sys

    from zero.config import load_config
    from zero.monitor.master import MonitorMaster

    monkeypatch.setitem(sys.modules, "wandb", None)
    config = load_config({"train_batch_size": 1, "wandb": {"enabled": True}}, world_size=1)
    with pytest.raises(ImportError, match=r"needs the wandb package.*pip install wandb"):
        MonitorMaster(config, rank=0)
    assert MonitorMaster(config, rank=1).writers == []  # only rank 0 writes


def _profiled(rank, world, out):
    """Stage 3, flops_profiler at step 1; rank 0 also counts the same forward itself."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from flop_reference import CPU_ATTENTION

    import zero

    config = training.engine_config(3, gas=GAS, stage3_param_persistence_threshold=0)
    config["flops_profiler"] = {"enabled": True, "profile_step": 1, "module_depth": 2,
                                "output_file": os.path.join(out, "flops.txt")}
    engine, *_ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, GAS)
    profile = engine.watch.flops_profile
    engine.destroy()
    if rank != 0:
        return profile
    tokens, targets = training.batches(world, 2, GAS)[(1 * GAS) * world + rank]
    reference = training.make_model()
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        reference(tokens, targets)
    numel = sum(p.numel() for p in reference.parameters())
    return {"root": profile[""], "flops": counter.get_total_flops(), "numel": numel}


def test_flops_profiler_block_profiles_the_configured_step_on_rank_0(tmp_path):
    ranks = run_distributed(_profiled, WORLD, args=(str(tmp_path),), timeout=150)
    assert ranks[1] is None  # rank 0 profiles, as DeepSpeed
    root = ranks[0]["root"]
    assert root.flops == ranks[0]["flops"] > 0  # torch.utils.flop_counter's count, exactly
    assert root.macs * 2 == root.flops
    assert root.params == ranks[0]["numel"]  # whole parameters, though stage 3 holds shards
    text = (tmp_path / "flops.txt").read_text()
    assert "Profile Summary at step 2:" in text  # profile_step 1 (0-based), as DeepSpeed labels it
    assert "bwd latency:" in text and "step latency:" in text


WANDB_TO_EXIT = """
import training
import zero
config = training.engine_config(1, gas=1, scheduler=False)
config["wandb"] = {"enabled": True, "project": "zero-test"}
engine, *_ = zero.initialize(model=training.make_model(), config=config)
training.train_engine(engine, 0, 1, 2, 1)
"""


@pytest.mark.timeout(150)
def test_a_wandb_run_alive_at_exit_is_finished_without_an_error(tmp_path):
    """The engine, destroyed at exit by a handler zero registered on import, finished the run
    after wandb's own exit teardown: a ConnectionResetError traceback at the end of every run,
    and the rest of destroy() skipped."""
    import subprocess

    from distributed_harness import REPO, subprocess_env

    script = tmp_path / "job.py"
    script.write_text(WANDB_TO_EXIT)
    env = subprocess_env(OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
                         WANDB_SILENT="true")
    env["PYTHONPATH"] += os.pathsep + os.path.join(REPO, "tests")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr and "Error" not in proc.stderr, \
        proc.stderr[-3000:]
    runs = glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(runs) == 1 and len(_wandb_history(runs[0])) == 2


def _breakdown(rank, world):
    import zero

    config = training.engine_config(2, gas=1, scheduler=False)
    config["memory_breakdown"] = True  # DeepSpeed's debugging switch: zero refused it
    engine, *_ = zero.initialize(model=training.make_model(), config=config)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        training.train_engine(engine, rank, world, 1, 1)
    return engine.memory_breakdown(), out.getvalue()


def test_memory_breakdown_prints_memory_around_each_phase_on_rank_0():
    (on, printed), (_, quiet) = run_distributed(_breakdown, WORLD, timeout=60)
    assert on and quiet == ""
    lines = printed.splitlines()
    for phase in ("forward", "backward", "step"):
        for when in ("before", "after"):
            at = lines.index(f"Engine {when} {phase}")
            assert lines[at + 1].startswith("CPU Virtual Memory:  used = "), printed
