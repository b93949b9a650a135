"""`deepspeed.utils.groups`: the sequence-parallel accessors the Hugging Face Trainer and
Accelerate call (`_get_sequence_parallel_group()` ...), over the layout the last
`initialize` or `initialize_sequence_parallel` made (zero/parallel/sequence.py). Without
sequence parallelism: size 1, rank 0, and no sequence group (KeyError, as in DeepSpeed)."""
from __future__ import annotations

import torch.distributed as dist

from zero.parallel import sequence


def _get_sequence_parallel_world_size() -> int:
    layout = sequence.ActiveGroups.get()
    return layout.size if layout is not None else 1


def _get_sequence_parallel_rank() -> int:
    layout = sequence.ActiveGroups.get()
    return layout.rank if layout is not None else 0


def _get_sequence_parallel_group():
    layout = sequence.ActiveGroups.get()
    if layout is None:
        raise KeyError("No sequence parallel group found")
    return layout.group


def _get_sequence_data_parallel_group():
    return dist.group.WORLD


def _get_sequence_data_parallel_world_size() -> int:
    return dist.get_world_size()


def _get_sequence_data_parallel_rank() -> int:
    return dist.get_rank()


def _get_data_parallel_world_size() -> int:
    """The replicas: the world over the sequence group's size."""
    return dist.get_world_size() // _get_sequence_parallel_world_size()


def _get_data_parallel_rank() -> int:
    layout = sequence.ActiveGroups.get()
    return layout.data_rank if layout is not None else dist.get_rank()


def _get_model_parallel_world_size() -> int:
    return 1
