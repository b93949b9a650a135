"""DeepSpeed-MoE's parameter helpers (`deepspeed.moe.utils`): which parameters are an
expert's, and the optimizer groups split so that each holds either the shared parameters or
one expert group's (`split_params_into_different_moe_groups_for_optimizer`, which the engine
also applies to the groups it is given, as DeepSpeed does)."""
from __future__ import annotations

from torch import nn


def is_moe_param(param) -> bool:
    """An expert's parameter: DeepSpeed marks them allreduce = False (layer.Experts)."""
    return getattr(param, "allreduce", True) is False


def has_moe_layers(module: nn.Module) -> tuple[bool, int]:
    """(whether `module` holds an MoE layer, the first one's num_experts)."""
    from .layer import MoE
    for sub in module.modules():
        if isinstance(sub, MoE):
            return True, sub.num_experts
    return False, 0


def split_params_into_shared_and_expert_params(params) -> tuple[list, list]:
    shared = [p for p in params if not is_moe_param(p)]
    return shared, [p for p in params if is_moe_param(p)]


def split_params_grads_into_shared_and_expert_params(group) -> tuple[list, list]:
    """The gradients of `group`'s parameters that have one: (shared, expert)."""
    shared = [p.grad.to(p.dtype) for p in group if p.grad is not None and not is_moe_param(p)]
    return shared, [p.grad.to(p.dtype) for p in group if p.grad is not None and is_moe_param(p)]


def is_moe_param_group(param_group: dict) -> bool:
    return bool(param_group.get("moe", False))


def split_params_into_different_moe_groups_for_optimizer(param_groups,
                                                         max_group_size=178956971) -> list:
    """Each optimizer group's expert parameters moved into groups of their own, one per
    expert group name (`moe: True`, `name`: the expert group's), each at most
    `max_group_size` elements (None: no limit), after the original groups, which keep the
    shared parameters. The groups given are changed in place, as DeepSpeed does."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif not isinstance(param_groups, list):
        raise ValueError(f"zero: unknown param group type {type(param_groups).__name__}; pass "
                         "a dict, or a list or tuple of dicts")
    names = sorted({p.group_name for group in param_groups for p in group["params"]
                    if is_moe_param(p)})
    added = []
    for group in param_groups:
        params = list(group["params"])
        group["params"] = [p for p in params if not is_moe_param(p)]
        for name in names:
            experts = [p for p in params if is_moe_param(p) and p.group_name == name]
            # (DeepSpeed keeps an empty group only without a size limit)
            empty = [] if max_group_size is not None else [[]]
            for chunk in _chunks(experts, max_group_size) if experts else empty:
                added.append({**group, "name": name, "moe": True, "params": chunk})
    return param_groups + added


def _chunks(params: list, limit) -> list[list]:
    if limit is None:
        return [params]
    chunks, size = [[]], 0
    for param in params:
        numel = getattr(param, "ds_numel", param.numel())
        if chunks[-1] and size + numel > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(param)
        size += numel
    return chunks


def configure_moe_param_groups(model_parameters: list) -> list:
    """DeepSpeed's engine on the model_parameters it is given: a list of parameters becomes
    the group 'dense-params' split as above; groups already split are left alone."""
    if not isinstance(model_parameters, list):
        raise TypeError("zero: model_parameters must be a list for a model with MoE layers")
    if not model_parameters:
        return model_parameters
    if isinstance(model_parameters[0], dict):
        if any("moe" in group for group in model_parameters):
            return model_parameters
        return split_params_into_different_moe_groups_for_optimizer(model_parameters)
    return split_params_into_different_moe_groups_for_optimizer(
        {"params": model_parameters, "name": "dense-params"})
