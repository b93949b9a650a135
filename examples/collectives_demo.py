"""Foundation demo: shard a model's parameters with the C++ planner, all-gather them back and
reduce-scatter gradients through the C++ collectives, then print the per-rank memory report.

Run: python -m torch.distributed.run --nproc_per_node 2 examples/collectives_demo.py
"""
import torch
import torch.distributed as dist

import zero  # noqa: F401
from zero import _C


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.GELU(), torch.nn.Linear(257, 10))
    params = [p.detach() for p in model.parameters()]

    plan = _C.plan_flat_buffer([list(p.shape) for p in params], "float32", world, 16)
    registry = _C.MemoryRegistry()
    communicator = _C.Communicator(dist.group.WORLD.group_name)
    device = torch.device("cpu")

    shard = _C.TrackedTensor(registry, "fp32_master", "device", plan.shard_numel, torch.float32, device)
    _C.pack_shard(plan, rank, params, shard.tensor)
    gathered = _C.FlatBuffer(plan, registry, "gathered_param", "device", device)
    communicator.all_gather(gathered.data, shard.tensor)
    assert all(torch.equal(a, b) for a, b in zip(gathered.param_views(), params))

    grads = _C.FlatBuffer(plan, registry, "bucket", "device", device)
    grads.data.fill_(rank + 1.0)
    grad_shard = _C.TrackedTensor(registry, "gradient", "device", plan.shard_numel, torch.float32, device)
    communicator.reduce_scatter(grad_shard.tensor, grads.data)
    assert torch.all(grad_shard.tensor == world * (world + 1) / 2)

    dist.barrier()
    for r in range(world):
        if r == rank:
            print(f"[rank {rank}] {plan.used_numel} parameters in {plan.numel} padded elements; "
                  f"shard {plan.shard_range(rank)}; sent {communicator.stats()['total_bytes']} bytes")
            for row in registry.records():
                print(f"[rank {rank}]   {row['category']:>15} {row['location']:>8}: "
                      f"current {row['current']:>8} B  peak {row['peak']:>8} B")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
