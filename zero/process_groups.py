"""Process-group layouts from the config, beyond the one world group: ZeRO++ hpZ's secondary
groups and MiCS's shard and replicate groups, for stage 3. Every rank builds them in the same
order (torch.distributed.new_group is collective); the C++ groups find them by name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

HPZ_KEY = "zero_optimization.zero_hpz_partition_size"
MICS_KEY = "zero_optimization.mics_shard_size"


@dataclass(frozen=True)
class Stage3Groups:
    """The registered names of this rank's groups ('' = none)."""
    hpz: str = ""              # hpZ: the few ranks of a node that share secondary copies
    mics_shard: str = ""       # MiCS: the ranks that partition the parameters among themselves
    mics_replicate: str = ""   # MiCS: the ranks that hold the same shard


def stage3_groups(zero_cfg) -> Stage3Groups:
    """This rank's groups for the validated zero_optimization block (off: all '')."""
    shard, replicate = _mics_groups(zero_cfg.mics_shard_size)
    return Stage3Groups(hpz=_hpz_group(zero_cfg.zero_hpz_partition_size),
                        mics_shard=shard, mics_replicate=replicate)


def _hpz_group(partition_size: int) -> str:
    """The `partition_size` consecutive ranks this rank belongs to, which must lie within one
    node (LOCAL_WORLD_SIZE, as the launcher exports it). Off for a size of 1, or of the whole
    world (then the secondary group is the world group and would gather the same bytes again)."""
    world = dist.get_world_size()
    if partition_size <= 1 or partition_size >= world:
        return ""  # (that the size divides the world, the config checked: zero.config)
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit() and int(local) % partition_size:
        raise ValueError(f"zero: {HPZ_KEY} = {partition_size} does not divide the ranks per node "
                         f"(LOCAL_WORLD_SIZE = {local}): a secondary group must lie within one "
                         f"node; use a divisor of {local}")
    return _new_groups([list(range(start, start + partition_size))
                        for start in range(0, world, partition_size)])


def _mics_groups(shard_size: int) -> tuple[str, str]:
    """(shard group, replicate group): shard groups of `shard_size` consecutive ranks (a node,
    or a few), replicate groups of the ranks at the same place in every shard group. Off for
    a size <= 0 (DeepSpeed's -1) or of the whole world (plain stage 3)."""
    world = dist.get_world_size()
    if shard_size <= 0 or shard_size >= world:
        return "", ""  # (that the size divides the world, the config checked: zero.config)
    shard = _new_groups([list(range(start, start + shard_size))
                         for start in range(0, world, shard_size)])
    replicate = _new_groups([list(range(offset, world, shard_size))
                             for offset in range(shard_size)])
    return shard, replicate


def _new_groups(partition: list[list[int]]) -> str:
    """Creates every group of `partition` (on every rank, in order); the name of this rank's."""
    rank, mine = dist.get_rank(), None
    for ranks in partition:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine.group_name
