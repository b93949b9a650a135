"""zero's collectives on CUDA tensors: through NCCL on one rank, and through gloo for two
ranks sharing the one GPU (NCCL refuses two ranks on one device). Checked bit for bit against
the sums computed in one process. Skipped where torch sees no GPU (scripts/gpu_check.sh runs
them on one)."""
import pytest
import torch
import torch.distributed as dist

from distributed_harness import run_distributed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPES = [[7, 3], [1], [], [0], [13], [1024, 33]]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ONE_GPU = {"LOCAL_RANK": "0"}  # every rank on cuda:0


def _rank_values(rank, dtype):
    # Small integers: every partial sum is exact in bf16, so equality can be asserted.
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(-8, 9, shape, generator=generator).to(dtype) for shape in SHAPES]


def _gather_and_reduce_scatter(rank, world_size, dtype_name):
    from zero import _C
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda", 0)
    communicator = _C.Communicator(dist.group.WORLD.group_name)
    plan = _C.plan_flat_buffer(SHAPES, dtype_name, world_size, 1)
    registry = _C.MemoryRegistry()

    # all_gather of the shards reproduces rank 0's values everywhere.
    values = _rank_values(0, dtype)
    shard = torch.empty(plan.shard_numel, dtype=dtype)
    _C.pack_shard(plan, rank, values, shard)
    full = _C.FlatBuffer(plan, registry, "gathered_param", "device", device)
    communicator.all_gather(full.data, shard.to(device))
    gathered = all(torch.equal(view.cpu(), value) for view, value in zip(full.param_views(), values))

    # reduce_scatter of every rank's values gives this rank its shard of the sum.
    bucket = _C.FlatBuffer(plan, registry, "bucket", "device", device)
    bucket.pack([v.to(device) for v in _rank_values(rank, dtype)])
    mine = torch.full((plan.shard_numel,), float("nan"), dtype=dtype, device=device)
    communicator.reduce_scatter(mine, bucket.data)
    summed = [sum(parts) for parts in zip(*(_rank_values(r, torch.float32)
                                            for r in range(world_size)))]
    expected = torch.zeros(plan.shard_numel, dtype=dtype)
    _C.pack_shard(plan, rank, [s.to(dtype) for s in summed], expected)
    torch.cuda.synchronize()
    return gathered, torch.equal(mine.cpu(), expected), full.data.is_cuda and mine.is_cuda


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_nccl_on_one_rank(dtype_name):
    [(gathered, reduced, on_gpu)] = run_distributed(
        _gather_and_reduce_scatter, 1, args=(dtype_name,), backend="nccl", timeout=120)
    assert gathered and reduced and on_gpu


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_gloo_on_cuda_tensors_two_ranks_one_gpu(dtype_name):
    for gathered, reduced, on_gpu in run_distributed(
            _gather_and_reduce_scatter, 2, args=(dtype_name,), env=ONE_GPU, timeout=120):
        assert gathered and reduced and on_gpu
