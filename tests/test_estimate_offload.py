"""zero-mem with offload: the estimate of every model-state category equals the engine's
measured bytes exactly at each location (device, host, NVMe; world sizes 1/2/4; optimizer on
the host or NVMe at stages 1-3, parameters on the host or NVMe at stage 3), the host staging
exactly, the device staging, buckets and gathered working set within 5% (they come out
exact), the NVMe swap files byte for byte; and parameters on NVMe follow the engine's
max_in_cpu rule and buffer_size error. The tuner's offload: test_estimate_offload_tuner.py."""
import json

import pytest

import training
from distributed_harness import run_distributed
from estimate_offload_config import FACTORY, _config
from estimate_offload_grid import GRID, NVME_PARAMS_GRID, check, estimate_for, measure
from zero.reports import cli
from zero.reports import estimate as est


@pytest.mark.parametrize("world", [1, 2, 4])
def test_offload_estimate_equals_the_engines_measured_bytes(world, tmp_path):
    shapes = est.shapes_from_factory(FACTORY)  # built on meta, as `zero-mem estimate` does
    results = run_distributed(measure, world, args=(GRID, str(tmp_path)), timeout=120)
    check(shapes, world, GRID, results)
    assert list(tmp_path.iterdir()) == []  # the swap files went with the engines


@pytest.mark.parametrize("world", [1, 2, 4])
def test_parameters_on_nvme_estimate_equals_the_engines_measured_bytes(world, tmp_path):
    shapes = est.shapes_from_factory(FACTORY)
    results = run_distributed(measure, world, args=(NVME_PARAMS_GRID, str(tmp_path)),
                              timeout=120)
    check(shapes, world, NVME_PARAMS_GRID, results)
    # what the grid means to cover, on the estimate's side: a host / NVMe split, everything
    # kept in host memory, buffers of 3 and of 2
    for label, stage, precision, overrides in NVME_PARAMS_GRID:
        _, estimate = estimate_for(shapes, world, stage, precision, overrides, cpu_only=True)
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


def test_a_delayed_update_on_a_device_stages_the_shard_instead_of_chunks():
    """A device model's streamed step stages two chunks of gradients and new parameters; the
    delayed update stages the whole shard's through its own buffers and no chunks (the engine
    builds no chunk staging beside it). On the CPU both update in place: only the delayed
    update's shard. (The GPU test, test_cuda_estimate.py, holds this against the engine.)"""
    shapes = est.shapes_from_factory(FACTORY)
    streamed = {"offload_optimizer": "cpu", "sub_group_size": 1000}
    delayed = {**streamed, "delayed_update": True}
    staging = {}
    for name, overrides in (("streamed", streamed), ("delayed", delayed)):
        for cpu_only in (False, True):
            _, row = estimate_for(shapes, 2, 2, "bf16", overrides, cpu_only=cpu_only)
            staging[name, cpu_only] = row.categories["staging"]["by_location"].get("host", 0)
            groups = row.offload["groups"]
    shard = sum(group["offloaded_numel"] for group in groups)
    chunks = sum(group["chunk_numel"] for group in groups)
    assert chunks < shard
    assert staging["streamed", False] == 2 * chunks * (2 + 2)
    assert staging["delayed", False] == staging["delayed", True] == shard * (2 + 2)
    assert staging["streamed", True] == 0


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
