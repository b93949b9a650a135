"""One parameter's whole fp32 master or optimizer state, put together from the ranks' shards,
and written back: what DeepSpeed's `deepspeed.utils.safe_get_full_fp32_param`,
`safe_get_full_optimizer_state` and their `safe_set_full_*` do. Collective: every rank of the
parameter's shard group calls them.

A rank holds, of each engine group, one shard of the fp32 master and of every optimizer-state
array laid out like it (csrc/core/sharded_layout.h); checkpoint_pieces.RankPieces says where
a parameter's elements lie in it. A get fills this rank's elements into zeros and sums over
the shard group; a set writes this rank's elements into its shard.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from . import engine as engine_module
from .checkpoint_pieces import RankPieces
from .sharding import names_by_id

_INDEX: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine -> id -> place


def find(param):
    """(engine, group, index in the group, full shape) of a parameter some live engine
    trains; None for one it does not (frozen, or no engine)."""
    for engine in engine_module.live_engines():
        if engine not in _INDEX:
            names = names_by_id(engine.module)
            _INDEX[engine] = {id(p): (g, i, engine.full_shapes[names[id(p)][0]])
                              for g, group in enumerate(engine.groups)
                              for i, p in enumerate(group.params)}
        place = _INDEX[engine].get(id(param))
        if place is not None:
            return (engine, *place)
    return None


def get_full(param, array: str) -> torch.Tensor | None:
    """The whole fp32 value of `array` ("master", or an optimizer state such as "exp_avg")
    for `param`, on every rank; None for a parameter no engine trains."""
    place = find(param)
    if place is None:
        return None
    engine, g, i, shape = place
    core = engine.core
    layout = core.group_layout(g)
    shard = _shard(core, g, array)
    value = torch.zeros(shape.numel(), dtype=torch.float32, device=shard.device)
    for start, stop, position in RankPieces(layout, core.rank).of(layout.param_offset(i),
                                                                  shape.numel()):
        value[start:stop] = shard[position:position + stop - start]
    group = _shard_group(engine, layout)
    if group is not None:
        dist.all_reduce(value, group=group)  # each element is held by one rank, zeros elsewhere
    return value.view(shape)


def set_full(param, value: torch.Tensor, array: str) -> None:
    """Writes the whole value of `array` for `param`: each rank its own elements (the model's
    weights follow the master at the next step, as in DeepSpeed)."""
    place = find(param)
    if place is None:
        raise ValueError("zero: this parameter is not trained by any engine (frozen, or its "
                         "engine was destroyed): it has no fp32 master or optimizer state")
    engine, g, i, shape = place
    core = engine.core
    layout = core.group_layout(g)
    if value.numel() != shape.numel():
        raise ValueError(f"zero: a value of shape {tuple(value.shape)} for a parameter of "
                         f"shape {tuple(shape)}")
    shard = _shard(core, g, array).clone()
    flat = value.detach().reshape(-1).to(shard.dtype)
    for start, stop, position in RankPieces(layout, core.rank).of(layout.param_offset(i),
                                                                  shape.numel()):
        shard[position:position + stop - start] = flat[start:stop].to(shard.device)
    with torch.no_grad():
        if array == "master":
            core.group_load_master_shard(g, shard)
        else:
            core.group_load_optimizer_state(g, array, shard)


def _shard(core, g: int, array: str) -> torch.Tensor:
    if array == "master":
        return core.group_master_shard(g)
    state = dict(core.group_optimizer_state(g))
    if array not in state:
        raise ValueError(f"zero: the optimizer keeps no {array!r}; it keeps {sorted(state)}")
    return state[array]


def _shard_group(engine, layout):
    """The process group a layout's shards are spread over: none for a group every rank
    holds whole, the data-parallel group for one sharded over it."""
    if layout.world_size == 1:
        return None
    if layout.world_size == dist.get_world_size(engine.data_parallel_group):
        return engine.data_parallel_group
    raise NotImplementedError(
        f"zero: this parameter's shards are spread over {layout.world_size} ranks, a subgroup "
        "of the data-parallel ranks (MiCS, or hpZ); safe_get_full_* / safe_set_full_* are built "
        "for shards over all data-parallel ranks only")
