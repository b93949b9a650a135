"""Where each trainable parameter lives in a checkpoint's rank files, and loading a
checkpoint saved at another world size or stage.

The shapes come from the module state dict saved beside it. A rank file holds, per engine
group, that rank's shard: its piece of every unit of the group's sharded layout
(csrc/core/sharded_layout.h), in unit order. `describe` records the layout at save time in
model_states.pt; `located_arrays` says where each parameter's elements lie in the ranks'
pieces, and `reshard_into` cuts this rank's new shard from them, reading only its own
elements (checkpoint_pieces.py). An MoE expert group's shard lies over the expert data-parallel
group of each expert-parallel rank, under rank 0's local expert ids: moe/checkpoint.py says
which saved ranks hold whose experts, and experts are matched by their global ids.
checkpoint_export.py reads the fp32 weights from the same layout without a process group.
"""
from __future__ import annotations

import os

import torch

from . import checkpoint_files as files
from .checkpoint_files import WHOLE, PartNames
from .checkpoint_pieces import Flat, Located, shard_from
from .moe import checkpoint as moe_checkpoint
from .moe import ep_checkpoint
from .sharding import names_by_id


def group_param_names(engine) -> list[list[str]]:
    """Each engine group's parameters, by their first name in the model."""
    names = names_by_id(engine.module)
    return [[names[id(p)][0] for p in group.params] for group in engine.groups]


def describe(engine) -> dict:
    """The layout of every engine group (with the optimizer group that owns it), and the
    frozen parameters' names."""
    names = names_by_id(engine.module)
    groups = []
    for g, group in enumerate(engine.groups):
        layout = engine.core.group_layout(g)
        groups.append({
            "owner": group.owner,
            "world_size": layout.world_size,
            "units": [(layout.shard_offset(u), layout.unit(u).shard_numel)
                      for u in range(layout.unit_count)],
            "params": [(names[id(p)], layout.param_offset(i))
                       for i, p in enumerate(group.params)]})
    trainable = {id(p) for group in engine.groups for p in group.params}
    frozen = [n for p_id, ns in names.items() if p_id not in trainable for n in ns]
    return {"groups": groups, "frozen": frozen}


def layout_of(model_state: dict, path: str) -> dict:
    """The layout a checkpoint recorded (`describe`), or an error saying how to get one."""
    layout = model_state.get("layout")
    if layout is None:
        raise ValueError(f"zero: {path} was saved before checkpoints recorded their layout; "
                         "load it into an engine at the world size it was saved with and save "
                         "it again")
    return layout


def read_shards(path: str, model_state: dict, names: PartNames = WHOLE) -> list[list[dict]]:
    """Every saved rank's groups (master and optimizer state shards) of the part `names`:
    each rank file present, equal to the manifest and in a format this zero reads (a
    CorruptCheckpoint naming the file otherwise), memory-mapped (read when touched)."""
    world = max(max(ranks) + 1 for group in layout_of(model_state, path)["groups"]
                for ranks, _ in moe_checkpoint.saved_copies(model_state, group))
    files.verify(path, [names.rank(r) for r in range(world)])
    return [files.load_torch(os.path.join(path, names.rank(r)), mmap=True)["groups"]
            for r in range(world)]


def laid_out_arrays(group: dict) -> list[str]:
    """The optimizer-state arrays of one saved group shard ({"master", "state"}) laid out like
    its master (Adam's moments, SGD's momentum), not a flag such as a step count."""
    return [array for array, value in group["state"].items()
            if value.numel() == group["master"].numel()]


def located_arrays(path: str, model_state: dict, array: str, shards=None,
                   names: PartNames = WHOLE) -> list[dict[str, Located]]:
    """Per group: where each parameter's elements of array `array` ("master", "exp_avg", ...)
    lie in the saved ranks' shards, by its first name, an MoE expert's under its global id
    (nothing read yet; an empty dict for a group whose optimizer keeps no such array). A
    group's full buffer is, unit after unit, every rank's piece of the unit in rank order;
    an expert group has one such buffer per expert-parallel rank (moe/checkpoint.py)."""
    layout = layout_of(model_state, path)
    shards = shards if shards is not None else read_shards(path, model_state, names)
    result = []
    for g, group in enumerate(layout["groups"]):
        located = {}
        for ranks, rename in moe_checkpoint.saved_copies(model_state, group):
            pieces = [shards[r][g]["master"] if array == "master"
                      else shards[r][g]["state"].get(array) for r in ranks]
            if pieces[0] is None:
                break
            _check_pieces(pieces, ranks, group, g, path, names)
            flat = Flat([piece[begin:begin + numel] for begin, numel in group["units"]
                         for piece in pieces])
            for names_of_param, offset in group["params"]:
                name = names_of_param[0]
                try:  # the saved parameter's shape
                    value = flat.located(moe_checkpoint.saved_shape(model_state, name), offset)
                except ValueError as error:
                    raise files.CorruptCheckpoint(
                        f"zero: the layout in {os.path.join(path, names.model)} puts {name} "
                        f"outside group {g}'s units ({error})") from error
                key = rename(name)  # an AutoEP layer's rows: every copy's joined in order
                located[key] = located[key].followed_by(value) if key in located else value
        result.append(located)
    return result


def _check_pieces(pieces: list, ranks: list[int], group: dict, g: int, path: str,
                  names: PartNames) -> None:
    """Every saved rank's array of group g holds all its units' pieces."""
    needed = max((begin + numel for begin, numel in group["units"]), default=0)
    for r, piece in zip(ranks, pieces):
        if piece is None or piece.numel() < needed:
            raise files.CorruptCheckpoint(
                f"zero: {os.path.join(path, names.rank(r))} holds "
                f"{0 if piece is None else piece.numel()} elements of "
                f"group {g}, its layout needs {needed}; the files are of different saves")


def full_arrays(path: str, model_state: dict, array: str, shards=None,
                names: PartNames = WHOLE):
    """Per group: [(names, whole value)] of array `array` for every parameter, read from the
    saved ranks' shards."""
    layout = layout_of(model_state, path)
    located = located_arrays(path, model_state, array, shards, names)
    return [[(names, located[g][names[0]].whole()) for names, _ in group["params"]]
            if located[g] else [] for g, group in enumerate(layout["groups"])]


def reshard_into(engine, path: str, model_state: dict, shards=None) -> None:
    """Loads a checkpoint saved at another world size or stage (or, with MoE layers, another
    ep_size or expert layout): this rank's new shard of each engine group is cut from the
    saved ranks' shards, parameter by parameter, reading only its own elements
    (checkpoint_pieces.py; parameters are matched by name, an expert's by its global id, so
    groups may differ, as stage 3's persistent parameters do). `shards`: `read_shards`'
    result, when the caller checked the files already."""
    shards = shards if shards is not None else read_shards(path, model_state)
    master = located_arrays(path, model_state, "master", shards)
    saved_group = {name: g for g, group in enumerate(master) for name in group}
    cache = {"master": {name: value for group in master for name, value in group.items()}}

    def saved(array: str) -> dict[str, Located]:
        if array not in cache:
            cache[array] = {name: value for group in
                            located_arrays(path, model_state, array, shards)
                            for name, value in group.items()}
        return cache[array]

    for g, wanted in enumerate(global_param_names(engine)):
        source = saved_group[wanted[0]]  # the saved group these parameters' state came from
        laid_out = laid_out_arrays(shards[0][source])
        load_group(engine, g, wanted, saved("master"), {a: saved(a) for a in laid_out})
        for array, value in shards[0][source]["state"].items():
            if array not in laid_out:  # not laid out like the shard (a flag): as saved
                engine.core.group_load_optimizer_state(g, array, value)


def saved_params(model_state: dict, path: str):
    """(g, saved group g, the parameter's names) of every trainable parameter a checkpoint
    holds the state of, an MoE expert's under its global id (every expert-parallel rank's)."""
    for g, group in enumerate(layout_of(model_state, path)["groups"]):
        for _, rename in moe_checkpoint.saved_copies(model_state, group):
            for names, _ in group["params"]:
                yield g, group, [rename(name) for name in names]


def saved_param_names(model_state: dict, path: str) -> set[str]:
    """The trainable parameters a checkpoint holds the state of, by first name (saved_params)."""
    return {names[0] for _, _, names in saved_params(model_state, path)}


def saved_group_sources(engine, model_state: dict, path: str) -> list[int] | None:
    """For each of this engine's optimizer groups, the saved group that held its first
    parameter (the layout's owners); None where neither side has MoE layers (the groups are
    as saved). MoE experts of each ep_size make a group of their own, so another layout has
    other groups."""
    if not model_state.get("moe") and engine.moe is None:
        return None
    owner = {names[0]: group["owner"] for _, group, names in saved_params(model_state, path)}
    rename, names = global_name(engine), names_by_id(engine.module)
    sources = []
    for group in engine.optimizer.param_groups:
        held = [owner[rename(names[id(p)][0])] for p in group["params"]
                if rename(names[id(p)][0]) in owner]
        sources.append(held[0] if held else 0)
    return sources


def optimizer_state_for(saved: dict, sources: list[int] | None) -> dict:
    """The saved optimizer state (hyperparameters per optimizer group) for this engine's
    groups: as saved, or each group's from its source (saved_group_sources)."""
    if sources is None:
        return saved
    return {**saved, "param_groups": [saved["param_groups"][s] for s in sources]}


def global_param_names(engine) -> list[list[str]]:
    """group_param_names, an MoE expert's under its global id (moe/checkpoint.py)."""
    rename = global_name(engine)
    return [[rename(name) for name in names] for names in group_param_names(engine)]


def global_name(engine):
    """name -> the name in a model holding every expert (the same without MoE layers)."""
    return moe_checkpoint.global_names(engine.module) if engine.moe is not None else str


def check_same_model(where: str, saved: dict, expected: dict, required=()) -> None:
    """Before anything is loaded: every saved tensor the model also has must have its shape
    (`saved` and `expected`: name -> tensor or shape), and every `required` name be saved;
    else a ValueError listing the first five differences."""
    problems = [f"{name}: saved {tuple(value.shape)}, the model has {tuple(expected[name])}"
                for name, value in saved.items()
                if name in expected and tuple(value.shape) != tuple(expected[name])]
    problems += [f"{name}: not in the checkpoint" for name in required if name not in saved]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError(f"zero: {where} is of another model: {'; '.join(problems[:5])}{more}"
                         "; nothing was loaded. Build the model the checkpoint was saved from")


def refresh_masters(core) -> None:
    """Every group's fp32 master from the weights just loaded (a load without the optimizer
    state keeps the master in step with the module)."""
    for g in range(core.group_count):
        core.group_refresh_master(g)


def load_group(engine, g: int, names: list[str], master: dict[str, Located],
               states: dict[str, dict[str, Located]]) -> None:
    """Engine group g's shards on this rank, cut from the saved values by parameter name
    (checkpoint_pieces.shard_from): the fp32 master and each optimizer-state array the group
    keeps, laid out like it (`states`: array -> values; Muon's groups keep other arrays than
    its Adam's). An AutoEP layer's stacked experts may be given whole: this rank's rows are
    cut from them (moe/ep_checkpoint.local_part)."""
    core = engine.core
    layout = core.group_layout(g)
    place = _shard_place(engine, g)
    cut = ep_checkpoint.local_part(engine.module)

    def mine(values: dict[str, Located]) -> torch.Tensor:
        return shard_from(layout, place, {name: cut(name, values[name]) for name in names},
                          names)
    core.group_load_master_shard(g, mine(master))
    kept = set(core.group_state_names(g))
    for array, values in states.items():
        if array in kept:
            core.group_load_optimizer_state(g, array, mine(values))


def _shard_place(engine, g: int) -> int:
    """This rank's place among the ranks group g is sharded over: an MoE expert group's
    expert data-parallel group (moe/engine_layout.py), else the world's (MiCS's shard groups
    are consecutive ranks: RankPieces takes the rank modulo their size)."""
    expert = engine.moe.shard_group(engine.groups[g].params[0],
                                    engine.core.group_layout(g).world_size) if engine.moe else None
    return expert[0] if expert else engine.core.rank
