"""How the engine lays out the parameters: flat sharded groups (stages 0-2) and, at stage 3,
one buffer per gather unit plus a stage-1 group of the persistent parameters."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import EstimateError
from .shapes import ModelShapes, shape_numel
from .training_setup import DTYPE_NAMES, Setup


def layouts(shapes: ModelShapes, setup: Setup, stage: int, reduce_bucket_size: int | None = None):
    """One zero._C.ShardedLayout per group, exactly as the engine builds it (stages 0-2)."""
    from zero import _C

    unit = int(reduce_bucket_size or setup.reduce_bucket_size)
    expert_parallel = shapes.group_ep or (1,) * len(shapes.groups)
    if any(setup.world_size % ep for ep in expert_parallel):
        raise EstimateError(f"the model's MoE layers split their experts over "
                            f"{max(expert_parallel)} ranks, which does not divide the world of "
                            f"{setup.world_size}; estimate at a world size that ep_size divides")
    # an MoE expert group shards over its expert data-parallel group: world / ep_size ranks
    return [_C.ShardedLayout([list(s) for s in group], DTYPE_NAMES[setup.precision],
                             1 if stage == 0 else setup.world_size // ep, setup.alignment, unit)
            for group, ep in zip(shapes.groups, expert_parallel)]


def bucket_peak_numel(layout, slots: int, whole_units: bool, pieces: bool = True) -> int:
    """The most bucket elements a stages 1-2 style reducer (grad_reducer.h) holds at once:
    buckets are made per unit, sized to it, and freed once reduced, so at most `slots`
    neighbours in launch order (the reverse of the layout's) live together: with
    `whole_units` (sharded gradients) the unit itself, plus its 1/N piece when `pieces`
    (categories.bucket_pieces); without, the piece alone (stage 1's reduce-scatter in place)."""
    sizes = [(layout.unit(u).numel if whole_units else 0)
             + (layout.unit(u).shard_numel if pieces or not whole_units else 0)
             for u in range(layout.unit_count)]
    width = max(1, min(slots, len(sizes)))
    return max((sum(sizes[i:i + width]) for i in range(len(sizes) - width + 1)), default=0)


@dataclass
class Stage3Layout:
    """What `zero.sharding.shard_groups` lays out, per optimizer group: the partitioned
    parameters as one buffer per gather unit, the persistent ones as a stage-1 group."""
    unit_numel: list[int]                 # per model unit: padded elements over all groups
    group_units: list[list[tuple[int, int, int]]]  # per group: (model unit, numel, shard numel)
    persistent: list                      # per group with persistent parameters: ShardedLayout
    persistent_count: int                 # persistent tensors
    root_early_grads: list[bool] = field(default_factory=list)  # per partitioned group
    # the frozen group (partitioned frozen parameters): (model unit, numel, shard numel)
    frozen_units: list[tuple[int, int, int]] = field(default_factory=list)
    # each group's update (ModelShapes.group_kinds; None: the setup's optimizer), parallel to
    # group_units and to persistent
    group_kinds: list = field(default_factory=list)
    persistent_kinds: list = field(default_factory=list)

    def only(self, kind: str | None) -> "Stage3Layout":
        """The groups of one kind (their model states), the rest left out."""
        return dataclasses.replace(
            self, group_units=[u for u, k in zip(self.group_units, self.group_kinds) if k == kind],
            persistent=[p for p, k in zip(self.persistent, self.persistent_kinds) if k == kind],
            group_kinds=[kind] * self.group_kinds.count(kind),
            persistent_kinds=[kind] * self.persistent_kinds.count(kind))

    @property
    def numel(self) -> int:
        return sum(numel for units in self.group_units for _, numel, _ in units)

    @property
    def shard_numel(self) -> int:
        return sum(shard for units in self.group_units for _, _, shard in units)

    @property
    def frozen_numel(self) -> int:
        return sum(numel for _, numel, _ in self.frozen_units)

    @property
    def frozen_shard_numel(self) -> int:
        return sum(shard for _, _, shard in self.frozen_units)

    @property
    def persistent_numel(self) -> int:
        return sum(layout.full_numel for layout in self.persistent)

    @property
    def persistent_shard_numel(self) -> int:
        return sum(layout.shard_numel for layout in self.persistent)


def _kept_whole(shapes: ModelShapes, setup: Setup) -> tuple[list[list[bool]], list[bool]]:
    """Per shape (nested like shapes.groups), and per frozen shape: whether stage 3 keeps it
    whole, by the engine's rule (stage3_policy.kept_whole) over both in model order."""
    from zero.stage3_policy import kept_whole

    order = shapes.order
    if order is None:  # the groups' order
        starts = [sum(len(g) for g in shapes.groups[:k]) for k in range(len(shapes.groups))]
        order = tuple(tuple(range(s, s + len(g))) for s, g in zip(starts, shapes.groups))
    frozen = len(shapes.groups)  # the frozen shapes' "group" below
    flat = sorted([(place, g, i) for g, places in enumerate(order)
                   for i, place in enumerate(places)] +
                  [(place, frozen, i) for i, (_, _, place) in enumerate(shapes.frozen)])
    numel = [shape_numel(shapes.frozen[i][0] if g == frozen else shapes.groups[g][i])
             for _, g, i in flat]
    keep = kept_whole(numel, setup.persistence_threshold, setup.model_persistence_threshold)
    whole = [[False] * len(group) for group in shapes.groups] + [[False] * len(shapes.frozen)]
    for (_, g, i), kept in zip(flat, keep):
        whole[g][i] = kept
    return whole[:frozen], whole[frozen]


def stage3_layout(shapes: ModelShapes, setup: Setup,
                  reduce_bucket_size: int | None = None) -> Stage3Layout:
    """The engine's stage-3 layout from the shapes and their gather units: parameters with
    more than `persistence_threshold` elements (or past the model_persistence_threshold
    cap: _kept_whole) go to their unit's buffer (each unit padded to
    a multiple of N x alignment, `zero._C.plan_partition`), the rest to a stage-1 group
    (`ShardedLayout` with reduce_bucket_size units)."""
    from zero import _C

    if shapes.units is None:
        raise EstimateError("stage 3 needs the model's gather units: describe the model with "
                            "--model (or shapes_from_module)")
    dtype = DTYPE_NAMES[setup.precision]
    if shapes.unit_rules is not None and shapes.unit_rules != setup.unit_rules():
        raise EstimateError(
            f"the config chooses stage-3 units by {setup.unit_rules()} "
            "(stage3_module_granularity_threshold, zero_optimization.leaf_module) but the "
            f"model's units were planned by {shapes.unit_rules}; describe the model with "
            "shapes_from_module(..., unit_rules=setup.unit_rules())")
    world = setup.world_size
    whole, frozen_whole = _kept_whole(shapes, setup)
    partition_world = setup.partition_world  # MiCS: the shard group
    rbs = int(reduce_bucket_size or setup.reduce_bucket_size)
    unit_total = max((u for group in shapes.units for u in group), default=0) + 1
    unit_numel = [0] * max(unit_total, len(shapes.unit_names), 1)
    group_units, persistent, persistent_count, root_early = [], [], 0, []
    group_kinds, persistent_kinds = [], []
    late_flags = shapes.root_late or tuple((False,) * len(group) for group in shapes.groups)
    kinds = shapes.group_kinds or (None,) * len(shapes.groups)
    # an MoE expert group shards over its expert data-parallel group (world / ep_size)
    expert_parallel = shapes.group_ep or (1,) * len(shapes.groups)
    for group, units, late, kept, kind, ep in zip(shapes.groups, shapes.units, late_flags, whole,
                                                  kinds, expert_parallel):
        small = [list(shape) for shape, keep in zip(group, kept) if keep]
        large = [(list(shape), unit) for shape, unit, keep in zip(group, units, kept)
                 if not keep]
        if small:
            persistent.append(_C.ShardedLayout(small, dtype, world // ep, setup.alignment, rbs))
            persistent_kinds.append(kind)
            persistent_count += len(small)
        if not large:
            continue
        group_units.append(_unit_rows(large, dtype, partition_world // ep, setup.alignment,
                                      unit_numel))
        group_kinds.append(kind)
        root_early.append(any(flag and not keep for flag, keep in zip(late, kept)))
    # the frozen parameters: a group per expert-parallel size, as the engine splits them
    frozen_ep = shapes.frozen_ep or (1,) * len(shapes.frozen)
    frozen_units = []
    for ep in sorted(set(frozen_ep)):
        frozen = [(list(shape), unit) for (shape, unit, _), keep, size
                  in zip(shapes.frozen, frozen_whole, frozen_ep) if not keep and size == ep]
        if frozen:
            frozen_units += _unit_rows(frozen, dtype, partition_world // ep, setup.alignment,
                                       unit_numel)
    return Stage3Layout(unit_numel=unit_numel, group_units=group_units, persistent=persistent,
                        persistent_count=persistent_count, root_early_grads=root_early,
                        group_kinds=group_kinds, persistent_kinds=persistent_kinds,
                        frozen_units=frozen_units)


def _unit_rows(large: list, dtype, world: int, alignment: int, unit_numel: list[int]
               ) -> list[tuple[int, int, int]]:
    """One stage-3 group of (shape, model unit) pairs: (unit, numel, shard numel) per unit,
    each unit's buffer padded as `zero._C.plan_partition` does; adds to `unit_numel`."""
    from zero import _C

    model_units = sorted({unit for _, unit in large})
    local = {unit: i for i, unit in enumerate(model_units)}
    plan = _C.plan_partition([shape for shape, _ in large], [dtype] * len(large),
                             [local[unit] for _, unit in large], world, alignment)
    rows = []
    for unit in model_units:
        buffer = plan.buffers[local[unit]]
        rows.append((unit, int(buffer.numel), int(buffer.shard_numel)))
        unit_numel[unit] += int(buffer.numel)
    return rows
