"""zero-mem's offload estimate against the engine on a GPU, where the CPU tests cannot look: a
model on the device stages every offloaded chunk's gradients and new parameters in host
memory (2 slots x C·(g+b)), keeps the gradient shard on the device with grads_on_device, and
gathers stage 3's host parameters through device staging. Every offload grid entry of
test_estimate_offload.py (optimizer on the host or NVMe at stages 1-3, parameters on the host
or NVMe, partial offload, the delayed update, 16-bit masters and states, fp32 gradient
accumulation), one engine each, checked by the same comparison: model states exactly at each
location, host staging and the host peak exactly, NVMe and swap files byte for byte, device
buckets, staging and gathered working set as on the CPU.

World 1 runs on NCCL; world 2 puts both ranks on the one GPU over gloo. Skipped where torch
sees no GPU (scripts/gpu_check.sh runs them on one)."""
import json

import pytest
import torch

from distributed_harness import run_distributed
from estimate_offload_config import DEEP_FACTORY, FACTORY, _config, train_tuned
from estimate_offload_grid import GRID, NVME_PARAMS_GRID, check, measure
from zero.reports import estimate as est
from zero.reports import tuner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ONE_GPU = {"LOCAL_RANK": "0"}


def _measured(world, grid, tmp_path):
    kwargs = dict(args=(grid, str(tmp_path)), timeout=300)
    if world == 1:
        return run_distributed(measure, 1, backend="nccl", **kwargs)
    return run_distributed(measure, world, env=ONE_GPU, **kwargs)


@pytest.mark.parametrize("grid", ["offload", "params-nvme"])
@pytest.mark.parametrize("world", [1, 2])
def test_the_offload_estimate_equals_the_engine_on_the_gpu(world, grid, tmp_path):
    entries = GRID if grid == "offload" else NVME_PARAMS_GRID
    results = _measured(world, entries, tmp_path)
    assert {report["device_type"] for rank in results for report in rank} == {"cuda"}
    check(est.shapes_from_factory(FACTORY), world, entries, results)
    assert list(tmp_path.iterdir()) == []  # the swap files went with the engines


def test_the_tuners_partial_offload_trains_within_its_gpu_budget(tmp_path):
    """zero-mem tune's partial-offload tier priced for a GPU (the head's state on the device,
    two chunks of the tail staged in pinned memory): at a budget between the whole optimizer
    on the host and no offload, the written config (stage 1, the least ratio) trains on the
    GPU with the device peak the estimate's, exactly, within the budget."""
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    base = _config(3, "bf16", {}, None)  # two micro-steps
    setup, _ = est.setup_from_config(base, 1)
    no_offload = tuner.tune(shapes, setup, 1, offload=False)
    smallest = min(c.total for c in no_offload.tried if c.estimate.runs)
    whole = est.estimate(shapes, setup, est.option_for(1, "cpu")).device_bytes
    budget = (whole + smallest) // 2
    rec = tuner.tune(shapes, setup, budget)
    chosen = rec.chosen
    assert chosen.option == est.option_for(1, "cpu") and 0 < chosen.offload_ratio < 1
    config, _ = tuner.recommended_config(rec, setup, base)
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(config))
    [report] = run_distributed(train_tuned, 1, args=(str(path),), backend="nccl", timeout=300)
    assert report["device_type"] == "cuda"
    assert report["by_location"]["device"]["peak"] == chosen.total <= budget
    staging = report["categories"]["staging"]["by_location"]
    assert staging["host_pinned"]["current"] == \
        chosen.estimate.categories["staging"]["by_location"]["host"]
