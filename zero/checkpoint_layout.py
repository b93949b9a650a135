"""Where each trainable parameter lives in a checkpoint's rank files, and the full fp32
weights read back from them without a process group (DeepSpeed's zero_to_fp32).

The shapes come from the module state dict saved beside it. A rank file holds, per engine
group, that rank's shard: its piece of every unit of the
group's sharded layout (csrc/core/sharded_layout.h), in unit order. `describe` records the
layout at save time in model_states.pt; `get_fp32_state_dict_from_zero_checkpoint` puts each
unit back together from the ranks' pieces and cuts the parameters out of it.
"""
from __future__ import annotations

import os

import torch

from . import checkpoint_files as files

MODEL_FILE = "model_states.pt"
LATEST = "latest"


def rank_file(rank: int) -> str:
    return f"zero_rank{rank}_optim_states.pt"


def describe(engine) -> dict:
    """The layout of every engine group, and the frozen parameters' names."""
    names = {}
    for name, param in engine.module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    groups = []
    for g, group in enumerate(engine.groups):
        layout = engine.core.group_layout(g)
        groups.append({
            "world_size": layout.world_size,
            "units": [(layout.shard_offset(u), layout.unit(u).shard_numel)
                      for u in range(layout.unit_count)],
            "params": [(names[id(p)], layout.param_offset(i))
                       for i, p in enumerate(group.params)]})
    trainable = {id(p) for group in engine.groups for p in group.params}
    frozen = [n for p_id, ns in names.items() if p_id not in trainable for n in ns]
    return {"groups": groups, "frozen": frozen}


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False) -> dict:
    """DeepSpeed's function of the same name: the model's state dict with every trainable
    parameter in fp32 from the checkpoint's master weights, and buffers (and, unless
    excluded, frozen parameters) as saved. Reads only files; needs no process group."""
    if tag is None:
        with open(os.path.join(checkpoint_dir, LATEST)) as file:
            tag = file.read().strip()
    path, _ = files.find(checkpoint_dir, str(tag))
    files.verify(path, [MODEL_FILE])
    model_state = torch.load(os.path.join(path, MODEL_FILE), map_location="cpu",
                             weights_only=False)
    layout = model_state.get("layout")
    if layout is None:
        raise ValueError(f"zero: {path} was saved before checkpoints recorded their layout; "
                         "load it into an engine and save it again to export it")
    state = dict(model_state["module"])
    if exclude_frozen_parameters:
        for name in layout["frozen"]:
            state.pop(name, None)
    world = max(group["world_size"] for group in layout["groups"])
    files.verify(path, [rank_file(r) for r in range(world)])
    shards = [torch.load(os.path.join(path, rank_file(r)), map_location="cpu",
                         weights_only=False)["groups"] for r in range(world)]
    for g, group in enumerate(layout["groups"]):
        full = torch.cat([torch.cat([shards[r][g]["master"][begin:begin + numel]
                                     for r in range(group["world_size"])])
                          for begin, numel in group["units"]])
        for names, offset in group["params"]:
            shape = model_state["module"][names[0]].shape  # the saved whole parameter's
            value = full[offset:offset + shape.numel()].view(shape).float().clone()
            for name in names:
                state[name] = value
    return state


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """DeepSpeed's function of the same name: loads the fp32 weights into `model` (moved to
    the CPU) and returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
