"""Loading a checkpoint saved with another pipeline x tensor layout (or with the whole model on
every rank) into this engine's part.

Every saved part's arrays (the fp32 master, each optimizer-state array, the module's saved
values) are put back together into the whole model's, parameter by parameter: a tensor
rank's slices joined along their split dimension (checkpoint_mesh.join_slices), a stage's
parameters beside the others' (a tied weight from its first stage). This rank then cuts its
own part from them: its stage's parameters, each one this rank splits cut to its slice
(checkpoint_mesh.cut_slice), and its data-parallel shard of each engine group
(checkpoint_layout.load_group). The whole arrays are held in memory while this runs (about
16 bytes per parameter with Adam).
"""
from __future__ import annotations

import os

import torch

from . import checkpoint_files as files
from . import checkpoint_layout, checkpoint_mesh
from .checkpoint_pieces import Located
from .moe import checkpoint as moe_checkpoint


class SavedParts:
    """The parts of a checkpoint directory: their names and model states (mapped)."""

    def __init__(self, path: str):
        self.path = path
        self.names = files.part_names(path) or [files.WHOLE]
        files.verify(path, [names.model for names in self.names])
        self.states = [files.load_torch(os.path.join(path, names.model), mmap=True)
                       for names in self.names]
        moe_checkpoint.refuse_split_experts(path, self.states[0], "reading every part")
        mesh = self.states[0]["fingerprint"].get("mesh")
        self.pipe, self.tensor = (1, 1) if mesh is None else (mesh["pipe"], mesh["tensor"])
        if mesh is not None:
            checkpoint_mesh.check_parts(path, [names.mp_rank for names in self.names],
                                        self.pipe, self.tensor)
        self.shards = None

    def read_shards(self) -> None:
        """Every part's rank files, checked against the manifest (mapped)."""
        self.shards = [checkpoint_layout.read_shards(self.path, state, names)
                       for names, state in zip(self.names, self.states)]

    def state_arrays(self) -> list[str]:
        """The optimizer-state arrays laid out like the master that any saved group keeps
        (read_shards first)."""
        found = {array: None for part in self.shards for group in part[0]
                 for array in checkpoint_layout.laid_out_arrays(group)}
        return list(found)

    def whole(self, array: str) -> dict[str, torch.Tensor]:
        """name -> the whole model's value of `array` ("module": the saved module values;
        "master", "exp_avg", ...: the sharded arrays, fp32)."""
        return checkpoint_mesh.join_parts(
            [self._part_values(p, array) for p in range(len(self.names))],
            [state.get("tensor_split", {}) for state in self.states], self.pipe, self.tensor,
            checkpoint_mesh.join_slices)

    def _part_values(self, p: int, array: str) -> dict[str, torch.Tensor]:
        state = self.states[p]
        if array == "module":
            return dict(state["module"])
        groups = checkpoint_layout.full_arrays(self.path, state, array, self.shards[p],
                                               self.names[p])
        return {name: value for group in groups for names, value in group for name in names}


def load_into(engine, saved: SavedParts, load_shards: bool, load_module) -> None:
    """This rank's part of `saved` into `engine`: the module's values, written by
    `load_module(state)` (engine.load_module_weights with the load's strict and
    custom_load_fn), and with `load_shards` the master and optimizer-state shards (else the
    master follows the loaded weights)."""
    module = engine.module
    params = dict(module.named_parameters(remove_duplicate=False))
    grid = getattr(engine, "grid", None)
    rank = grid.get_tensor_model_parallel_rank() if grid is not None else 0
    master = saved.whole("master") if load_shards else None
    saved_module = saved.whole("module")
    state = {}
    for name, current in module.state_dict().items():
        value = master.get(name) if master is not None else None
        value = value if value is not None else saved_module.get(name)
        if value is None:
            continue  # strict loading names what is missing
        state[name] = checkpoint_mesh.cut_slice(value, params.get(name), rank)
    if load_shards:  # before anything is written into the engine
        _check_covers(master, engine, saved.path)
    load_module(state)
    core = engine.core
    if not load_shards:
        checkpoint_layout.refresh_masters(core)
        return
    wanted = checkpoint_layout.group_param_names(engine)
    arrays = {"master": master}
    for array in saved.state_arrays():
        arrays[array] = saved.whole(array)
    first = saved.shards[0][0][0]  # one saved rank's first group: the flags it keeps
    for g, names in enumerate(wanted):
        mine = {array: {n: Located.of(checkpoint_mesh.cut_slice(values[n], params[n], rank))
                        for n in names} for array, values in arrays.items()
                if all(n in values for n in names)}  # the arrays this group's optimizer keeps
        master = mine.pop("master")
        checkpoint_layout.load_group(engine, g, names, master, mine)
        for array, value in first["state"].items():
            if array not in checkpoint_layout.laid_out_arrays(first):  # a flag: as saved
                core.group_load_optimizer_state(g, array, value)


def _check_covers(master: dict, engine, path: str) -> None:
    missing = sorted(n for names in checkpoint_layout.group_param_names(engine) for n in names
                     if n not in master)
    if missing:
        raise ValueError(f"zero: checkpoint {path} has no trainable parameter "
                         f"{', '.join(missing[:5])}" + (f" (and {len(missing) - 5} more)"
                                                        if len(missing) > 5 else "") +
                         "; nothing was loaded. Build the model the checkpoint was saved from")

