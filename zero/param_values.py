"""One parameter's whole fp32 master, optimizer state or reduced gradient, put together from
the ranks' shards, and written back: what DeepSpeed's `deepspeed.utils.safe_get_full_fp32_param`,
`safe_get_full_optimizer_state`, `safe_get_full_grad` and their `safe_set_full_*` do.
Collective: every rank of the parameter's shard group calls them.

A rank holds, of each engine group, one shard of the fp32 master, of every optimizer-state
array and of the gradients, all laid out alike (csrc/core/sharded_layout.h);
checkpoint_pieces.RankPieces says where a parameter's elements lie in it. A get fills this
rank's elements into zeros on the engine's device and sums over the shard group; a set writes
this rank's elements into its shard. Every array is read and written by range in the C++
engine, touching only the parameter's elements: the gradients ("grad",
csrc/adapter/grad_access.h) between a boundary's backward and the step, the master and the
optimizer state (Group::read_array / write_array) at any time, offloaded ones in host memory
or on NVMe where they are (a master write at stage 3 with the parameters on NVMe goes through
the whole shard, as a checkpoint load does).
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
    """The whole fp32 value of `array` ("master", an optimizer state such as "exp_avg", or
    "grad") for `param`, on every rank; None for a parameter no engine trains."""
    place = find(param)
    if place is None:
        return None
    engine, g, i, shape = place
    layout = engine.core.group_layout(g)
    read = _reader(engine, g, array)
    # on the engine's device (an offloaded shard is on the host; NCCL sums device tensors)
    value = torch.zeros(shape.numel(), dtype=torch.float32, device=engine.device)
    rank, group = _expert_place(engine, g) or (engine.core.rank, _shard_group(engine, layout))
    for start, stop, position in _runs(layout, rank, i, shape):
        value[start:stop] = read(position, stop - start).to(value.device)
    if group is not None:
        dist.all_reduce(value, group=group)  # each element is held by one rank, zeros elsewhere
    return value.view(shape)


def set_full(param, value: torch.Tensor, array: str) -> None:
    """Writes the whole value of `array` for `param`, each rank its own elements; nothing for a
    parameter no engine trains (as DeepSpeed). The model's weights follow a separate master at
    the next step (at stage 3 at once, where the master's load rewrites the partitioned
    weights). Where the parameters are the master (fp32 training) a whole weight takes the
    whole value at once on every rank: its own elements alone would leave the ranks' weights
    different until the step."""
    place = find(param)
    if place is None:
        return
    engine, g, i, shape = place
    if value.numel() != shape.numel():
        raise ValueError(f"zero: a value of shape {tuple(value.shape)} for a parameter of "
                         f"shape {tuple(shape)}")
    flat = value.detach().reshape(-1)
    _write(engine, g, array, [(position, flat[start:stop]) for start, stop, position in
                              _own_runs(engine, g, i, shape)])
    if array == "master" and not engine.core.group_has_master(g) and \
            param.numel() == shape.numel():
        with torch.no_grad():
            param.data.copy_(flat.view(param.shape))


def get_local(param, array: str) -> torch.Tensor | None:
    """This rank's elements of `array` for `param`, in order, flat (DeepSpeed's stage-3
    safe_get_local_*: the rank's fragment); None for a parameter no engine trains."""
    place = find(param)
    if place is None:
        return None
    engine, g, i, shape = place
    read = _reader(engine, g, array)
    pieces = [read(position, stop - start).to(engine.device) for start, stop, position in
              _own_runs(engine, g, i, shape)]
    return torch.cat(pieces) if pieces else \
        torch.zeros(0, dtype=torch.float32, device=engine.device)


def set_local(param, value: torch.Tensor, array: str) -> None:
    """Writes this rank's elements of `array` for `param` (get_local's order and size)."""
    place = find(param)
    if place is None:
        return
    engine, g, i, shape = place
    runs = _own_runs(engine, g, i, shape)
    held = sum(stop - start for start, stop, _ in runs)
    if value.numel() != held:
        raise ValueError(f"zero: {value.numel()} elements for the {held} this rank holds")
    flat, at, writes = value.detach().reshape(-1), 0, []
    for start, stop, position in runs:
        writes.append((position, flat[at:at + stop - start]))
        at += stop - start
    _write(engine, g, array, writes)


def _runs(layout, rank: int, i: int, shape) -> list[tuple[int, int, int]]:
    return RankPieces(layout, rank).of(layout.param_offset(i), shape.numel())


def _own_runs(engine, g: int, i: int, shape) -> list[tuple[int, int, int]]:
    """This rank's runs of parameter i of group g."""
    expert = _expert_place(engine, g)
    return _runs(engine.core.group_layout(g), expert[0] if expert else engine.core.rank, i,
                 shape)


def _expert_place(engine, g: int) -> tuple[int, object] | None:
    """(this rank's place, the process group) an MoE expert group's shards are spread over,
    its expert data-parallel group (moe/engine_layout.py); None for any other group, and for
    one each rank holds whole (stage 0)."""
    return engine.moe.shard_group(engine.groups[g].params[0],
                                  engine.core.group_layout(g).world_size) if engine.moe else None


def _reader(engine, g: int, array: str):
    """(shard position, count) -> this rank's values of group g's `array` there."""
    if array == "grad":
        _check_gradients_reduced(engine)
        return lambda position, count: engine.core.group_read_grads(g, position, count)
    _check_array(engine.core, g, array)
    return lambda position, count: engine.core.group_read_array(g, array, position, count)


def _write(engine, g: int, array: str, writes) -> None:
    """Writes (shard position, values) into group g's shard of `array`, in place."""
    core = engine.core
    if array == "grad":
        _check_gradients_reduced(engine)
        for position, values in writes:
            core.group_write_grads(g, position, values)
        return
    _check_array(core, g, array)
    for position, values in writes:
        core.group_write_array(g, array, position, values.float())


def _check_gradients_reduced(engine) -> None:
    if not engine.gradients_reduced:
        raise RuntimeError(
            "zero: the gradients are only there between engine.backward(loss) at an "
            "accumulation boundary and engine.step() (as DeepSpeed's \"Gradients are only "
            "available immediately after backward and before engine step\"); call "
            "safe_get_full_grad / safe_set_full_grad there")


def _check_array(core, g: int, array: str) -> None:
    names = core.group_state_names(g)
    if array != "master" and array not in names:
        raise ValueError(f"zero: the optimizer keeps no {array!r}; it keeps {sorted(names)}")


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
