"""`deepspeed.checkpointing` under tensor parallelism, as Megatron-DeepSpeed uses it:
configure(mpu), model_parallel_cuda_manual_seed and get_cuda_rng_tracker (dropout inside a
tensor-parallel region draws differently on each tensor rank, outside alike), checkpoint()
recomputing a region with the tracker's states as its forward had them, and
partition_activations keeping each rank's 1/T of a region's inputs, gathered back for the
recomputation. 2 gloo ranks of one tensor group, against the same code without checkpointing."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distributed_harness import run_distributed
from test_mpu import ModelParallelUnit

SEED, WIDTH = 1234, 8


def _mpu(rank: int, world: int) -> ModelParallelUnit:
    tensor = dist.new_group(list(range(world)))
    data = [dist.new_group([r]) for r in range(world)][rank]
    return ModelParallelUnit(tensor, data, world, 1, rank, 0)


def _region(layer):
    from zero.compat.deepspeed import checkpointing

    def run(x):
        h = layer(x)
        with checkpointing.get_cuda_rng_tracker().fork():  # a tensor-parallel region's dropout
            h = F.dropout(h, 0.5, training=True)
        return F.dropout(torch.tanh(h), 0.3, training=True)  # outside: alike on every rank
    return run


def _run(checkpointed: bool):
    """Seeds as Megatron does, a layer and an input alike on every rank, one region forward
    and backward: (output, input grad, weight grad, the tracker's state after backward)."""
    from zero.compat.deepspeed import checkpointing

    checkpointing.model_parallel_cuda_manual_seed(SEED)
    layer = nn.Linear(WIDTH, WIDTH)
    x = torch.randn(6, WIDTH, requires_grad=True)
    region = _region(layer)
    out = checkpointing.checkpoint(region, x) if checkpointed else region(x)
    out.sum().backward()
    after = checkpointing.get_cuda_rng_tracker().get_states()["model-parallel-rng"]
    return out.detach(), x.grad, layer.weight.grad, after


def _megatron(rank, world, partition):
    from zero.compat.deepspeed import checkpointing

    checkpointing.configure(_mpu(rank, world), partition_activations=partition)
    plain, recomputed = _run(False), _run(True)
    for a, b in zip(plain, recomputed):
        assert torch.equal(a, b)
    # default dropout alike on the tensor ranks, tensor-parallel dropout not
    outside = torch.tensor([float(torch.equal(*_gathered(F.dropout(torch.ones(64), 0.5))))])
    return plain[0], outside.item()


def _gathered(tensor):
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return parts


@pytest.mark.parametrize("partition", [False, True])
def test_a_checkpointed_region_recomputes_the_tensor_parallel_dropout(partition):
    outs = run_distributed(_megatron, 2, args=(partition,), timeout=60)
    assert not torch.equal(outs[0][0], outs[1][0])  # each tensor rank its own mask
    assert all(alike == 1.0 for _, alike in outs)


def _seeds(rank, world):
    from zero.compat.deepspeed import checkpointing
    from zero.rng_tracker import manual_seed

    checkpointing.configure(_mpu(rank, world))
    checkpointing.model_parallel_cuda_manual_seed(SEED)
    default = torch.rand(4)
    with checkpointing.get_cuda_rng_tracker().fork():
        tracked = torch.rand(4)
    manual_seed(SEED)  # DeepSpeed's numbers: the default state seeded with the seed itself
    expected_default = torch.rand(4)
    manual_seed(SEED + 2718 + rank)  # and the tracked one with seed + 2718 + tensor rank
    expected_tracked = torch.rand(4)
    return torch.equal(default, expected_default), torch.equal(tracked, expected_tracked)


def test_model_parallel_seeds_are_deepspeeds():
    for default, tracked in run_distributed(_seeds, 2, timeout=60):
        assert default and tracked


def _partitioned(rank, world):
    from zero import activation_checkpointing as checkpointing
    from zero.saved_activations import SavedActivations

    checkpointing.configure(_mpu(rank, world), partition_activations=True)
    hooks = checkpointing.saved_inputs_hooks(checkpointing.settings())
    whole = torch.arange(24.0).view(4, 6)
    kept = hooks.pack_hook(whole)
    odd = torch.arange(5.0)  # 2 does not divide it: kept whole
    # the memory report's activation count sees the share a region keeps
    layer = nn.Linear(4, 6)
    watch = SavedActivations(layer)
    with watch.counting():
        checkpointing.checkpoint(layer, torch.randn(8, 4, requires_grad=True))
    return (kept[0].numel(), torch.equal(hooks.unpack_hook(kept), whole),
            hooks.pack_hook(odd)[0] is odd, watch.bytes)


def test_partition_activations_keeps_each_tensor_ranks_share_of_the_inputs():
    for kept, back, odd_whole, counted in run_distributed(_partitioned, 2, timeout=60):
        assert kept == 12 and back and odd_whole
        assert counted == 16 * 4  # half of the region's 8 x 4 fp32 input


def test_the_tracker_forks_and_refuses_a_seed_twice():
    from zero.rng_tracker import RngStatesTracker

    tracker = RngStatesTracker()
    torch.manual_seed(0)
    tracker.add("tp", 7)
    outside = torch.get_rng_state()
    with tracker.fork("tp"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)  # the generator is back
    with tracker.fork("tp"):
        second = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(torch.cat([first, second]), torch.rand(6))  # the state went on
    with pytest.raises(ValueError, match="seed 7 is already tracked"):
        tracker.add("other", 7)
    with pytest.raises(KeyError, match="'dp' is not tracked"):
        with tracker.fork("dp"):
            pass
