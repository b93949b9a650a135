"""zero-mem with offload: the estimate of every model-state category equals the engine's
measured bytes exactly at each location (device, host, NVMe; world sizes 1/2/4; optimizer on
the host or NVMe at stages 1-3, parameters on the host or NVMe at stage 3), the host staging
exactly, the device staging, buckets and gathered working set within 5% (they come out
exact), the NVMe swap files byte for byte; and parameters on NVMe follow the engine's
max_in_cpu rule and buffer_size error. The tuner's offload: test_estimate_offload_tuner.py."""
import dataclasses
import json
import os

import pytest

import training
from distributed_harness import run_distributed
from estimate_offload_config import FACTORY, GAS, _close, _config
from zero.reports import cli
from zero.reports import estimate as est

MODEL_STATES = ("param", "gradient", "fp32_master", "optimizer_state")
SGD_MOMENTUM = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
SGD = {"type": "SGD", "params": {"lr": 0.05}}

# (label, stage, precision, zero_optimization overrides; "optimizer" picks SGD). Every offload
# the engine builds, fp32 (the host keeps an fp32 master of its own) and bf16 (16-bit staging
# of the parameters too), chunks smaller than the shard (sub_group_size), the state arrays of
# Adam / SGD with momentum / plain SGD on NVMe, and stage-3 gather bounds that change how many
# shard pieces are in flight at once (device staging with offload_param).
GRID = [
    ("s1-cpu-bf16", 1, "bf16", {"offload_optimizer": "cpu"}),
    ("s2-cpu-fp32-chunks", 2, "fp32", {"offload_optimizer": "cpu", "sub_group_size": 1000}),
    ("s1-nvme-fp32", 1, "fp32", {"offload_optimizer": "nvme"}),
    ("s2-nvme-bf16-chunks-overlap", 2, "bf16", {"offload_optimizer": "nvme",
                                                "sub_group_size": 1000, "overlap_comm": True}),
    ("s2-nvme-sgd-momentum", 2, "bf16", {"offload_optimizer": "nvme", "sub_group_size": 777,
                                         "optimizer": SGD_MOMENTUM}),
    ("s1-nvme-sgd", 1, "fp32", {"offload_optimizer": "nvme", "optimizer": SGD}),
    ("s3-cpu-bf16", 3, "bf16", {"offload_optimizer": "cpu"}),
    ("s2-cpu-delayed-bf16", 2, "bf16", {"offload_optimizer": "cpu", "delayed_update": True,
                                         "sub_group_size": 1000}),
    ("s3-cpu-delayed-fp32", 3, "fp32", {"offload_optimizer": "cpu", "delayed_update": True}),
    ("s3-nvme-fp32-chunks", 3, "fp32", {"offload_optimizer": "nvme", "sub_group_size": 1000}),
    ("s3-params-fp32", 3, "fp32", {"offload_param": "cpu"}),
    ("s3-cpu-params-bf16", 3, "bf16", {"offload_optimizer": "cpu", "offload_param": "cpu"}),
    ("s3-nvme-params-bf16-prefetch-1", 3, "bf16", {
        "offload_optimizer": "nvme", "offload_param": "cpu",
        "stage3_prefetch_bucket_size": 13_000, "stage3_max_reuse_distance": 0}),
    ("s3-cpu-params-bf16-no-prefetch", 3, "bf16", {
        "offload_optimizer": "cpu", "offload_param": "cpu", "overlap_comm": False,
        "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}),
    # partial offload: each shard's tail (ratio x Ψ/N, rounded) on the host / NVMe, its head
    # with an fp32 master of its own on the device
    ("s2-cpu-ratio-fp32", 2, "fp32", {"offload_optimizer": "cpu", "ratio": 0.5,
                                      "sub_group_size": 700}),
    ("s1-nvme-ratio-bf16", 1, "bf16", {"offload_optimizer": "nvme", "ratio": 0.3}),
    ("s3-cpu-ratio-params-bf16", 3, "bf16", {"offload_optimizer": "cpu", "ratio": 0.75,
                                             "offload_param": "cpu"}),
    ("s2-cpu-ratio-0-bf16", 2, "bf16", {"offload_optimizer": "cpu", "ratio": 0.0}),
    # grads_on_device: the gradient shard on the device (stage 3: the partitioned group's),
    # with the delayed update's host copy of it, and beside parameters on the host
    ("s2-cpu-delayed-grads-on-device-bf16", 2, "bf16", {
        "offload_optimizer": "cpu", "delayed_update": True, "grads_on_device": True}),
    ("s3-nvme-params-grads-on-device-fp32", 3, "fp32", {
        "offload_optimizer": "nvme", "offload_param": "cpu", "grads_on_device": True}),
    # DeepSpeed's bf16_master_weights_and_grads (a bf16 master on the host / NVMe) and
    # bf16_optimizer_states, a partial offload's device head included
    ("s2-cpu-bf16-master", 2, "bf16", {"offload_optimizer": "cpu",
                                       "bf16": {"bf16_master_weights_and_grads": True}}),
    ("s2-cpu-bf16-master-cpu-adam-16-bit-moments", 2, "bf16", {
        "offload_optimizer": "cpu", "bf16": {"bf16_master_weights_and_grads": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "fp32_optimizer_states": False}}}),
    ("s3-nvme-bf16-master-states-chunks", 3, "bf16", {
        "offload_optimizer": "nvme", "sub_group_size": 1000,
        "bf16": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}),
    ("s3-cpu-ratio-params-bf16-master-states", 3, "bf16", {
        "offload_optimizer": "cpu", "ratio": 0.5, "offload_param": "cpu",
        "bf16": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}),
    # data_types.grad_accum_dtype fp32: the delayed update keeps fp32 gradients, the host
    # gradient shard is fp32
    ("s2-cpu-delayed-bf16-fp32-grads", 2, "bf16", {
        "offload_optimizer": "cpu", "delayed_update": True, "sub_group_size": 1000,
        "data_types": {"grad_accum_dtype": "fp32"}}),
    ("s1-nvme-bf16-fp32-grads", 1, "bf16", {"offload_optimizer": "nvme",
                                            "data_types": {"grad_accum_dtype": "fp32"}}),
    ("s3-cpu-params-bf16-fp32-grads", 3, "bf16", {
        "offload_optimizer": "cpu", "offload_param": "cpu",
        "data_types": {"grad_accum_dtype": "fp32"}}),
]

# Parameters on NVMe (offload_param "nvme"): alone and with the optimizer on the host or NVMe,
# fp32 and bf16; buffer_count 3 and buffer_size exactly the largest unit's shard on one rank;
# max_in_cpu that keeps the root unit (N = 1, 2) or the root and the first block (N = 4:
# 904 + 3,104 <= 5,000; and = 4,008, the bound itself) in host memory and the rest on NVMe,
# and one that keeps everything; a
# partial optimizer offload whose cut falls inside the NVMe units.
NVME_PARAMS_GRID = [
    ("s3-params-nvme-fp32", 3, "fp32", {"offload_param": "nvme"}),
    ("s3-params-nvme-bf16-buffers-3", 3, "bf16", {"offload_param": "nvme",
                                                  "param_buffer_count": 3}),
    ("s3-cpu-params-nvme-bf16", 3, "bf16", {"offload_optimizer": "cpu", "offload_param": "nvme",
                                            "param_buffer_size": 12_416}),
    ("s3-cpu-params-nvme-fp32-max-in-cpu", 3, "fp32", {
        "offload_optimizer": "cpu", "offload_param": "nvme", "param_max_in_cpu": 5_000,
        "param_buffer_count": 2}),
    ("s3-nvme-params-nvme-bf16-chunks", 3, "bf16", {
        "offload_optimizer": "nvme", "offload_param": "nvme", "sub_group_size": 1000,
        "stage3_prefetch_bucket_size": 13_000, "stage3_max_reuse_distance": 0}),
    ("s3-nvme-params-nvme-fp32-max-in-cpu-exact", 3, "fp32", {
        "offload_optimizer": "nvme", "offload_param": "nvme", "param_max_in_cpu": 4_008}),
    ("s3-cpu-ratio-params-nvme-bf16", 3, "bf16", {
        "offload_optimizer": "cpu", "ratio": 0.6, "sub_group_size": 700,
        "offload_param": "nvme", "param_buffer_count": 2}),
    ("s3-params-nvme-all-in-cpu-bf16", 3, "bf16", {"offload_param": "nvme",
                                                   "param_max_in_cpu": 10**9}),
]


def _report_with_offloaded_numel(engine, rank):
    """The report as the engine gives it once its StateLayouts carry each layout's offloaded
    elements (the engine change that a partial offload needs; zero.memory takes them)."""
    from zero.memory import build_report

    offloaded = {}
    for g, group in enumerate(engine.groups):
        persistent = engine.stage == 3 and group.stage != 3
        numel = engine.core.group_offload_info(g).offloaded_numel
        offloaded[persistent] = offloaded.get(persistent, 0) + numel
    layouts = [dataclasses.replace(layout, offloaded_numel=offloaded.get(layout.persistent, 0))
               for layout in engine._layouts]
    return build_report(engine.core.registry(), layouts, rank, engine.global_steps, {})


def _measure(rank, world, grid, nvme_path, factory=None, steps=2):
    """Per grid entry: one engine, two steps; the report, every location's peak and the size
    of each group's swap file."""
    import zero

    out = []
    for _, stage, precision, overrides in grid:
        config = _config(stage, precision, overrides, nvme_path)
        model = (factory or training.make_model)()
        engine, _, _, _ = zero.initialize(model=model, config=config)
        training.train_engine(engine, rank, world, steps, GAS)
        report = engine.memory_report()
        swap = param_swap = nvme_param_numel = 0
        for g in range(engine.core.group_count):
            info = engine.core.group_offload_info(g)
            if info.swap:
                swap += os.path.getsize(training.open_path(info.swap.split(" (")[0]))
            if info.param_swap:
                param_swap += os.path.getsize(training.open_path(info.param_swap.split(" (")[0]))
            nvme_param_numel += info.nvme_param_numel
        report["swap_file_bytes"] = swap + param_swap
        report["param_swap_file_bytes"] = param_swap
        report["nvme_param_numel"] = nvme_param_numel
        report["with_offloaded_numel"] = _report_with_offloaded_numel(engine, rank)
        engine.destroy()
        out.append(report)
    return out


def _host(usage: dict) -> dict:
    """Registry locations -> the estimate's (host pinned and pageable are one "host")."""
    out = {}
    for location, value in usage.items():
        where = "host" if location.startswith("host") else location
        out[where] = out.get(where, 0) + value
    return {k: v for k, v in out.items() if v}


def _estimate_for(shapes, world, stage, precision, overrides, nvme_path="/nvme"):
    # the engine trains on the CPU here: its offloaded step updates the model in place
    setup, selected = est.setup_from_config(_config(stage, precision, overrides, nvme_path), world,
                                            cpu_only=True)
    assert selected == stage
    return setup, est.estimate(shapes, setup, stage)  # the config's offload row


def _check(shapes, world, grid, results):
    for rank_result in results:
        for (label, stage, precision, overrides), report in zip(grid, rank_result):
            label = f"{label} N={world}"
            setup, estimate = _estimate_for(shapes, world, stage, precision, overrides)
            option = estimate.option
            assert option.offloaded and estimate.status == est.BUILT, label
            assert estimate.numel == report["numel"], label
            cats = report["categories"]
            # Model states at their peak (stage 3's device gradient shard is given back
            # between steps): every category at every location, exactly, and the engine's own
            # formula column.
            for name in MODEL_STATES:
                row = estimate.categories[name]
                measured = _host({loc: u["peak"] for loc, u in
                                  cats.get(name, {}).get("by_location", {}).items()})
                assert {k: v for k, v in row["by_location"].items() if v} == measured, \
                    (label, name, row["by_location"], measured)
                assert row["bytes"] == cats[name]["expected"], (label, name)
            for where in ("device", "host", "nvme"):
                assert estimate.model_state_at(where) == \
                    report["model_state_by_location"]["measured"][where], (label, where)
            # The live report's formula column by location: right for a whole offload; with a
            # ratio < 1 once the engine passes the offloaded elements to zero.memory.
            fixed = report["with_offloaded_numel"]["model_state_by_location"]
            assert fixed["measured"] == fixed["expected"], (label, fixed)
            if setup.offload_ratio == 1:
                assert report["model_state_by_location"]["measured"] == \
                    report["model_state_by_location"]["expected"], label
            # Host: the pool (state + staging) exactly, current and peak; NVMe exactly.
            staging = cats.get("staging", {}).get("by_location", {})
            host_staging = sum(u["current"] for loc, u in staging.items() if loc != "device")
            assert host_staging == estimate.categories["staging"]["by_location"].get("host", 0), \
                (label, host_staging, estimate.categories["staging"])
            locations = report["by_location"]
            host_peak = locations["host_pinned"]["peak"] + locations["host_pageable"]["peak"]
            assert host_peak == estimate.host_bytes, (label, host_peak, estimate.host_bytes)
            assert locations["nvme"]["current"] == estimate.nvme_bytes, label
            assert report["swap_file_bytes"] == estimate.offload["swap_file_bytes"], label
            params = estimate.offload.get("param_nvme", {"nvme_numel": 0, "swap_file_bytes": 0})
            assert report["nvme_param_numel"] == params["nvme_numel"], label
            assert report["param_swap_file_bytes"] == params["swap_file_bytes"], label
            # Device: buckets (made per unit, freed once reduced) exactly at their peak below
            # stage 3, none kept; at stage 3 buckets, the gathered working set and the
            # device staging (offload_param) within 5% at their peaks.
            device_staging = staging.get("device", {"peak": 0, "current": 0})
            assert device_staging["current"] == 0, label  # freed once the gathers complete
            expected_staging = estimate.categories["staging"]["by_location"].get("device", 0)
            assert _close(expected_staging, device_staging["peak"]), \
                (label, expected_staging, device_staging)
            assert (device_staging["peak"] > 0) == (option.offload_param != "none"), label
            bucket = cats.get("bucket", {"peak": 0, "current": 0})
            gathered = cats.get("gathered_param", {"peak": 0})
            if stage < 3:
                assert bucket["current"] == 0, label
                assert estimate.categories["bucket"]["bytes"] == bucket["peak"], label
                assert estimate.device_bytes == locations["device"]["peak"], label
            else:
                assert _close(estimate.categories["bucket"]["bytes"], bucket["peak"]), label
                assert _close(estimate.categories["gathered_param"]["bytes"], gathered["peak"]), \
                    label
                # an upper bound by at most the buckets, which live in backward only
                assert 0.95 * locations["device"]["peak"] <= estimate.device_bytes <= \
                    1.05 * locations["device"]["peak"] + bucket["peak"], \
                    (label, estimate.device_bytes, locations["device"])


@pytest.mark.parametrize("world", [1, 2, 4])
def test_offload_estimate_equals_the_engines_measured_bytes(world, tmp_path):
    shapes = est.shapes_from_factory(FACTORY)  # built on meta, as `zero-mem estimate` does
    results = run_distributed(_measure, world, args=(GRID, str(tmp_path)), timeout=120)
    _check(shapes, world, GRID, results)
    assert list(tmp_path.iterdir()) == []  # the swap files went with the engines


@pytest.mark.parametrize("world", [1, 2, 4])
def test_parameters_on_nvme_estimate_equals_the_engines_measured_bytes(world, tmp_path):
    shapes = est.shapes_from_factory(FACTORY)
    results = run_distributed(_measure, world, args=(NVME_PARAMS_GRID, str(tmp_path)),
                              timeout=120)
    _check(shapes, world, NVME_PARAMS_GRID, results)
    # what the grid means to cover, on the estimate's side: a host / NVMe split, everything
    # kept in host memory, buffers of 3 and of 2
    for label, stage, precision, overrides in NVME_PARAMS_GRID:
        _, estimate = _estimate_for(shapes, world, stage, precision, overrides)
        params = estimate.offload["param_nvme"]
        where = estimate.categories["param"]["by_location"]
        if "max-in-cpu" in label:
            assert params["host_numel"] > 0 and params["nvme_numel"] > 0, label
            assert where["host"] == estimate.setup.param_bytes * params["host_numel"], label
        elif "all-in-cpu" in label:
            assert params["nvme_numel"] == 0 and "nvme" not in where, label
            assert estimate.categories["staging"]["by_location"].get("host", 0) == 0, label
        else:
            assert params["host_numel"] == 0 and "host" not in where, label
    assert list(tmp_path.iterdir()) == []


def test_offload_rows_in_the_table_and_json(capsys, tmp_path):
    config = _config(3, "bf16", {"offload_optimizer": "nvme", "offload_param": "cpu"},
                     str(tmp_path))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert cli.main(["estimate", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["cpu_only"] is False
    assert out["setup"]["offload"] == {"offload_optimizer": "nvme", "offload_param": "cpu",
                                       "sub_group_size": 1_000_000_000,
                                       "delayed_update": False, "ratio": 1.0,
                                       "grads_on_device": False,
                                       "param_buffer_count": 5,
                                       "param_buffer_size": 100_000_000,
                                       "param_max_in_cpu": 0}
    rows = {o["option"]: o for o in out["options"]}
    row = rows["stage 3 + offload optimizer (NVMe) + params"]
    assert row["status"] == est.BUILT and row["nvme_bytes"] > 0
    assert row["model_state_by_location"]["nvme"] == row["nvme_bytes"]
    assert row["per_node"]["nvme_bytes"] == 2 * row["nvme_bytes"]
    assert row["categories"]["staging"]["by_location"]["device"] > 0  # shard pieces in flight
    assert row["offload"]["state_arrays"] == ["master", "exp_avg", "exp_avg_sq"]
    # Parameters on NVMe: built; the shard in the swap file, buffer_count (5) page-rounded
    # buffers of the largest unit's shard on the host, beside the optimizer's chunks.
    both = rows["stage 3 + offload optimizer + params (NVMe)"]
    assert both["status"] == est.BUILT and both["built"] and "error" not in both
    params = both["offload"]["param_nvme"]
    assert both["categories"]["param"]["by_location"]["nvme"] == 2 * params["nvme_numel"]
    assert params["buffer_bytes"] == 5 * -(-2 * params["largest_nvme_unit_shards"][0]
                                            // 4096) * 4096
    assert both["offload"]["host_staging_bytes"] == \
        row["offload"]["host_staging_bytes"] + params["buffer_bytes"]
    assert both["offload"]["swap_file_bytes"] == \
        row["offload"]["swap_file_bytes"] + params["swap_file_bytes"]
    assert all(o["status"] == est.BUILT for o in out["options"])
    assert cli.main(["estimate", "--model", FACTORY, "--config", str(path),
                     "--world-size", "2"]) == 0
    text = capsys.readouterr().out
    assert "*stage 3 + offload optimizer (NVMe) + params " in text  # the config's row
    assert "2·C·(2+2) + 2·3·⌈4C⌉" in text and "(nvme)" in text and "(host)" in text
    assert "Σ groups 2·C·(2+2) + 2·3·⌈4C⌉ + 5·⌈2·V⌉" in text  # optimizer and params on NVMe
    assert "params on NVMe: 14,224 in a swap file; the host holds buffer_count = 5" in text
    assert "formula only" not in text
    # A model on the CPU is updated in place: the optimizer's chunks stage no gradients or
    # parameters, only the NVMe arrays' slots.
    assert cli.main(["estimate", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--cpu-only"]) == 0
    text = capsys.readouterr().out
    assert "2·C·(2+2)" not in text and "Σ groups 2·3·⌈4C⌉ + 5·⌈2·V⌉" in text
    assert cli.main(["estimate", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--cpu-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["cpu_only"] is True
    # Flags pick the row too; parameter offload needs stage 3, offload stage 1+.
    assert cli.main(["estimate", "--model", FACTORY, "--world-size", "2", "--stage", "1",
                     "--offload-optimizer", "cpu"]) == 0
    assert "*stage 1 + offload optimizer " in capsys.readouterr().out
    assert cli.main(["estimate", "--model", FACTORY, "--world-size", "2", "--stage", "2",
                     "--offload-param", "cpu", "--json"]) == 0  # every row is listed anyway
    with pytest.raises(est.EstimateError, match="needs stage 3"):
        est.estimate(est.shapes_from_factory(FACTORY),
                     est.Setup(world_size=2, offload_param="cpu"), 2)
    with pytest.raises(est.EstimateError, match="stage 1, 2 or 3"):
        est.option_for(0, "cpu")


def test_partial_offload_rounds_like_the_engine_and_the_constants_match(tmp_path, capsys):
    from zero.config.schema import ZERO_OPTIMIZATION

    assert ZERO_OPTIMIZATION.get("sub_group_size").default == est.DEFAULT_SUB_GROUP_SIZE
    config = _config(3, "bf16", {"offload_optimizer": "cpu", "ratio": 0.5}, str(tmp_path))
    setup, _ = est.setup_from_config(config, 2)
    assert setup.offload_ratio == 0.5
    # llround: half away from zero, per engine group
    assert [setup.offloaded_numel(n) for n in (7, 8, 14_448, 1)] == [4, 4, 7_224, 1]
    assert est.Setup(offload_ratio=0.3).offloaded_numel(14_448) == 4_334
    with pytest.raises(est.EstimateError, match="whole step on the host"):
        est.Setup(offload_ratio=0.5, delayed_update=True)
    # The chunk: min(sub_group_size, 4,194,304, the group's offloaded shard).
    setup = est.Setup(world_size=2, sub_group_size=10**9)
    assert setup.offload_chunk(10**8) == est.OFFLOAD_TILE and setup.offload_chunk(7) == 7
    assert est.Setup(sub_group_size=1000).offload_chunk(10**8) == 1000
    # The flag, and the split in the table: the head's state on the device, the tail's on NVMe.
    assert cli.main(["estimate", "--model", FACTORY, "--world-size", "2", "--stage", "2",
                     "--offload-optimizer", "nvme", "--offload-ratio", "0.25",
                     "--precision", "bf16"]) == 0
    text = capsys.readouterr().out
    assert "*stage 2 + offload optimizer (NVMe) " in text
    assert "0.25·(4Ψ/N) + 0.25·(8Ψ/N)" in text and "0.75·(4Ψ/N) + 0.75·(8Ψ/N)" in text


def test_parameters_on_nvme_follow_the_engines_rules_and_errors(tmp_path):
    from zero.config.schema import OFFLOAD_PARAM

    defaults = {key.name: key.default for key in OFFLOAD_PARAM.keys}
    assert (defaults["buffer_count"], defaults["buffer_size"], defaults["max_in_cpu"]) == (
        est.DEFAULT_PARAM_BUFFER_COUNT, est.DEFAULT_PARAM_BUFFER_SIZE,
        est.DEFAULT_PARAM_MAX_IN_CPU)
    config = _config(3, "bf16", {"offload_param": "nvme", "param_buffer_count": 3,
                                 "param_buffer_size": 7_000, "param_max_in_cpu": 2_000},
                     str(tmp_path))
    setup, _ = est.setup_from_config(config, 2)
    assert (setup.param_buffer_count, setup.param_buffer_size, setup.param_max_in_cpu) == \
        (3, 7_000, 2_000)
    # The first unit that does not fit under max_in_cpu goes to NVMe, and every one after it,
    # even one that would fit; per partitioned group.
    placement = est.param_placement(setup, [[("a", 1_500), ("b", 600), ("c", 400)],
                                            [("d", 2_500), ("e", 300)]])
    assert placement.host_numel == 1_500 and placement.nvme_numel == 3_800
    assert placement.nvme_units == 4 and placement.largest_shards == (600, 2_500)
    assert placement.buffer_bytes == 3 * 4096 + 3 * 8192  # per group, page-rounded 2-byte units
    assert placement.swap_file_bytes == 3 * 4096 + 8192  # every unit from a page boundary
    assert not placement.error
    too_big = est.param_placement(setup, [[("a", 1_500), ("b", 8_000)], [("c", 9_000)]])
    assert "gather unit 'b'" in too_big.error and "raise buffer_size to at least 9000" in \
        too_big.error
    # A unit above buffer_size: the engine refuses to build, the estimate raises the same key
    # (and the size every unit fits), the table lists the row as not running.
    shapes = est.shapes_from_factory(FACTORY)
    small = _config(3, "bf16", {"offload_optimizer": "cpu", "offload_param": "nvme",
                                "param_buffer_size": 5_000}, str(tmp_path))
    setup, stage = est.setup_from_config(small, 1)  # one rank: blocks of 12,416 elements
    with pytest.raises(est.EstimateError,
                       match=r"offload_param\.buffer_size = 5000\b.*at least 12416"):
        est.estimate(shapes, setup, stage)
    engine_message = run_distributed(_build_error, 1, args=(small,))[0]
    assert "offload_param.buffer_size = 5000" in engine_message
    assert "raise buffer_size to at least 12416" in engine_message
    rows = {e.name: e for e in est.estimate_all(shapes, setup)}
    refused = rows["stage 3 + offload optimizer (host) + params (NVMe)"]
    assert not refused.runs and "buffer_size = 5000" in refused.error
    assert rows["stage 3 + offload optimizer + params"].runs
    text = est.format_estimates(shapes, setup, list(rows.values()), 3)
    assert "params on NVMe do not run as configured: gather unit 'blocks.0'" in text
    with pytest.raises(est.EstimateError, match="at least 2 host buffers"):
        est.Setup(offload_param="nvme", param_buffer_count=1)
    assert list(tmp_path.iterdir()) == []


def _build_error(rank, world, config):
    import zero

    with pytest.raises(Exception) as info:
        zero.initialize(model=training.make_model(), config=config)
    return str(info.value)
