"""`deepspeed.utils.groups`: the sequence-parallel accessors the Hugging Face Trainer and
Accelerate call (`_get_sequence_parallel_group()` ...), over the layout the last
`initialize` or `initialize_sequence_parallel` made (zero/parallel/sequence.py). Without
sequence parallelism: size 1, rank 0, and no sequence group (KeyError, as in DeepSpeed).
And DeepSpeed-MoE's expert accessors (`_get_expert_parallel_group("ep_size_2")` ...), over
the groups zero/moe/groups.py made."""
from __future__ import annotations

import torch.distributed as dist

from zero.moe.groups import EXPERT_GROUPS, group_name
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


mpu = None  # DeepSpeed's module-level model-parallel unit (zero's MoE builds none)


def _create_expert_and_data_parallel(expert_parallel_size_, mp_size=None, pp_size=None,
                                     mp_mode="tp", use_data_before_expert_parallel_=False,
                                     folding_spec=None):
    if (mp_size or 1) > 1 or (pp_size or 1) > 1:
        raise NotImplementedError("zero: expert groups with tensor or pipeline parallelism are "
                                  "not built; leave mp_size and pp_size at 1")
    EXPERT_GROUPS.create(expert_parallel_size_, use_data_before_expert_parallel_)


def _get_expert_parallel_group(group_name):
    return EXPERT_GROUPS.get(group_name).expert_group


def _get_expert_parallel_group_ranks(group_name):
    return EXPERT_GROUPS.get(group_name).expert_ranks


def _get_expert_data_parallel_group(group_name):
    return EXPERT_GROUPS.get(group_name).data_group


def _get_expert_data_parallel_group_ranks(group_name):
    return EXPERT_GROUPS.get(group_name).data_ranks


def _get_expert_parallel_group_dict():
    return {name: EXPERT_GROUPS.get(name).expert_group for name in EXPERT_GROUPS.names()}


def _get_expert_data_parallel_group_dict():
    return {name: EXPERT_GROUPS.get(name).data_group for name in EXPERT_GROUPS.names()}


def _get_expert_parallel_world_size(group_name) -> int:
    return len(EXPERT_GROUPS.get(group_name).expert_ranks)


def _get_expert_parallel_rank(group_name) -> int:
    return EXPERT_GROUPS.get(group_name).expert_rank


def _get_expert_data_parallel_world_size(group_name) -> int:
    return len(EXPERT_GROUPS.get(group_name).data_ranks)


def _get_expert_data_parallel_rank(group_name) -> int:
    return EXPERT_GROUPS.get(group_name).data_rank


def _get_expert_broadcast_src_rank(group_name) -> int:
    return EXPERT_GROUPS.get(group_name).data_ranks[0]


def _get_max_expert_size():
    sizes = [EXPERT_GROUPS.get(name).ep_size for name in EXPERT_GROUPS.names()]
    return max(sizes) if sizes else None


def _get_max_expert_size_name() -> str:
    return group_name(_get_max_expert_size())


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def _get_expert_model_parallel_world_size() -> int:
    return 1
