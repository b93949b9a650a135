"""Stages 0-2 as the engine builds them: every group one flat buffer cut into units of
reduce_bucket_size (stage 0 laid out for one rank). Also stage 3 described without gather
units: the paper's formula on those padded numbers, not checked against the engine."""
from __future__ import annotations

from .categories import (WHERE, bucket_pieces, category_row, gradient_location, kind_symbol,
                         master_bytes, merged_row, split_partial, term)
from .layout import bucket_peak_numel, layouts
from .options import Option
from .params_on_nvme import param_placement, param_row_on_nvme
from .result import Estimate
from .shapes import ModelShapes
from .staging import staging_row
from .training_setup import Setup, optimizer_state_bytes


def estimate_stages_0_2(shapes: ModelShapes, setup: Setup, option: Option,
                        reduce_bucket_size: int | None, overlap_comm: bool | None) -> Estimate:
    stage = option.stage
    b = setup.param_bytes
    n = 1 if stage == 0 else setup.world_size
    group_layouts = layouts(shapes, setup, stage, reduce_bucket_size)
    psi = sum(layout.full_numel for layout in group_layouts)
    shard = sum(layout.shard_numel for layout in group_layouts)
    largest_unit = max(layout.max_unit_numel for layout in group_layouts)
    overlap = setup.overlap_for(stage) if overlap_comm is None else overlap_comm
    slots = 2 if overlap else 1
    sharded_grads = stage >= 3 or setup.grads_sharded(stage)

    def row(coefficient: int, sharded: bool, location: str = "device") -> dict:
        return category_row(coefficient * (shard if sharded else psi),
                            term(coefficient, sharded), location)

    opt_location = WHERE[option.offload_optimizer]
    params = None
    if option.offload_param == "nvme":  # stage 3 without units: the layout's units stand in
        params = param_placement(setup, [[(f"unit {u}", layout.unit(u).shard_numel)
                                          for u in range(layout.unit_count)]
                                         for layout in group_layouts])
    categories = {
        "param": (row(b, stage >= 3, WHERE[option.offload_param]) if params is None
                  else param_row_on_nvme(params, b)),
        "gradient": row(setup.grad_bytes, sharded_grads, gradient_location(setup, option)),
        "fp32_master": row(master_bytes(setup, option), stage >= 1, opt_location),
        "optimizer_state": _optimizer_row(group_layouts, shapes.group_kinds, setup, option,
                                          opt_location),
    }
    categories["bucket"] = _bucket_row(group_layouts, setup, option, slots, sharded_grads)
    gathered = 2 * largest_unit * b if stage >= 3 else 0
    categories["gathered_param"] = category_row(gathered,
                                                f"2·U·{b} (unit in use + one prefetched)")
    # stage 3 without units (a formula): two units' shard pieces in flight
    device_staging = 2 * (largest_unit // n) * b if option.offload_param != "none" else 0
    group_shards = [layout.shard_numel for layout in group_layouts]
    split_partial(categories, setup, option, group_shards)
    categories["staging"], offload = staging_row(
        setup, option, group_shards, device_staging,
        f"2·(U/N)·{b} (two units' shard pieces in flight)", params)
    return Estimate(
        option=option, setup=setup, categories=categories, numel=psi, shard_numel=shard,
        max_unit_numel=largest_unit, unit_count=sum(l.unit_count for l in group_layouts),
        groups=[{"numel": l.full_numel, "shard_numel": l.shard_numel,
                 "max_unit_numel": l.max_unit_numel, "unit_count": l.unit_count}
                for l in group_layouts], exact_units=False, offload=offload)


def _optimizer_row(group_layouts, kinds, setup: Setup, option: Option, location: str) -> dict:
    """The optimizer's arrays of every group (sharded at stages 1-2), by the group's update
    where the groups differ (`kinds`: Muon's keep one array, its Adam's two; None: the
    setup's optimizer for all)."""
    sharded = option.stage >= 1
    numel = [layout.shard_numel if sharded else layout.full_numel for layout in group_layouts]
    kinds = kinds or (None,) * len(group_layouts)
    rows = []
    for kind in dict.fromkeys(kinds):
        coefficient = optimizer_state_bytes(setup, option, kind)
        value = coefficient * sum(n for n, k in zip(numel, kinds) if k == kind)
        rows.append(category_row(value, term(coefficient, sharded, kind_symbol(kind)), location))
    return merged_row(rows)


def _bucket_row(group_layouts, setup: Setup, option: Option, slots: int,
                sharded_grads: bool) -> dict:
    """GradReducer: per group, the backward's peak of `slots` neighbouring units' buckets, in
    the communication dtype; none is kept between steps. With sharded gradients each a full
    unit (+ its 1/N piece unless it is reduced straight into the shard); at stage 1 otherwise
    the piece alone (the unit is reduce-scattered out of the gradients), and at stage 0 none
    (all-reduced in place), but for the copy of the unit a communication dtype other than
    the gradients' reduces (+ stage 1's piece)."""
    stage, bc, converts = option.stage, setup.comm_bytes, setup.comm_converts
    if sharded_grads:
        whole, pieces = True, bucket_pieces(setup, option)
    else:  # the gradients' own buffer is reduced, through a copy when it converts
        whole, pieces = converts, stage >= 1
    numel = 0 if not (whole or pieces) else sum(
        bucket_peak_numel(layout, slots, whole_units=whole, pieces=pieces)
        for layout in group_layouts)
    sum_text = "Σ groups " if len(group_layouts) > 1 else ""
    unit_text = {(True, True): "(U + U/N)", (True, False): "U", (False, True): "U/N"}
    formula = f"{sum_text}{slots}·{unit_text[(whole, pieces)]}·{bc}" if numel else "0"
    return category_row(numel * bc, formula)
