"""The experts in a checkpoint, as DeepSpeed writes them: the shared weights stay in the
model file; each expert of each MoE layer has a file of its own,
`layer_{L}_expert_{E}_mp_rank_00_model_states.pt` (L: the layer's place among the model's
MoE layers, E: the global expert id), holding its state-dict entries under the global id
(`...deepspeed_experts.{E}.fc1.weight`), written once, by the first rank of the expert's
expert data-parallel group. A rank loading reads its own experts' files and names them by
its local ids again, so module weights load at any ep_size and world size.

The ranks' optimizer shards name each expert by the local id it had on rank 0, and an expert
group's shard lies over the expert's expert data-parallel group. `saved_copies` says, for
each saved engine group, which saved ranks' pieces make up whose experts' buffer, under
global ids; `global_names` names the loading engine's experts alike, so the optimizer states
reshard to any world size, ep_size and layout (checkpoint_layout.py), and zero_to_fp32
writes every expert under its global id. `whole_state` is the model with every expert under
its global id, for a whole-model save.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch.distributed as dist
from torch import nn

from ..checkpoint_files import CorruptCheckpoint

from . import ep_checkpoint
from .groups import EXPERT_GROUPS, layout
from .layer import MoE

EXPERTS = "deepspeed_moe.experts.deepspeed_experts."
_EXPERT_KEY = re.compile(re.escape(EXPERTS) + r"(\d+)\.")
_EXPERT_ANYWHERE = re.compile(re.escape(EXPERTS) + r"\d+\.")


def is_expert_key(name: str) -> bool:
    return EXPERTS in name


def layer_name(key: str) -> str:
    """The module name of the MoE layer an expert's state-dict key is of."""
    return key[:key.index(EXPERTS)].removesuffix(".")


def kept_names(keep_all: bool, model: nn.Module):
    """full_state_dict's `keep` for a model with MoE layers: every name on a rank that keeps
    the whole state, its own experts' on every other rank (they write or gather them)."""
    autoep = ep_checkpoint.kept(model)
    return (lambda name: True) if keep_all else \
        (lambda name: is_expert_key(name) or autoep(name))


def expert_file(layer: int, expert: int) -> str:
    return f"layer_{layer}_expert_{expert}_mp_rank_00_model_states.pt"


def layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """(name, layer) of the model's MoE layers, in model order (DeepSpeed's layer ids)."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, MoE)]


def describe(model: nn.Module) -> list[dict]:
    """What the model file records of the MoE layers (checked at load): the experts' layout
    decides which rank's shard holds which experts' optimizer state. DeepSpeed-MoE's layers,
    then AutoEP's (ep_checkpoint.py, "kind": "autoep")."""
    return [{"name": name, "num_experts": layer.num_experts, "ep_size": layer.ep_size,
             "data_before_expert": EXPERT_GROUPS.get(layer.expert_group_name).data_before_expert}
            for name, layer in layers(model)] + ep_checkpoint.describe(model)


def _deepspeed_moe(moe_layers: list[dict]) -> list[dict]:
    """The described DeepSpeed-MoE layers (their experts in files of their own)."""
    return [layer for layer in moe_layers if layer.get("kind") != ep_checkpoint.KIND]


def _first_expert(layer: MoE) -> int:
    """The global id of this rank's first local expert."""
    return EXPERT_GROUPS.get(layer.expert_group_name).expert_rank * layer.num_local_experts


def _renamed(key: str, layer_name: str, offset: int) -> str | None:
    """`key` of an expert of the layer named `layer_name`, its expert index moved by
    `offset`; None for any other key."""
    head = f"{layer_name}." if layer_name else ""
    match = _EXPERT_KEY.match(key, len(head)) if key.startswith(head) else None
    if match is None:
        return None
    return f"{head}{EXPERTS}{int(match.group(1)) + offset}.{key[match.end():]}"


def split(model: nn.Module, state: dict) -> tuple[dict, dict[str, dict]]:
    """(the shared entries, {file: one expert's entries under its global id} of the experts
    this rank writes: those of which it is its expert data-parallel group's first rank)."""
    shared, files = dict(state), {}
    for index, (name, layer) in enumerate(layers(model)):
        offset = _first_expert(layer)
        writes = EXPERT_GROUPS.get(layer.expert_group_name).data_rank == 0
        for key in [k for k in shared if _renamed(k, name, 0)]:
            value = shared.pop(key)
            if writes:
                global_key = _renamed(key, name, offset)
                expert = int(_EXPERT_KEY.match(global_key, len(name) + bool(name)).group(1))
                files.setdefault(expert_file(index, expert), {})[global_key] = \
                    value.detach().clone()
    return shared, files


def read_own(model: nn.Module, path: str, load) -> dict:
    """This rank's DeepSpeed-MoE experts' entries from their files in checkpoint `path`,
    under its local ids; `load(file)` reads one file. (AutoEP's experts are whole in the
    model file: engine.load_module_weights keeps this rank's rows.)"""
    return localized(model, {key: value for file in own_files(model)
                             for key, value in load(os.path.join(path, file)).items()})


def global_names(model: nn.Module) -> Callable[[str], str]:
    """name -> the name in a model holding every expert: an expert's local id made its
    global id, any other name as it is."""
    return _renamer([(name, _first_expert(layer)) for name, layer in layers(model)])


def _renamer(offsets: list[tuple[str, int]]) -> Callable[[str], str]:
    """key -> key with the expert index of layer `name` moved by `offset`, for each (name,
    offset); any other key as it is."""
    def rename(key: str) -> str:
        return next((renamed for name, offset in offsets
                     if (renamed := _renamed(key, name, offset)) is not None), key)
    return rename


def localized(model: nn.Module, state: dict) -> dict:
    """A state dict naming every expert by its global id, as this rank's model names it: its
    own experts under their local ids, the other ranks' left out."""
    rename = global_names(model)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    local = {rename(name): name for name in names}
    return {local.get(name, name): value for name, value in state.items()
            if not is_expert_key(name) or name in local}


def generic(name: str) -> str:
    """A name with any expert id left out: the same for every expert of a layer, whatever
    its place (the trainable parameters compared across layouts)."""
    return _EXPERT_ANYWHERE.sub(EXPERTS + "*.", name)


def saved_copies(model_state: dict, group: dict) -> list[tuple[list[int], Callable[[str], str]]]:
    """Where saved engine group `group` (checkpoint_layout.describe's, named as on rank 0)
    lies (`copies`: over its first `world_size` ranks, or each expert-parallel rank's expert
    data-parallel group, its first rank alone at stage 0)."""
    return copies(model_state.get("moe") or [], model_state["fingerprint"]["world_size"],
                  group["world_size"], [names[0] for names, _ in group["params"]])


def copies(moe_layers: list[dict], world: int, group_world: int, names: list[str]
           ) -> list[tuple[list[int], Callable[[str], str]]]:
    """Where a saved group's flat buffer lies, whose parameters `names` (rank 0's) are sharded
    over `group_world` ranks of a saved `world`: per copy of the buffer, (the saved ranks whose
    pieces, in order, make it up, the rename of its names to global ids). A group of shared
    parameters has one copy, over the first `group_world` ranks; an expert group one per
    expert-parallel rank e, over the first `group_world` ranks of e's expert data-parallel
    group, holding e's experts. `moe_layers`: as `describe` records them."""
    held = [layer for layer in moe_layers if any(_holds(layer, name) for name in names)]
    if not held:
        return [(list(range(group_world)), lambda name: name)]
    (ep_size, data_before_expert), *others = {(layer["ep_size"],
                                               layer.get("data_before_expert", False))
                                              for layer in held}
    if others:
        raise CorruptCheckpoint(f"zero: the layout in a checkpoint puts MoE layers of "
                                f"different layouts in one group ({held})")
    _, data_layout = layout(world, ep_size, data_before_expert)
    # (an AutoEP layer's rows keep their name in every copy: located_arrays joins them)
    return [(ranks[:group_world],
             _renamer([(layer["name"], _first_of(layer, e)) for layer in held
                       if layer.get("kind") != ep_checkpoint.KIND]))
            for e, ranks in enumerate(data_layout)]


def _holds(layer: dict, name: str) -> bool:
    """Whether saved parameter `name` is an expert's of described `layer`."""
    if layer.get("kind") == ep_checkpoint.KIND:
        return name in ep_checkpoint.param_names(layer)
    return _renamed(name, layer["name"], 0) is not None


def on_every_expert_rank(moe_layers: list[dict], name: str) -> list[str]:
    """Saved name `name` (an expert's under rank 0's local id) under the global id of the
    expert at its place on each expert-parallel rank; [name] for a shared one."""
    for layer in moe_layers:
        if _renamed(name, layer["name"], 0) is not None:
            return [_renamed(name, layer["name"], _first_of(layer, e))
                    for e in range(layer["ep_size"])]
    return [name]


def _first_of(layer: dict, expert_rank: int) -> int:
    """The global id of expert-parallel rank `expert_rank`'s first expert of saved `layer`."""
    return expert_rank * (layer["num_experts"] // layer["ep_size"])


def saved_shape(model_state: dict, name: str):
    """The shape of parameter `name` in a rank's shard of a checkpoint: the module state's
    entry, an expert's (saved under a local id this rank may not hold) its layer's first
    local expert's, every expert of a layer being alike; an AutoEP layer's stacked experts
    a saved rank's rows of them."""
    module = model_state["module"]
    for layer in model_state.get("moe") or []:
        if layer.get("kind") == ep_checkpoint.KIND and name in ep_checkpoint.param_names(layer):
            return (layer["num_experts"] // layer["ep_size"], *module[name].shape[1:])
    if name not in module:
        name = _EXPERT_ANYWHERE.sub(EXPERTS + "0.", name, count=1)
    return module[name].shape


def every_expert(path: str, moe_layers: list[dict], load) -> dict:
    """Every expert's entries of checkpoint `path` under their global ids (zero_to_fp32);
    `load(file)` reads one file."""
    found = {}
    for index, layer in enumerate(_deepspeed_moe(moe_layers)):
        for expert in range(layer["num_experts"]):
            found.update(load(os.path.join(path, expert_file(index, expert))))
    return found


def expert_files(model_state: dict) -> list[str]:
    """The expert files a checkpoint of `model_state` holds."""
    return [expert_file(index, expert)
            for index, layer in enumerate(_deepspeed_moe(model_state.get("moe") or []))
            for expert in range(layer["num_experts"])]


def own_files(model: nn.Module) -> list[str]:
    """The expert files this rank reads: its own experts'."""
    return [expert_file(index, expert) for index, (_, layer) in enumerate(layers(model))
            for expert in range(_first_expert(layer),
                                _first_expert(layer) + layer.num_local_experts)]


def whole_state(model: nn.Module, state: dict) -> dict | None:
    """The model with every expert under its global id on rank 0 (None on the others): each
    expert's entries sent from its writer (split). Every rank must call it."""
    shared, files = split(model, ep_checkpoint.gathered(model, state, dst=0))
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object({k: v.cpu() for one in files.values() for k, v in one.items()},
                       gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    for experts in gathered:
        shared.update(experts)
    return shared


def check_layers(model_state: dict, model: nn.Module, path: str) -> None:
    """The checkpoint's MoE layers are the model's (names and expert counts; ep_size may
    differ). AutoEP's may be on one side only: a model without them holds every expert whole,
    as at autoep_size 1."""
    saved, mine = model_state.get("moe") or [], describe(model)
    kinds = {layer.get("kind") for layer in saved} & {layer.get("kind") for layer in mine}
    saved, mine = ([(layer["name"], layer["num_experts"]) for layer in found
                    if layer.get("kind") in kinds or layer.get("kind") is None]
                   for found in (saved, mine))
    if saved != mine:
        raise ValueError(
            f"zero: checkpoint {path} has MoE layers {saved or 'none'} (name, num_experts) but "
            f"this model has {mine or 'none'}; load it into the same model")


def same_expert_layout(model_state: dict, model: nn.Module) -> bool:
    """Whether each rank's shard of the checkpoint holds the experts it holds now."""
    return model_state.get("moe") == describe(model)


def refuse_node_local() -> None:
    """checkpoint.use_node_local_storage with experts (raised on every rank alike)."""
    raise NotImplementedError(
        "zero: checkpoint.use_node_local_storage with MoE layers is not built (each expert's "
        "file is written on one node only); set it to false and save to a directory every "
        "rank sees")


def refuse_split_experts(path: str, model_state: dict, what: str) -> None:
    """The readers of every part (ds_to_universal, a load at another pipe x tensor layout)
    join the ranks' shards as if every rank held the same parameters; MoE checkpoints are
    not built there."""
    if model_state.get("moe"):
        raise NotImplementedError(
            f"zero: {what} of checkpoint {path}, a model with MoE layers (its experts in files "
            "of their own), is not built; for the whole model's fp32 weights use zero_to_fp32 "
            "(every expert under its global id), or load the checkpoint into an engine "
            "(load_checkpoint: any world size, ep_size and stage)")
