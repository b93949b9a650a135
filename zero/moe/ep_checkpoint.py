"""AutoEP's experts (ep_experts.py) in state dicts and checkpoints.

An AutoEP block's experts are two stacked parameters whose rows are the experts; each rank
holds its expert-parallel rank's rows under the whole parameter's name. In a whole-model
state dict (a checkpoint's model file, save_16bit_model) each is whole again: every
expert-parallel rank's rows gathered in rank order (`gathered`), the tensor Hugging Face's
model holds, so `from_pretrained` reads it. A rank loading one keeps its own rows
(`localized`), at any world size and autoep_size. In the optimizer shards an expert group's
buffer lies over each expert-parallel rank's expert data-parallel group, holding that rank's
rows under the same names: moe/checkpoint.copies lists the copies and
checkpoint_layout.located_arrays joins them row after row (`local_part` cuts this rank's).
A module's own `state_dict()` holds this rank's rows (at stages 0-2, where the Hugging Face
Trainer's save_model reads it through Accelerate); `whole_rows` makes it whole, every rank
calling it, as Accelerate's `clone_tensors_for_torch_save` does (compat/deepspeed).
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn

from .ep_experts import LOCAL_ROWS, ExpertParallelExperts
from .groups import EXPERT_GROUPS, group_name

STACKED = ("gate_up_proj", "down_proj")
KIND = "autoep"  # describe()'s "kind" of an AutoEP layer (DeepSpeed-MoE's layers have none)


def layers(model: nn.Module) -> list[tuple[str, ExpertParallelExperts]]:
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, ExpertParallelExperts)]


def describe(model: nn.Module) -> list[dict]:
    return [{"name": name, "kind": KIND, "num_experts": layer.num_experts,
             "ep_size": layer.ep_size,
             "data_before_expert": EXPERT_GROUPS.get(layer.expert_group_name).data_before_expert}
            for name, layer in layers(model)]


def param_names(layer: dict) -> list[str]:
    """The stacked parameters' names of a described AutoEP layer."""
    return [f"{layer['name']}.{param}" if layer["name"] else param for param in STACKED]


def _rows(model: nn.Module) -> dict[str, tuple[ExpertParallelExperts, int]]:
    """Each stacked parameter's name -> (its layer, this rank's first row)."""
    found = {}
    for name, layer in layers(model):
        first = EXPERT_GROUPS.get(layer.expert_group_name).expert_rank * layer.num_local_experts
        for param in param_names({"name": name}):
            found[param] = (layer, first)
    return found


def gathered(model: nn.Module, state: dict, dst: int | None = None) -> dict:
    """`state` with each stacked parameter whole: every expert-parallel rank's rows in rank
    order, one parameter at a time, on every rank (`dst` None) or on global rank `dst` alone
    (the others keep theirs). Every rank must call it; a parameter left out of `state`
    (frozen, excluded) is skipped."""
    state = dict(state)
    for name, (layer, _) in _rows(model).items():
        mine = state.get(name)
        if mine is None or layer.ep_size == 1:
            continue
        ranks = EXPERT_GROUPS.get(layer.expert_group_name).expert_ranks
        if dst is not None and dst not in ranks:
            continue  # another expert-parallel group gathers for dst
        work = mine.detach().to(_collective_device(layer.ep_group)).contiguous()
        pieces = [torch.empty_like(work) for _ in ranks] \
            if dst is None or dist.get_rank() == dst else None
        if dst is None:
            dist.all_gather(pieces, work, group=layer.ep_group)
        else:
            dist.gather(work, pieces, dst=dst, group=layer.ep_group)
        if pieces is not None:
            state[name] = torch.cat(pieces).to(mine.device)
    return state


JOIN_TIMEOUT_S = 120.0  # how long whole_rows waits for the other expert-parallel ranks


def whole_rows(state: dict, timeout_s: float | None = None) -> dict:
    """A module's state dict (as `module.state_dict()` returns it, with its `_metadata`) with
    each AutoEP stacked parameter whole, every expert-parallel rank's rows in rank order, on
    every rank; a state dict without AutoEP rows as it is. Every rank must call it: one whose
    expert-parallel ranks do not join within `timeout_s` (JOIN_TIMEOUT_S) raises, naming the
    parameter and the fix."""
    metadata = getattr(state, "_metadata", None) or {}
    marked = [(prefix, entry[LOCAL_ROWS]) for prefix, entry in metadata.items()
              if isinstance(entry, dict) and LOCAL_ROWS in entry]
    if not marked:
        return state
    whole = type(state)(state)
    whole._metadata = metadata
    for prefix, rows in marked:
        groups = EXPERT_GROUPS.get(group_name(rows["ep_size"]))
        for name in param_names({"name": prefix}):
            mine = whole.get(name)
            if mine is not None and mine.shape[0] == rows["num_experts"] // rows["ep_size"]:
                whole[name] = _all_gather_rows(name, mine, groups, timeout_s or JOIN_TIMEOUT_S)
    return whole


def _all_gather_rows(name: str, mine: torch.Tensor, groups, timeout_s: float) -> torch.Tensor:
    work = mine.detach().to(_collective_device(groups.expert_group)).contiguous()
    pieces = [torch.empty_like(work) for _ in groups.expert_ranks]
    pending = dist.all_gather(pieces, work, group=groups.expert_group, async_op=True)
    try:
        pending.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as error:
        raise RuntimeError(
            f"zero: '{name}' holds this rank's {mine.shape[0]} of "
            f"{mine.shape[0] * len(groups.expert_ranks)} experts (AutoEP); the whole state dict "
            f"gathers the others from the expert-parallel ranks {list(groups.expert_ranks)}, "
            f"which did not all join within {timeout_s:g} s. Make it on every rank (as the "
            "Hugging Face Trainer's save_model does), or save the whole model with "
            "engine.save_16bit_model() or zero_to_fp32") from error
    return torch.cat(pieces).to(mine.device)


def _collective_device(group) -> torch.device:
    """Where a collective over `group` takes its tensors (NCCL's: this rank's GPU)."""
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def localized(model: nn.Module, state: dict) -> dict:
    """A whole-model state dict with this rank's rows of each stacked parameter."""
    state = dict(state)
    for name, (layer, first) in _rows(model).items():
        whole = state.get(name)
        if whole is not None and whole.shape[0] == layer.num_experts:
            state[name] = whole[first:first + layer.num_local_experts]
    return state


def whole_shapes(model: nn.Module, shapes: dict) -> dict:
    """{name: shape} of this rank's parameters with each stacked one's whole shape."""
    rows = _rows(model)
    return {name: (rows[name][0].num_experts, *shape[1:]) if name in rows else shape
            for name, shape in shapes.items()}


def kept(model: nn.Module):
    """Whether a name is a stacked parameter (every rank keeps its own rows of those)."""
    names = set(_rows(model))
    return names.__contains__


def local_part(model: nn.Module):
    """(name, whole located value) -> this rank's rows of it, for a stacked parameter (a
    checkpoint_pieces.Located); any other value as it is."""
    rows = _rows(model)

    def cut(name: str, value):
        if name not in rows:
            return value
        layer, first = rows[name]
        per_row = value.shape.numel() // layer.num_experts
        return value.part(first * per_row, (first + layer.num_local_experts) * per_row,
                          (layer.num_local_experts, *value.shape[1:]))
    return cut
