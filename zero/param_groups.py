"""The optimizer groups an engine is built from: the trainable parameters in the groups of
the script's optimizer, of the config's "optimizer" block or of `model_parameters`, each
group's hyperparameters filled in; and the learning-rate scheduler over them (the script's
or the config's "scheduler" block)."""
from __future__ import annotations

from typing import Any

import torch

from . import init as zero_init
from . import muon
from .moe import params as moe_params
from .optimizer import (TORCH_CONFIG_TYPES, OptimizerSpec, check_client_states, check_external,
                        check_on_device, torch_optimizer)
from .schedulers import build_scheduler


def parameter_groups(model, config, optimizer, model_parameters, moe=False):
    """Trainable parameters in optimizer groups, with each group's hyperparameters filled in.
    Frozen parameters (requires_grad=False) stay as they are and are not managed. `moe`: the
    configured optimizer's groups are split into shared and expert ones, as DeepSpeed's."""
    if optimizer is not None and config.optimizer is not None:
        raise ValueError("zero: an optimizer was passed to initialize() and the config has an "
                         "\"optimizer\" block; remove one of them")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = built_by_callable(optimizer, model, model_parameters)
    if config.optimizer is not None and config.optimizer.type in TORCH_CONFIG_TYPES:
        source = model.parameters() if model_parameters is None else model_parameters
        optimizer = torch_optimizer(config.optimizer, as_groups(source))  # as the script's
    if isinstance(optimizer, torch.optim.Optimizer):
        spec = OptimizerSpec.from_torch(optimizer)
        check_external(spec, config)
        check_client_states(spec, config)
        raw_groups = optimizer.param_groups
        optimizer.state.clear()  # the engine keeps the state, sharded (Adagrad's is built eagerly)
    else:
        spec = OptimizerSpec.from_config(config.optimizer) if config.optimizer is not None \
            else OptimizerSpec.inference_only()
        source = model.parameters() if model_parameters is None else model_parameters
        raw_groups = as_groups(source)
        if moe:
            raw_groups = moe_params.configure_moe_param_groups(raw_groups)
        if spec.kind == "muon":
            muon.tag_parameters(model)
            raw_groups = muon.param_groups(raw_groups, config.optimizer.params)
    check_on_device(spec, config)
    groups, trainables, seen = [], [], set()
    for raw in raw_groups:
        params = []
        for param in raw["params"]:
            if not param.requires_grad or id(param) in seen or not zero_init.full_numel(param):
                continue  # frozen, a tied parameter listed twice, or of no elements
            seen.add(id(param))
            params.append(param)
        if not params:
            continue
        if isinstance(optimizer, torch.optim.Optimizer):
            # The client's own group dicts: a scheduler built on the client optimizer keeps
            # steering the lr the engine reads.
            groups.append(raw)
        else:
            groups.append({**spec.defaults, **{k: v for k, v in raw.items() if k != "params"},
                           "params": params})
        trainables.append(params)
    if not groups:
        raise ValueError("zero: the model has no trainable parameters")
    return spec, groups, trainables


def built_by_callable(optimizer, model, model_parameters) -> torch.optim.Optimizer:
    """The optimizer a callable passed to initialize() builds over `model_parameters` (default
    the model's parameters), as DeepSpeed's DeepSpeedOptimizerCallable."""
    if not callable(optimizer):
        raise TypeError(f"zero: initialize(optimizer=...) takes a torch.optim.Optimizer or a "
                        f"callable that builds one from the parameters, not "
                        f"{type(optimizer).__name__}")
    source = model.parameters() if model_parameters is None else model_parameters
    built = optimizer(list(source))
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError(f"zero: the optimizer callable passed to initialize() returned "
                        f"{type(built).__name__}, not a torch.optim.Optimizer")
    return built


def as_groups(source) -> list[dict[str, Any]]:
    """Parameters, or dicts of optimizer groups, as a list of groups."""
    items = list(source)
    if items and isinstance(items[0], dict):
        return items
    return [{"params": items}]


def scheduler(config, client_scheduler, optimizer):
    """The script's scheduler (or a callable that builds one over the optimizer), or the
    config's "scheduler" block's; None without either."""
    if client_scheduler is not None and config.scheduler is not None:
        raise ValueError("zero: an lr_scheduler was passed to initialize() and the config has a "
                         "\"scheduler\" block; remove one of them")
    if client_scheduler is not None:
        return client_scheduler(optimizer) if callable(client_scheduler) and not hasattr(
            client_scheduler, "step") else client_scheduler
    if config.scheduler is not None:
        return build_scheduler(config.scheduler.type, dict(config.scheduler.params), optimizer)
    return None
