"""Process-group layouts from the config, beyond the one world group: ZeRO++ hpZ's secondary
groups. Every rank calls these in the same order (torch.distributed.new_group is collective).
"""
from __future__ import annotations

import os

import torch.distributed as dist

HPZ_KEY = "zero_optimization.zero_hpz_partition_size"


def hpz_group_name(partition_size: int) -> str:
    """The registered name of this rank's hpZ secondary group: the `partition_size`
    consecutive ranks it belongs to, which must lie within one node (LOCAL_WORLD_SIZE, as the
    launcher exports it). '' when hpZ is off: a size of 1, or of the whole world (then the
    secondary group is the world group and would gather the same bytes again)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if partition_size <= 1 or partition_size >= world:
        return ""
    if world % partition_size:
        raise ValueError(f"zero: {HPZ_KEY} = {partition_size} does not divide the world size "
                         f"{world}; use a divisor of it, such as the ranks per node")
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit() and int(local) % partition_size:
        raise ValueError(f"zero: {HPZ_KEY} = {partition_size} does not divide the ranks per node "
                         f"(LOCAL_WORLD_SIZE = {local}): a secondary group must lie within one "
                         f"node; use a divisor of {local}")
    mine = None
    for start in range(0, world, partition_size):
        group = dist.new_group(list(range(start, start + partition_size)))
        if start <= rank < start + partition_size:
            mine = group
    return mine.group_name
