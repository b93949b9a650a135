"""The model as the estimate sees it: trainable parameter shapes per optimizer group and, for
stage 3, every shape's gather unit; from a module (exact) or from a parameter count (assumed)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

import torch

from zero.moe.groups import group_name

from .errors import EstimateError
from .training_setup import DEFAULT_REDUCE_BUCKET_SIZE

# --params without --units: at most this many assumed stage-3 gather units.
MAX_ASSUMED_UNITS = 1024


@dataclass(frozen=True)
class ModelShapes:
    """Trainable parameter shapes per optimizer group (engine order), and what is frozen."""
    groups: tuple[tuple[tuple[int, ...], ...], ...]
    description: str
    exact: bool = True            # False: --params N, shapes are a stand-in (see shapes_from_count)
    frozen_numel: int = 0          # requires_grad=False: no gradients or optimizer state
    note: str = ""
    # Stage 3: the gather unit (zero.stage3.plan_units; 0 is the root) of every shape above,
    # nested like `groups`; None when unknown (stage 3 is then a formula only).
    units: Optional[tuple[tuple[int, ...], ...]] = None
    unit_names: tuple[str, ...] = ()          # per unit index ("" is the root)
    unit_parents: tuple[int, ...] = ()        # per unit: its enclosing unit (UnitPlan.parents)
    # (user unit, owner unit) per register_external_parameter link
    externals: tuple[tuple[int, int], ...] = ()
    # Stage 3, per shape (nested like `groups`): a root-unit parameter registered after the
    # first parameter of another unit (a final norm, an untied head): in a sequential model
    # it is used after the blocks, so its gradient arrives at the start of backward.
    root_late: Optional[tuple[tuple[bool, ...], ...]] = None
    # Per shape (nested like `groups`): its place in module.parameters(), the order in which
    # stage 3 decides what stays whole (stage3_policy.kept_whole); None: the groups' order.
    order: Optional[tuple[tuple[int, ...], ...]] = None
    # the config's unit rules the units above were planned with (stage3_policy.UnitRules;
    # None: not planned from a model)
    unit_rules: object = None
    # Stage 3's frozen parameters (partitioned with their units, no optimizer state): each
    # one's shape, gather unit and place in module.parameters(), in model order
    frozen: tuple[tuple[tuple[int, ...], int, int], ...] = ()
    # Per shape (nested like `groups`): whether optimizer Muon steps it (zero.muon.is_muon, by
    # its name and shape; None: names unknown). `group_kinds`: each group's update once split
    # into Muon's and Adam's halves (for_muon); None: the setup's optimizer for every group.
    muon: Optional[tuple[tuple[bool, ...], ...]] = None
    group_kinds: Optional[tuple[str, ...]] = None
    # Per group: the expert-parallel size its parameters are split over (MoE's experts, in
    # groups of their own as the engine splits them: their states shard over world / ep_size
    # ranks); None: 1 for every group.
    group_ep: Optional[tuple[int, ...]] = None
    frozen_ep: Optional[tuple[int, ...]] = None  # the same per frozen shape (None: all 1)

    @property
    def trainable_numel(self) -> int:
        return sum(shape_numel(shape) for group in self.groups for shape in group)

    @property
    def largest_param_numel(self) -> int:
        return max((shape_numel(shape) for group in self.groups for shape in group), default=0)

    @property
    def tensor_count(self) -> int:
        return sum(len(group) for group in self.groups)

    @property
    def has_units(self) -> bool:
        return self.units is not None


def shape_numel(shape: Sequence[int]) -> int:
    out = 1
    for dim in shape:
        out *= max(int(dim), 0)
    return out


def shapes_from_module(module: torch.nn.Module, description: str | None = None,
                       param_groups: Iterable | None = None,
                       local_shape: Mapping[int, tuple[int, ...]] | None = None,
                       unit_rules=None, expert_parallel=None) -> ModelShapes:
    """The shapes the engine will manage: trainable parameters in `module.parameters()` order
    (tied parameters once), one group, as `zero.initialize(model=..., config=...)` does with a
    config optimizer. `param_groups` (a list of lists of parameters, or of dicts with
    "params") mirrors a client optimizer's groups instead. Stage 3: every shape's gather unit
    from `zero.stage3.plan_units` (the engine's rule), the units' names, the
    register_external_parameter links, and which root parameters come after the blocks;
    `unit_rules` (stage3_policy.UnitRules, default DeepSpeed's): the config's units too.
    `local_shape`: {id(parameter): shape} of the parameters a rank holds a slice of (tensor
    parallelism: zero.tp.auto_tp.local_shapes). `expert_parallel` (the config's block, AutoEP
    on): each MoE block's stacked experts as one rank holds them, in a group of their own."""
    if expert_parallel is None:
        return _shapes_from_module(module, description, param_groups, local_shape, unit_rules)
    rows = _autoep_rows(module, expert_parallel)
    try:  # the experts marked as the engine marks them while their groups are split off
        for param in rows.values():
            param.allreduce, param.group_name = False, group_name(expert_parallel.autoep_size)
        return _shapes_from_module(
            module, description, param_groups,
            {**(local_shape or {}), **{key: _rows_of(param, expert_parallel)
                                       for key, param in rows.items()}},
            unit_rules, {group_name(expert_parallel.autoep_size): expert_parallel.autoep_size})
    finally:
        for param in rows.values():
            del param.allreduce, param.group_name


def _shapes_from_module(module, description, param_groups, local_shape, unit_rules,
                        autoep_sizes=None) -> ModelShapes:
    if not isinstance(module, torch.nn.Module):
        raise EstimateError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if param_groups is None:
        raw_groups = [list(module.parameters())]
    else:
        raw_groups = [list(g["params"]) if isinstance(g, Mapping) else list(g)
                      for g in param_groups]
    raw_groups, raw_ep = _expert_groups(module, raw_groups, autoep_sizes or {})
    from zero import init as zero_init, stage3, stage3_policy

    unit_rules = unit_rules or stage3_policy.UnitRules()
    plan = stage3.plan_units(module, unit_rules.units(module))  # the engine's units
    position = {id(p): i for i, p in enumerate(module.parameters())}  # first registration
    first_block = min((position[id(p)] for p in module.parameters()
                       if plan.unit_of_param.get(id(p), 0) != 0), default=len(position))
    from zero.muon import is_muon

    names = {}
    for name, param in module.named_parameters():
        names.setdefault(id(param), name)
    groups, units, late, order, muon, group_ep, seen = [], [], [], [], [], [], set()
    for raw, ep_size in zip(raw_groups, raw_ep or [1] * len(raw_groups)):
        shapes, unit_ids, late_ids, places, muon_ids = [], [], [], [], []
        for param in raw:
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            # a zero.Init parameter: its whole shape, not its empty data's
            shape = (local_shape or {}).get(id(param)) or zero_init.shard_shape(param) or \
                param.shape
            shapes.append(tuple(int(d) for d in shape))
            unit = plan.unit_of_param.get(id(param), 0)
            unit_ids.append(unit)
            late_ids.append(unit == 0 and position.get(id(param), -1) > first_block)
            places.append(position.get(id(param), len(position) + len(seen)))
            muon_ids.append(is_muon(names.get(id(param), ""), zero_init.full_shape(param)))
        if shapes:
            groups.append(tuple(shapes))
            units.append(tuple(unit_ids))
            late.append(tuple(late_ids))
            order.append(tuple(places))
            muon.append(tuple(muon_ids))
            group_ep.append(ep_size)
    if not groups:
        raise EstimateError("the model has no trainable parameters")
    unique = {id(p): p for p in module.parameters()}
    frozen = sum(zero_init.full_numel(p) for p in unique.values() if not p.requires_grad)
    frozen_params = [p for p in unique.values()  # those stage 3 partitions (sharding._frozen_float)
                     if not p.requires_grad and p.is_floating_point() and zero_init.full_numel(p)]
    frozen_shapes = tuple(
        (tuple(int(d) for d in ((local_shape or {}).get(id(p)) or zero_init.shard_shape(p)
                                or p.shape)),
         plan.unit_of_param.get(id(p), 0), position[id(p)])
        for p in frozen_params)
    return ModelShapes(groups=tuple(groups), description=description or type(module).__name__,
                       exact=True, frozen_numel=frozen, units=tuple(units),
                       frozen=frozen_shapes,
                       unit_names=tuple(name for name, _ in plan.modules),
                       unit_parents=tuple(plan.parents),
                       externals=tuple(stage3.external_links(plan)),
                       root_late=tuple(late), order=tuple(order), unit_rules=unit_rules,
                       muon=tuple(muon),
                       group_ep=tuple(group_ep) if raw_ep else None,
                       frozen_ep=_frozen_ep(module, frozen_params, autoep_sizes or {})
                       if raw_ep else None)


def _frozen_ep(module: torch.nn.Module, frozen: list, autoep_sizes: dict[str, int]
               ) -> tuple[int, ...]:
    """Each frozen parameter's expert-parallel size (an MoE expert's; 1 otherwise)."""
    from zero.moe.layer import MoE
    from zero.moe.params import is_moe_param

    sizes = {m.expert_group_name: m.ep_size for m in module.modules() if isinstance(m, MoE)}
    sizes.update(autoep_sizes)
    return tuple(sizes[p.group_name] if is_moe_param(p) else 1 for p in frozen)


def _autoep_rows(module: torch.nn.Module, settings) -> dict[int, torch.nn.Parameter]:
    """{id: parameter} of the stacked experts AutoEP splits (zero.moe.auto_ep)."""
    from zero.moe import auto_ep

    try:
        blocks = auto_ep.moe_blocks(module, settings)
    except ValueError as error:
        raise EstimateError(f"--config: {error}") from None
    return {id(param): param for _, block in blocks
            for param in (block.experts.gate_up_proj, block.experts.down_proj)}


def _rows_of(param, settings) -> tuple[int, ...]:
    """The rows of a stacked expert parameter one rank holds."""
    return (param.shape[0] // settings.autoep_size, *param.shape[1:])


def _expert_groups(module: torch.nn.Module, raw_groups: list[list],
                   autoep_sizes: dict[str, int]) -> tuple[list, list | None]:
    """(groups, each one's ep_size): with MoE layers (or AutoEP's experts, `autoep_sizes`:
    group name -> ep_size) their experts split into groups of their own as the engine splits
    a configured optimizer's (zero.moe.params); else as given, None."""
    from zero.moe.layer import MoE
    from zero.moe.params import split_params_into_different_moe_groups_for_optimizer

    sizes = {m.expert_group_name: m.ep_size for m in module.modules() if isinstance(m, MoE)}
    sizes.update(autoep_sizes)
    if not sizes:
        return raw_groups, None
    split = split_params_into_different_moe_groups_for_optimizer(
        [{"params": params} for params in raw_groups])
    return ([group["params"] for group in split],
            [sizes[group["name"]] if group.get("moe") else 1 for group in split])


def for_muon(shapes: ModelShapes) -> ModelShapes:
    """The shapes as optimizer Muon groups them (zero.muon.param_groups): each group split
    into its Muon half and its Adam half, in that order, each only where it has shapes."""
    if shapes.group_kinds is not None:
        return shapes
    if shapes.group_ep is not None:
        raise EstimateError("optimizer Muon with MoE layers is not built (zero.moe); use Adam")
    if shapes.muon is None:
        raise EstimateError("optimizer Muon steps the parameters of 2 or more dimensions whose "
                            "names have neither \"embed\" nor \"lm_head\": describe the model "
                            "with --model (or shapes_from_module) so the estimate knows them")
    nested = {"groups": shapes.groups, "units": shapes.units, "root_late": shapes.root_late,
              "order": shapes.order}
    split = {key: [] for key, value in nested.items() if value is not None}
    kinds = []
    for g, flags in enumerate(shapes.muon):
        for kind, wanted in (("muon", True), ("adam", False)):
            picks = [i for i, flag in enumerate(flags) if flag is wanted]
            if not picks:
                continue
            kinds.append(kind)
            for key in split:
                split[key].append(tuple(nested[key][g][i] for i in picks))
    muon = tuple((kind == "muon",) * len(group) for kind, group in zip(kinds, split["groups"]))
    return dataclasses.replace(shapes, **{k: tuple(v) for k, v in split.items()}, muon=muon,
                               group_kinds=tuple(kinds))


def shapes_from_count(count: int, tensor_numel: int | None = None,
                      reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE,
                      units: int | None = None) -> ModelShapes:
    """`--params N` without shapes: N elements as ceil(N / T) tensors of T elements (the last
    one smaller), T = tensor_numel or, by default, min(N, reduce_bucket_size), so that the
    largest unit is about reduce_bucket_size, as in a real model whose layers are smaller than
    a bucket.

    Stage 3 needs gather units, which a count does not have. The assumption: without `units`,
    every stand-in tensor is one gather unit (the largest-tensor heuristic: a unit of T
    elements; beyond MAX_ASSUMED_UNITS tensors they are split evenly over that many units, to
    keep the schedule replay quick); with `units=K`, the model is K gather units of equal size (K transformer
    blocks; the tensors are then K tensors of about N/K elements, or, with tensor_numel, the
    T-element tensors split over K units as evenly as they go). The root unit holds nothing.

    What this gets right: every byte count that is a multiple of Ψ, to within the padding
    (at most world_size x alignment - 1 elements per unit). What it cannot know: the real
    unit boundaries and the largest parameter, so the stage-2 bucket and the stage-3 bucket
    and working set are estimates; a model with a parameter larger than reduce_bucket_size
    has larger buckets. Use --model for an exact answer."""
    count = int(count)
    if count < 1:
        raise EstimateError(f"--params must be >= 1, got {count}")
    if units is not None and (int(units) < 1 or int(units) > count):
        raise EstimateError(f"--units must be between 1 and --params ({count:,}), got {units}")
    if units is not None and not tensor_numel:
        k = int(units)
        base, extra = divmod(count, k)
        shapes = [(base + 1,)] * extra + [(base,)] * (k - extra)
        unit_ids = list(range(1, k + 1))
        size = base + bool(extra)
    else:
        size = int(tensor_numel) if tensor_numel else min(count, int(reduce_bucket_size))
        if size < 1:
            raise EstimateError(f"--tensor-numel must be >= 1, got {size}")
        full, rest = divmod(count, size)
        if full + bool(rest) > 200_000:
            raise EstimateError(f"--params {count} as tensors of {size} elements is "
                                f"{full + bool(rest):,} tensors; pass a larger --tensor-numel")
        shapes = [(size,)] * full + ([(rest,)] if rest else [])
        if units is None and len(shapes) <= MAX_ASSUMED_UNITS:
            unit_ids = list(range(1, len(shapes) + 1))
        elif units is None:
            unit_ids = [1 + i * MAX_ASSUMED_UNITS // len(shapes) for i in range(len(shapes))]
        else:
            if int(units) > len(shapes):
                raise EstimateError(f"--units {units}: only {len(shapes)} tensor(s) of "
                                    f"{size:,} elements to split; pass a smaller --tensor-numel")
            unit_ids = [1 + i * int(units) // len(shapes) for i in range(len(shapes))]
    unit_count = max(unit_ids)
    stage3_text = (f"{unit_count} equal gather unit(s) (--units)" if units is not None else
                   "each tensor one gather unit (pass --units K for K equal blocks)"
                   if unit_count == len(shapes) else
                   f"the tensors split evenly over {unit_count} gather units (--units K for K)")
    return ModelShapes(groups=(tuple(shapes),), description=f"{count:,} parameters (--params)",
                       exact=False, units=(tuple(unit_ids),),
                       unit_names=("",) + tuple(f"unit{i}" for i in range(1, unit_count + 1)),
                       note=f"approximate layout: {len(shapes)} tensor(s) of at most {size:,} "
                            f"elements stand in for the real shapes; stage 3: {stage3_text} "
                            "(exact padding, buckets and working set need them: use --model)")
