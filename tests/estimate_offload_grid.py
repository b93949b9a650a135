"""The offload estimate's exactness check, shared by the CPU test (test_estimate_offload.py)
and the GPU's (test_cuda_estimate.py): the grids of offload configurations, one engine per
entry measured on each rank, and the comparison of its memory report with `zero-mem
estimate`'s row for the same config, for a model on the device the engine ran on (on the CPU
the offloaded step updates the model in place and stages nothing; on a GPU every chunk's
gradients and new parameters pass through host staging)."""
import dataclasses
import os

import training
from estimate_offload_config import GAS, _close, _config
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


def measure(rank, world, grid, nvme_path, factory=None, steps=2):
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
        report["device_type"] = engine.device.type
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


def estimate_for(shapes, world, stage, precision, overrides, cpu_only, nvme_path="/nvme"):
    """`zero-mem estimate`'s setup and row for one grid entry; cpu_only: the model on the CPU
    (its offloaded step updates the model in place)."""
    setup, selected = est.setup_from_config(_config(stage, precision, overrides, nvme_path), world,
                                            cpu_only=cpu_only)
    assert selected == stage
    return setup, est.estimate(shapes, setup, stage)  # the config's offload row


def check(shapes, world, grid, results):
    assert len(results) == world
    for rank_result in results:
        assert len(rank_result) == len(grid)
        for (label, stage, precision, overrides), report in zip(grid, rank_result):
            label = f"{label} N={world} on {report['device_type']}"
            setup, estimate = estimate_for(shapes, world, stage, precision, overrides,
                                           cpu_only=report["device_type"] == "cpu")
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
