"""DeepSpeed's model-states memory estimate functions (the snippet in Hugging Face's DeepSpeed
guide) under zero: DeepSpeed 0.19.8's table as it prints it (tests/deepspeed_estimates/), each
row holding zero's estimate of that option (zero/reports/estimate/deepspeed_table.py)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from deepspeed_reference import fixture
from distributed_harness import run_distributed, subprocess_env

pytestmark = pytest.mark.timeout(120)
ROW = re.compile(r" +(\d+\.\d\d)GB \| +(\d+\.\d\d)GB \| (.*)")


def _ours():
    from zero.compat.deepspeed.runtime.zero import stage3, stage_1_and_2

    return {"stage3": stage3, "stage2": stage_1_and_2}


@pytest.mark.parametrize("index", range(4))
def test_the_table_is_deepspeeds_with_zeros_bytes(index):
    from zero.reports.estimate import Setup, estimate, option_for, shapes_from_module
    from zero.reports.estimate.deepspeed_table import cold_shapes

    cases, expected = fixture("estimates")
    case = cases.CASES[index]
    theirs = expected["printed"][case[1] + repr(case[2:])]
    ours = cases.printed(_ours(), case)
    rows = [ROW.fullmatch(line) for line in ours]
    # the heading, the column names and every row's options as DeepSpeed prints them
    assert [line for line, row in zip(ours, rows) if not row][:4] == theirs[:4]
    assert [row.group(3) for row in rows if row] == [ROW.fullmatch(t).group(3) for t in theirs[4:]]
    assert ours[-1].startswith("(zero's estimate")
    # each row is zero's estimate of its option, per GPU = the device bytes per rank
    module, _, args, kwargs = case
    gpus, nodes = kwargs["num_gpus_per_node"], kwargs["num_nodes"]
    shapes = shapes_from_module(cases.model()) if args[0] == "model" else \
        cold_shapes(*args[:2]) if module == "stage3" else cold_shapes(args[0])
    setup = Setup(world_size=gpus * nodes, num_nodes=nodes, precision="bf16")
    for row in (r for r in rows if r):
        optimizer = "cpu" if "offload_optimizer=none" not in row.group(3) else "none"
        param = "cpu" if "offload_param=OffloadDeviceEnum.cpu" in row.group(3) else "none"
        option = option_for(3 if module == "stage3" else 2, optimizer, param)
        assert float(row.group(2)) == pytest.approx(
            estimate(shapes, setup, option).device_bytes / 2**30, abs=0.006), row.group(0)


def test_without_zero_init_the_host_holds_each_ranks_fp32_model():
    """zero_init=0 (and stage 2): at least 4 bytes per parameter per rank of the node, before
    the engine shards it; offloading moves bytes from the device to the host."""
    from zero.compat.deepspeed.runtime.zero import stage3, stage_1_and_2

    total, largest, gpus = 1_000_000_000, 20_000_000, 8
    fp32_models = 4 * total * gpus * 1.5
    rows = {(o, p, z): stage3.estimate_zero3_model_states_mem_needs(
        total, largest, gpus, 1, cpu_offload=o, cpu_offload_params=p, zero_init=z)
        for o, p, z in [(True, True, True), (True, True, False), (False, False, True),
                        (False, False, False)]}
    assert rows[True, True, False][0] >= fp32_models > rows[True, True, True][0]
    assert rows[False, False, False][0] >= fp32_models
    assert rows[True, True, True][1] < rows[False, False, True][1]  # offloaded: less device
    assert rows[True, True, True][2] == 4 * largest
    # with zero.Init and nothing offloaded: a layer at a time in fp32 per rank, no less
    assert rows[False, False, True][0] == int(4 * largest * gpus * 1.5)
    offloaded, kept = (stage_1_and_2.estimate_zero2_model_states_mem_needs(
        total, gpus, 1, cpu_offload=o) for o in (True, False))
    assert offloaded[1] < kept[1] and min(offloaded[0], kept[0]) >= fp32_models


def _partitioned_counts(rank, world):
    import zero
    from zero.reports.estimate.deepspeed_table import model_to_params

    with zero.Init():
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    return model_to_params(model)


def test_a_model_partitioned_by_zero_init_is_counted_by_its_whole_sizes():
    for counts in run_distributed(_partitioned_counts, 2):
        assert counts == (64 * 32 + 32 + 32 * 8 + 8, 64 * 32 + 32)


def test_hugging_faces_snippet_runs_under_the_deepspeed_alias():
    """`from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live`
    with zero standing in for DeepSpeed."""
    from zero.compat.deepspeed_alias import ALIAS_PATH

    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([ALIAS_PATH, os.path.dirname(os.path.abspath(__file__)),
                                         env.get("PYTHONPATH", "")])
    snippet = ("from deepspeed.runtime.zero.stage3 import "
               "estimate_zero3_model_states_mem_needs_all_live\n"
               "from deepspeed_reference import cases_of\n"
               "estimate_zero3_model_states_mem_needs_all_live(cases_of('estimates').model(), "
               "num_gpus_per_node=2, num_nodes=1)\n")
    done = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "SW: Model with 124M total params, 38M largest layer params." in done.stdout
    assert len([line for line in done.stdout.splitlines() if ROW.fullmatch(line)]) == 6
