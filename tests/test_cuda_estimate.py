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
import pytest
import torch

from distributed_harness import run_distributed
from estimate_offload_config import FACTORY
from estimate_offload_grid import GRID, NVME_PARAMS_GRID, check, measure
from zero.reports import estimate as est

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
