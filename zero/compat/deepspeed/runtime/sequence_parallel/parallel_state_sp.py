"""`deepspeed.runtime.sequence_parallel.parallel_state_sp`: DeepSpeed's module-level sequence
groups, the mpu Ulysses for Hugging Face hands to `initialize(mpu=...)`. The groups are
zero's (zero/parallel/sequence.py: consecutive ranks, the same layout as DeepSpeed's)."""
from __future__ import annotations

import torch.distributed as dist

from zero.parallel import sequence


def initialize_sequence_parallel(sequence_parallel_size: int) -> None:
    """Creates the sequence groups of `sequence_parallel_size` consecutive ranks (collective;
    DeepSpeed's checks and errors)."""
    if not dist.is_initialized():
        raise RuntimeError("zero: initialize_sequence_parallel needs torch.distributed "
                           "initialised first (deepspeed.init_distributed())")
    world = dist.get_world_size()
    if world < sequence_parallel_size:
        raise RuntimeError(f"world_size ({world}) is less than sequence_parallel_size "
                           f"{sequence_parallel_size}")
    if sequence_parallel_size <= 1:
        raise ValueError(f"sequence_parallel_size must be greater than 1, got "
                         f"{sequence_parallel_size}")
    if world % sequence_parallel_size:
        raise RuntimeError(f"world_size ({world}) is not divisible by sequence_parallel_size "
                           f"{sequence_parallel_size})")
    if sequence.ActiveGroups.get() is not None:
        raise RuntimeError("zero: the sequence parallel groups are already initialized")
    sequence.ActiveGroups.set(sequence.build(sequence_parallel_size))


def _layout() -> sequence.SequenceParallel:
    layout = sequence.ActiveGroups.get()
    if layout is None:
        raise RuntimeError("sequence parallel group is not initialized: call "
                           "initialize_sequence_parallel(size) first")
    return layout


def get_sequence_parallel_group():
    return _layout().group


def get_sequence_parallel_world_size() -> int:
    return _layout().size


def get_sequence_parallel_rank() -> int:
    return _layout().rank


def get_sequence_data_parallel_group():
    return _layout().data_group


def get_sequence_data_parallel_world_size() -> int:
    return dist.get_world_size(_layout().data_group)


def get_sequence_data_parallel_rank() -> int:
    return dist.get_rank(_layout().data_group)


# as in DeepSpeed: the one dimension beside data parallelism doubles as "model parallel"
get_model_parallel_rank = get_sequence_parallel_rank
get_model_parallel_world_size = get_sequence_parallel_world_size
get_model_parallel_group = get_sequence_parallel_group
