"""Flat-buffer collectives issued from C++ through the c10d ProcessGroup, on several ranks,
checked against values computed locally (the single-process reference)."""
import pytest
import torch
import torch.distributed as dist

from distributed_harness import run_distributed
from zero.boundary import as_dict

# Sizes chosen to cover: not divisible by any world size, a parameter split across every
# shard, a scalar, an empty parameter, and padding at the end.
SHAPES = [[7, 3], [1], [], [0], [13], [5, 5]]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _make_params(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]


def _communicator():
    from zero import _C
    return _C.Communicator(dist.group.WORLD.group_name)


def _shard_then_all_gather(rank, world_size, dtype_name, alignment):
    from zero import _C
    dtype = DTYPES[dtype_name]
    params = _make_params(dtype)
    plan = _C.plan_flat_buffer(SHAPES, dtype_name, world_size, alignment)
    registry = _C.MemoryRegistry()
    shard = _C.TrackedTensor(registry, "fp32_master", "device", plan.shard_numel, dtype,
                             torch.device("cpu"))
    _C.pack_shard(plan, rank, params, shard.tensor)
    full = _C.FlatBuffer(plan, registry, "gathered_param", "device", torch.device("cpu"))
    _communicator().all_gather(full.data, shard.tensor)
    views = full.param_views()
    identical = [torch.equal(view, param) and view.dtype == param.dtype
                 for view, param in zip(views, params)]
    padding = full.data[plan.used_numel:] if alignment == 1 else None
    padding_is_zero = padding is None or bool((padding == 0).all())
    return identical, padding_is_zero, registry.total().current, plan.bytes + shard.bytes


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("alignment", [1, 4])
def test_all_gather_of_shards_reproduces_parameters_bit_for_bit(world_size, dtype_name,
                                                                 alignment):
    for identical, padding_is_zero, counted, expected in run_distributed(
            _shard_then_all_gather, world_size, args=(dtype_name, alignment)):
        assert all(identical)
        assert padding_is_zero
        assert counted == expected


def _rank_gradients(rank, dtype):
    # Small integers: every partial sum is exact in bf16, so "exact" can be asserted.
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(-8, 9, shape, generator=generator).to(dtype) for shape in SHAPES]


def _reduce_scatter_gradients(rank, world_size, dtype_name, op):
    from zero import _C
    dtype = DTYPES[dtype_name]
    plan = _C.plan_flat_buffer(SHAPES, dtype_name, world_size, 1)
    registry = _C.MemoryRegistry()
    full = _C.FlatBuffer(plan, registry, "bucket", "device", torch.device("cpu"))
    full.pack(_rank_gradients(rank, dtype))
    shard = torch.full((plan.shard_numel,), float("nan"), dtype=dtype)
    _communicator().reduce_scatter(shard, full.data, op=op)

    # Reference: the sum over every rank's gradients, computed in one process.
    summed = [sum(parts) for parts in zip(*(_rank_gradients(r, torch.float32)
                                            for r in range(world_size)))]
    if op == "avg":
        summed = [s / world_size for s in summed]
    expected = torch.zeros(plan.shard_numel, dtype=dtype)
    _C.pack_shard(plan, rank, [s.to(dtype) for s in summed], expected)
    return torch.equal(shard, expected), shard.dtype == dtype


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_reduce_scatter_gives_each_rank_exactly_its_shard_of_the_sum(world_size, dtype_name):
    for exact, dtype_kept in run_distributed(_reduce_scatter_gradients, world_size,
                                              args=(dtype_name, "sum")):
        assert exact
        assert dtype_kept


def test_reduce_scatter_average_divides_by_the_world_size():
    for exact, _ in run_distributed(_reduce_scatter_gradients, 4, args=("float32", "avg")):
        assert exact


def _all_reduce_and_broadcast(rank, world_size):
    communicator = _communicator()
    summed = torch.arange(5, dtype=torch.float32) * (rank + 1)
    communicator.all_reduce(summed)
    biggest = torch.tensor([float(rank)])
    communicator.all_reduce(biggest, op="max")
    sent = torch.full((3,), float(rank))
    communicator.broadcast(sent, root=world_size - 1)
    pending = communicator.all_reduce(torch.ones(2), async_op=True)
    pending.wait()
    return summed.tolist(), biggest.item(), sent.tolist(), pending.completed, as_dict(communicator.stats())


def test_all_reduce_max_broadcast_and_async_handles():
    world_size = 3
    for summed, biggest, sent, completed, stats in run_distributed(
            _all_reduce_and_broadcast, world_size):
        assert summed == [float(i * 6) for i in range(5)]
        assert biggest == 2.0
        assert sent == [2.0] * 3
        assert completed
        assert stats["all_reduce_bytes"] == 2 * (5 * 4 + 4 + 2 * 4)
        assert stats["broadcast_bytes"] == 12
        assert stats["calls"] == 4


def _communication_volume(rank, world_size):
    from zero import _C
    plan = _C.plan_flat_buffer([[10]], "float32", world_size, 1)
    registry = _C.MemoryRegistry()
    full = _C.FlatBuffer(plan, registry, "bucket", "device", torch.device("cpu"))
    shard = torch.zeros(plan.shard_numel)
    communicator = _communicator()
    communicator.all_gather(full.data, shard)
    communicator.reduce_scatter(shard, full.data)
    return as_dict(communicator.stats()), plan.bytes


def test_bytes_are_counted_as_zero_paper_volume():
    for stats, buffer_bytes in run_distributed(_communication_volume, 2):
        assert stats["all_gather_bytes"] == buffer_bytes
        assert stats["reduce_scatter_bytes"] == buffer_bytes
        assert stats["total_bytes"] == 2 * buffer_bytes


def _mismatched_sizes(rank, world_size):
    communicator = _communicator()
    messages = []
    for call in (lambda: communicator.all_gather(torch.zeros(7), torch.zeros(3)),
                 lambda: communicator.reduce_scatter(torch.zeros(3), torch.zeros(5)),
                 lambda: communicator.all_gather(torch.zeros(6), torch.zeros(3, dtype=torch.bfloat16)),
                 lambda: communicator.all_gather(torch.zeros(6, 2).t(), torch.zeros(6))):
        try:
            call()
            messages.append(None)
        except RuntimeError as error:
            messages.append(str(error))
    return messages


def test_mismatched_buffers_raise_naming_both_sizes_before_any_communication():
    gather, scatter, dtypes, layout = run_distributed(_mismatched_sizes, 2)[0]
    assert "full buffer has 7 elements but shard has 3 and world size is 2" in gather
    assert "must have exactly 6" in gather
    assert "full buffer has 5 elements but shard has 3" in scatter
    assert "full buffer is Float but shard is BFloat16" in dtypes
    assert "must be contiguous" in layout


def test_unknown_group_name_says_how_to_fix_it():
    from zero import _C
    with pytest.raises(RuntimeError, match="no process group named 'missing' is registered"):
        _C.Communicator("missing")


def _drop_communicators_that_own_their_group(rank, world_size, rounds):
    from zero import _C
    for _ in range(rounds):
        group = dist.new_group(list(range(world_size)))
        communicator = _C.Communicator(group.group_name)
        tensor, other = torch.ones(1 << 16), torch.ones(1 << 16)
        communicator.all_reduce(tensor)
        pending = communicator.all_reduce(other, async_op=True)  # dropped without wait()
        dist.all_reduce(tensor, group=group)  # its work item may outlive the call in a worker
        dist.destroy_process_group(group)  # the communicator now owns the group alone
        del tensor, other  # a worker still holding one must take the GIL to drop it
        del pending, communicator  # ~ProcessGroupGloo joins the workers: not under the GIL
    return rounds


def test_a_communicator_that_owns_the_last_group_reference_is_dropped_without_deadlock():
    # A gloo worker drops a finished work item's tensors after waking the caller; dropping
    # one whose Python object is gone takes the GIL, and the group's destructor joins that
    # worker. Dropping a Communicator (or an EngineCore, or a handle) under the GIL could
    # deadlock: seen in gdb on 4 ranks, about one run in three of a collectives benchmark.
    # The race is narrow, so this passing does not prove its absence; it does run every
    # deleter that now releases the GIL, the handle's included.
    assert run_distributed(_drop_communicators_that_own_their_group, 2, args=(20,),
                           timeout=60) == [20] * 2


def _wait_on_a_collective_one_rank_skips(rank, world_size):
    import datetime

    from zero import _C
    group = dist.new_group(list(range(world_size)), timeout=datetime.timedelta(seconds=2))
    errors = []
    if rank == 0:  # rank 1 never joins: gloo gives up after the group's 2 s
        pending = _C.Communicator(group.group_name).all_reduce(torch.ones(4), async_op=True)
        for _ in range(2):
            try:
                pending.wait()
            except RuntimeError as error:
                errors.append(str(error))
        errors.append(pending.completed)
    dist.barrier()  # (the default group, whose timeout is the harness's)
    return errors


def test_a_failed_collective_fails_again_at_every_later_wait():
    """A second wait on a handle whose collective failed must not pass for success: a ZeRO-3
    unit gathered by it would be used with its buffer never written."""
    first, second, completed = run_distributed(_wait_on_a_collective_one_rank_skips, 2,
                                               timeout=60)[0]
    assert "all_reduce" in first and "failed" in first
    assert second == first
    assert completed is False
