"""How an engine lays its parameters out, in one pass (ZeroEngine.__init__ calls these in
order):

1. prepare_model: the model's parameters in the training dtype (buffers keep theirs, as in
   DeepSpeed 0.19: model_dtype.py) and everything on the training device; zero.Init's
   shards converted too; below stage 3 every partitioned parameter is made whole; every
   rank starts from rank 0's values.
2. shard_groups: the C++ engine groups, one per optimizer group and kind:
   - stages 0-2: one group of the config's stage per optimizer group (with pipeline or
     tensor parallelism, one per optimizer group and gradient-norm weight, norm_span.py);
   - stage 3: the gather units are planned (stage3.plan_units, with the units the config's
     granularity threshold and leaf modules choose: stage3_policy.UnitRules); parameters
     are partitioned (trainable ones in a stage-3 group per optimizer group, frozen ones in
     one frozen group that keeps no optimizer state; all sharded per unit) except those kept
     whole by the persistence thresholds (stage3_policy.kept_whole): trainable ones keep their
     optimizer state sharded (a stage-1 group, added last), frozen ones stay as they are; the
     module hooks are attached (Stage3Hooks), and zero.Init's per-parameter shards are adopted
     into the engine's per-unit shards, unit by unit.

The engine then attaches its gradient hooks to each group's parameters and builds the
optimizer over the optimizer groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

import offload

from . import boundary, ds_param, model_dtype, process_groups, stage3, stage3_policy
from . import init as zero_init
from .parallel.data_group import first_rank
from .parallel.norm_span import by_weight


@dataclass
class EngineGroup:
    """One C++ engine group: parameters of one optimizer group (`owner`), at `stage` (3:
    partitioned; 1 at stage 3: the persistent parameters)."""
    owner: int
    params: list[nn.Parameter]
    stage: int


@dataclass
class Sharding:
    groups: list[EngineGroup]
    stage3: stage3.Stage3Hooks | None = None


@dataclass
class GroupBuilder:
    """What every engine group is built from: the C++ engine, the validated config, the
    optimizer spec and the optimizer groups."""
    core: object
    config: object
    spec: object
    optimizer_groups: list[dict]
    alignment: int
    on_swap_write: object = None
    shared: frozenset = frozenset()  # ids of the parameters held under several names (tied)
    # stage 3: hpZ's and MiCS's groups of this rank (process_groups.py)
    stage3_groups: process_groups.Stage3Groups = process_groups.Stage3Groups()

    def options(self, owner: int, stage: int, params: list, data_group=None):
        return boundary.group_options(
            self.config, stage=stage, alignment=self.alignment,
            optimizer_kind=self.spec.kind_of(self.optimizer_groups[owner]),
            sgd_momentum=self.spec.momentum_buffer_needed([self.optimizer_groups[owner]]),
            external_states=(self.spec.external.state_names(self.optimizer_groups[owner])
                             if self.spec.external else ()),
            offload=offload.offload_options(self.config, self.on_swap_write),
            offload_param=(offload.param_offload_options(self.config, self.on_swap_write)
                           if stage == 3 else None),
            shared_params=[i for i, p in enumerate(params) if id(p) in self.shared],
            stage3_groups=self.stage3_groups if stage == 3 else None,
            fp32_optimizer_states=self.spec.fp32_optimizer_states, data_group=data_group)

    def frozen_options(self, params: list, data_group=None):
        # (optimizer group 0's fields are read but unused: a frozen group keeps no state)
        options = self.options(0, 3, params, data_group)
        options.quantized_storage = bool(
            self.config.zero_optimization.zero_quantized_nontrainable_weights)
        return options

    def add_flat(self, owner: int, params: list, stage: int, data_group=None) -> EngineGroup:
        # A group is the grain of communication below stage 3: its gradients are reduced in
        # buckets of reduce_bucket_size, its parameters all-gathered after the step.
        self.core.add_group(params, self.options(owner, stage, params, data_group))
        return EngineGroup(owner, params, stage)


def prepare_model(model: nn.Module, device: torch.device, dtype: torch.dtype,
                  buffer_dtype: torch.dtype | None, stage: int, group=None,
                  source=None) -> None:
    """The model in the engine's dtypes (model_dtype.cast) on the device, every rank of
    `group` (default the world) starting from the group's first rank's values;
    `source(tensor)` (MoE's experts, moe/engine_layout.py): the (rank, group) a parameter's
    or buffer's values come from instead."""
    model.to(device=device)
    model_dtype.cast(model, dtype, buffer_dtype)
    for param in model.parameters():
        if zero_init.is_partitioned(param):
            zero_init.convert_shard(param, device, dtype)
            if stage < 3:  # built under zero.Init, trained whole
                zero_init.unpartition(param)
    src = 0 if group is None else first_rank(group)
    with torch.no_grad():  # zero.Init's shards were cut from rank 0's values already
        for tensor in list(model.parameters()) + list(model.buffers()):
            if zero_init.is_partitioned(tensor):
                continue
            if source is not None:
                dist.broadcast(tensor.data, *source(tensor))
            else:
                dist.broadcast(tensor.data, src=src, group=group)


def shard_groups(builder: GroupBuilder, model: nn.Module, trainables: list[list],
                 stage: int, device: torch.device, step_counter,
                 norm_weight=None, data_group=None) -> Sharding:
    """Stages 0-2: each optimizer group's parameters are split into engine groups of one
    `norm_weight(param)` (model parallelism, MoE at stage 0: parallel/norm_span.py) and one
    `data_group(param)` (MoE's experts: the group they shard over, moe/engine_layout.py)."""
    def key(param):
        return (norm_weight(param) if norm_weight else None,
                data_group(param) if data_group else None)

    if stage < 3:
        return Sharding([builder.add_flat(owner, part, stage, data_group=key(part[0])[1])
                         for owner, params in enumerate(trainables)
                         for part in by_weight(params, key)])
    return _shard_stage3(builder, model, trainables, device, step_counter, key)


def _shard_stage3(builder: GroupBuilder, model: nn.Module, trainables: list[list],
                  device: torch.device, step_counter, key) -> Sharding:
    """`key(param)`: (norm weight, data group); the groups' parameters split by it (MoE's
    experts shard over their expert data-parallel group)."""
    zero_cfg = builder.config.zero_optimization
    rule_units = stage3_policy.UnitRules.from_config(zero_cfg).units(model)
    plan = stage3.plan_units(model, rule_units)
    stage3.mark_leaf_modules(model, rule_units)
    partitioned = _partitioned(model, trainables, int(zero_cfg.stage3_param_persistence_threshold),
                               int(zero_cfg.stage3_model_persistence_threshold))
    trainable = {id(p) for params in trainables for p in params}
    whole_shapes = {id(p): zero_init.full_shape(p) for p in model.parameters()}
    # zero.Init partitioned everything large; what the engine keeps whole (small parameters)
    # is gathered back once, in the same order on every rank.
    if builder.stage3_groups.mics_shard and any(zero_init.is_partitioned(p)
                                                for p in model.parameters()):
        raise NotImplementedError(
            f"zero: {process_groups.MICS_KEY} with a model built under zero.Init: zero.Init "
            "partitions over every rank, MiCS within a shard group; build the model without "
            "zero.Init, or leave mics_shard_size at -1")
    for param in model.parameters():
        if zero_init.is_partitioned(param) and id(param) not in partitioned:
            zero_init.unpartition(param)
    groups: list[EngineGroup] = []
    placement: dict[int, list[stage3.UnitPart]] = {}  # model unit -> its groups' pieces
    for owner, params in enumerate(trainables):
        for mine in by_weight([p for p in params if id(p) in partitioned], key):
            _add_stage3_group(builder, plan, owner, mine, placement, key(mine[0])[1])
            groups.append(EngineGroup(owner, mine, 3))
    frozen = [p for ident, p in partitioned.items() if ident not in trainable]
    if frozen and zero_cfg.zero_quantized_nontrainable_weights:
        _check_quantizable(frozen, names_by_id(model))
    for part in by_weight(frozen, key):
        _add_stage3_group(builder, plan, None, part, placement, key(part[0])[1])
    # Small parameters: whole on every rank, optimizer state sharded (a stage-1 group).
    # Added after the partitioned groups: the default launch order (before the first
    # backward teaches one) follows the groups, and these complete last in backward.
    for owner, params in enumerate(trainables):
        for persistent in by_weight([p for p in params if id(p) not in partitioned], key):
            groups.append(builder.add_flat(owner, persistent, stage=1,
                                           data_group=key(persistent[0])[1]))
    builder.core.configure_schedule([name for name, _ in plan.modules],
                                    boundary.schedule_options(builder.config, device))
    hooks = stage3.Stage3Hooks(builder.core, plan, placement, step_counter=step_counter,
                               partitioned=partitioned, param_names=names_by_id(model),
                               full_shapes=whole_shapes)
    _adopt_init_shards(hooks)
    for param in model.parameters():  # DeepSpeed's ds_* attributes (zero/ds_param.py)
        ds_param.mark(param, whole_shapes[id(param)], persist=id(param) not in partitioned)
    stage3.add_ds_external_parameters(model)
    return Sharding(groups, hooks)


def _partitioned(model: nn.Module, trainables: list[list], param_threshold: int,
                 model_threshold: int) -> dict[int, nn.Parameter]:
    """id -> parameter of the parameters stage 3 partitions: the trainable ones (in
    optimizer-group order), then the frozen ones (model order); all but those kept whole,
    decided over both in model order as DeepSpeed does."""
    trainable = {id(p): p for params in trainables for p in params}
    frozen = {id(p): p for p in model.parameters() if id(p) not in trainable and _frozen_float(p)}
    ordered = [p for p in model.parameters() if id(p) in trainable or id(p) in frozen]
    seen = {id(p) for p in ordered}
    ordered += [p for key, p in trainable.items() if key not in seen]  # not in the model
    whole = stage3_policy.kept_whole([zero_init.full_numel(p) for p in ordered],
                                     param_threshold, model_threshold)
    kept = {id(p) for p, keep in zip(ordered, whole) if keep}
    return {key: p for key, p in {**trainable, **frozen}.items() if key not in kept}


def _frozen_float(param) -> bool:
    """A frozen parameter stage 3 may partition: floating point (the training dtype by now),
    not empty. Integer ones (bitsandbytes' int8 / 4-bit codes) stay the model's, whole."""
    return not param.requires_grad and param.is_floating_point() and \
        bool(zero_init.full_numel(param))


def _check_quantizable(params: list, names: dict) -> None:
    """zero_quantized_nontrainable_weights re-codes the frozen values as int8: a parameter of
    a class of its own (bitsandbytes' Params4bit stored in bf16) holds codes already; zero's
    own (a parameter zero.Init built) holds plain values."""
    odd = [(names[id(p)][0], type(p).__name__) for p in params
           if type(p) not in (torch.nn.Parameter, torch.Tensor, ds_param.ZeroParameter)]
    if odd:
        raise ValueError(
            f"zero: zero_optimization.zero_quantized_nontrainable_weights would quantize "
            f"{odd[0][0]} ({odd[0][1]}), whose values are already a quantized code; set "
            "zero_quantized_nontrainable_weights to false for this model")


def _add_stage3_group(builder: GroupBuilder, plan, owner: int | None, params: list,
                      placement: dict, data_group=None) -> None:
    """One stage-3 group: its parameters sharded per gather unit (the group-local units are
    the model units its parameters belong to, in model order). owner None: the frozen
    parameters' group. `data_group`: the group it shards over (MoE's experts)."""
    model_units = sorted({plan.unit_of_param[id(p)] for p in params})
    local = {unit: i for i, unit in enumerate(model_units)}
    args = (params, [local[plan.unit_of_param[id(p)]] for p in params],
            [zero_init.shard_shape(p) for p in params])
    if owner is None:
        index = builder.core.add_frozen_stage3_group(*args,
                                                     builder.frozen_options(params, data_group))
    else:
        index = builder.core.add_stage3_group(*args, builder.options(owner, 3, params,
                                                                     data_group))
    for unit in model_units:
        placement.setdefault(unit, []).append(stage3.UnitPart(index, local[unit],
                                                              frozen=owner is None))


def _adopt_init_shards(hooks: stage3.Stage3Hooks) -> None:
    """Moves zero.Init's per-parameter shards into the engine's per-unit shards, one unit
    at a time: gather the unit (its zero.Init parameters read as zeros), write their full
    values, keep this rank's piece, release."""
    pending = [p for p in hooks.partitioned.values() if zero_init.is_partitioned(p)]
    for unit in hooks.units_of(pending):
        hooks.hold(unit)
        with torch.no_grad():
            for param, _names in hooks.unit_params(unit):
                if zero_init.is_partitioned(param):
                    param.data.copy_(zero_init.gather_full(param))
            hooks.commit(unit)
        hooks.unhold(unit)
    for param in pending:
        zero_init.release_shard(param)


def full_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """Every state-dict name's whole shape (a zero.Init parameter's, not its shard's), taken
    before the engine partitions anything."""
    shapes = {name: zero_init.full_shape(param)
              for name, param in model.named_parameters(remove_duplicate=False)}
    shapes.update((name, buffer.shape) for name, buffer in model.named_buffers())
    return shapes


def shared_parameters(model: nn.Module) -> frozenset:
    """Ids of the parameters the model holds under more than one name (tied weights)."""
    return frozenset(key for key, names in names_by_id(model).items() if len(names) > 1)


def frozen_names(model: nn.Module) -> set[str]:
    """Every name of the model's frozen (requires_grad False) parameters, a tied one's all."""
    return {name for name, param in model.named_parameters(remove_duplicate=False)
            if not param.requires_grad}


def names_by_id(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> its names in the model (tied parameters have several), in order."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return names
