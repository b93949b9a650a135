"""The stage-3 estimate from the model's gather units: one function per category (model
states, buckets, the gathered working set, staging) and the stage-3 detail."""
from __future__ import annotations

from typing import Optional

from .categories import (WHERE, bucket_pieces, category_row, gradient_location, kind_symbol,
                         master_bytes, merged_row, split_partial, term)
from .gather_schedule import WorkingSet, describe_live, short_count, simulate_stage3_schedule
from .layout import Stage3Layout, bucket_peak_numel, stage3_layout
from .options import Option
from .params_on_nvme import ParamPlacement, param_placement, param_row_on_nvme
from .result import Estimate
from .shapes import ModelShapes
from .staging import staging_row
from .training_setup import Setup, optimizer_state_bytes


def estimate_stage3(shapes: ModelShapes, setup: Setup, option: Option,
                    reduce_bucket_size: int | None, overlap_comm: bool | None) -> Estimate:
    """Stage 3 as the engine builds it: partitioned units (Ψ, every byte / N), the persistent
    stage-1 group (Ψp), reduce-scatter buckets per partitioned group, the working set of the
    gather schedule, and offload (master + optimizer state of both groups; the partitioned
    parameter shard with offload_param, the persistent parameters staying on the device)."""
    layout = stage3_layout(shapes, setup, reduce_bucket_size)
    overlap = setup.overlap_for(3) if overlap_comm is None else overlap_comm
    params = _param_placement(shapes, setup, option, layout)
    categories = _model_states(layout, setup, option, params)
    categories["bucket"], persistent_buckets, group_rows = _buckets(
        layout, setup, overlap, bucket_pieces(setup, option))
    work = simulate_stage3_schedule(layout.unit_numel, setup.prefetch_bucket_size,
                                    setup.max_live_parameters, setup.max_reuse_distance,
                                    setup.max_inflight_gathers, shapes.externals,
                                    _parents(shapes, len(layout.unit_numel)))
    categories["gathered_param"] = _gathered_param(work, shapes, setup,
                                                   layout.numel + layout.frozen_numel,
                                                   sum(layout.unit_numel))
    group_shards = [sum(r[2] for r in rows) for rows in layout.group_units] + \
        [group.shard_numel for group in layout.persistent]
    split_partial(categories, setup, option, group_shards)
    categories["staging"], offload = _staging(shapes, setup, option,
                                              layout.numel + layout.frozen_numel, work,
                                              group_shards, params)
    detail = _detail(shapes, setup, layout, work, persistent_buckets, overlap, params)
    largest_unit = max((numel for rows in layout.group_units + [layout.frozen_units]
                        for _, numel, _ in rows), default=0)
    return Estimate(option=option, setup=setup, categories=categories, numel=layout.numel,
                    shard_numel=layout.shard_numel, max_unit_numel=largest_unit,
                    unit_count=len(detail["units"]), groups=group_rows,
                    exact_units=shapes.exact, persistent_numel=layout.persistent_numel,
                    persistent_shard_numel=layout.persistent_shard_numel,
                    frozen_numel=layout.frozen_numel, stage3=detail,
                    offload=offload)


def _param_placement(shapes: ModelShapes, setup: Setup, option: Option,
                     layout: Stage3Layout) -> Optional[ParamPlacement]:
    """offload_param "nvme": the partitioned groups' units (the frozen group's last), in the
    engine's order."""
    if option.offload_param != "nvme":
        return None
    names = list(shapes.unit_names) + [""] * len(layout.unit_numel)
    groups = layout.group_units + ([layout.frozen_units] if layout.frozen_units else [])
    return param_placement(setup, [[(names[unit] or "<root>", shard)
                                     for unit, _, shard in rows]
                                    for rows in groups])


def _parents(shapes: ModelShapes, unit_count: int) -> tuple[int, ...]:
    """Each unit's enclosing unit, one per unit of the layout (none known: all at the top)."""
    parents = tuple(shapes.unit_parents)
    return parents + (0,) * (unit_count - len(parents)) if parents else ()


def _model_state_row(layout: Stage3Layout, coefficient: int, persistent_sharded: bool,
                     location: str = "device", persistent_location: str | None = None,
                     persistent_coefficient: int | None = None, symbol: str = "Ψ") -> dict:
    """A model-state row: `coefficient` bytes per element of the partitioned shard (Ψ/N) at
    `location`, plus the persistent parameters' bytes (Ψp, or Ψp/N when sharded) at
    `persistent_location` (default: the same); `symbol` names the elements in the formula."""
    psi, shard = layout.numel, layout.shard_numel
    psi_p, shard_p = layout.persistent_numel, layout.persistent_shard_numel
    persistent_location = persistent_location or location
    persistent_coefficient = coefficient if persistent_coefficient is None \
        else persistent_coefficient
    main = coefficient * shard
    extra = persistent_coefficient * (shard_p if persistent_sharded else psi_p)
    main_term = term(coefficient, True, symbol) if psi else "0"
    extra_term = term(persistent_coefficient, persistent_sharded, symbol + "p") if psi_p else "0"
    terms = [t for t in (main_term, extra_term) if t != "0"]
    by_location = {location: main}
    by_location[persistent_location] = by_location.get(persistent_location, 0) + extra
    out = {"bytes": main + extra, "persistent_bytes": extra,
           "formula": " + ".join(terms) or "0", "location": location,
           "by_location": by_location}
    if persistent_location != location and main and extra:
        out["formula_by_location"] = {location: main_term, persistent_location: extra_term}
        out["location"] = max(by_location, key=lambda where: by_location[where])
    elif not main and extra:
        out["location"] = persistent_location
        out["by_location"] = {persistent_location: extra}
    return out


def _model_states(layout: Stage3Layout, setup: Setup, option: Option,
                  params: Optional[ParamPlacement]) -> dict:
    """param, gradient, fp32_master and optimizer_state rows."""
    b = setup.param_bytes
    opt_location = WHERE[option.offload_optimizer]
    return {
        # the persistent parameters stay whole (a stage-1 group: whole params and gradients,
        # sharded master and optimizer state) and on the device: offload_param moves the
        # partitioned shards only (the frozen group's too, counted in `params` on NVMe)
        "param": (_with_frozen(_model_state_row(layout, b, False, WHERE[option.offload_param],
                                                "device"),
                               layout, setup, WHERE[option.offload_param])
                  if params is None else
                  param_row_on_nvme(params, b, b * layout.persistent_numel,
                                    term(b, False, "Ψp"))),
        "gradient": _model_state_row(layout, setup.grad_bytes, False,
                                     gradient_location(setup, option),
                                     "device"),
        # with the parameter shard on the host, the partitioned group keeps its own master
        # (also in fp32) for a device-side step; the persistent group does not need one
        "fp32_master": _model_state_row(
            layout, setup.master_dtype_bytes if option.offload_param != "none"
            else master_bytes(setup, option),
            True, opt_location, persistent_coefficient=master_bytes(setup, option)),
        "optimizer_state": _optimizer_row(layout, setup, option, opt_location),
    }


def _optimizer_row(layout: Stage3Layout, setup: Setup, option: Option, location: str) -> dict:
    """The optimizer's arrays (sharded, the persistent group's too), by each group's update
    where the groups differ (Muon's keep one array, its Adam's two)."""
    kinds = dict.fromkeys(layout.group_kinds + layout.persistent_kinds) or [None]
    return merged_row([_model_state_row(layout.only(kind),
                                        optimizer_state_bytes(setup, option, kind), True,
                                        location, symbol=kind_symbol(kind))
                       for kind in kinds])


def _with_frozen(row: dict, layout: Stage3Layout, setup: Setup, location: str) -> dict:
    """The param row plus the frozen group's shard at the partitioned shard's `location`:
    b·Ψf/N, or with zero_quantized_nontrainable_weights its int8 code (quantized_bytes of each
    unit's piece: about 1·Ψf/N)."""
    from zero import _C

    if setup.quantized_nontrainable:
        extra = sum(_C.quantized_bytes(shard) for _, _, shard in layout.frozen_units)
        frozen_term = "1Ψf/N (int8 + fp32 scale per 256)"
    else:
        extra = setup.param_bytes * layout.frozen_shard_numel
        frozen_term = term(setup.param_bytes, True, "Ψf")
    if not extra:
        return row
    if not row["bytes"]:
        return {**row, "bytes": extra, "formula": frozen_term, "location": location,
                "by_location": {location: extra}}
    by_location = {where: value for where, value in row["by_location"].items() if value}
    by_location[location] = by_location.get(location, 0) + extra
    out = {**row, "bytes": row["bytes"] + extra, "by_location": by_location,
           "formula": f"{row['formula']} + {frozen_term}"}
    if len(by_location) > 1:
        texts = dict(row.get("formula_by_location") or {row["location"]: row["formula"]})
        texts[location] = f"{texts[location]} + {frozen_term}" if location in texts \
            else frozen_term
        out["formula_by_location"] = texts
        out["location"] = max(by_location, key=by_location.get)
    return out


def _buckets(layout: Stage3Layout, setup: Setup, overlap: bool, pieces: bool
             ) -> tuple[dict, int, list[dict]]:
    """(the bucket row, the persistent group's part of it, the per-group rows).

    One GradReducer per partitioned group, its buckets made per unit (grad_reducer.h): a
    unit's bucket (its numel, + numel/N elements when `pieces`: categories.bucket_pieces)
    exists from its first gradient
    to the end of its reduce-scatter, and none is kept between steps. At most `slots` of them
    live at once (two with overlap_comm: one on the wire while the next fills), and the two
    largest units do meet: the root unit's bucket fills from its first gradient to its last
    (the embeddings, at the end of backward) while a block's is on the wire. With one slot
    and the root's parameters used after the blocks (final norm, untied head: its bucket
    fills over the whole backward) the pool grows to two for the backward. The persistent
    (stage-1) group's reducer adds, in backward only, the Up/N pieces of its `slots`
    neighbouring units that hold the most (layout.bucket_peak_numel), and the whole units too
    when a communication dtype other than the gradients' reduces copies of them. Buckets are
    in the communication dtype."""
    b = setup.comm_bytes
    n3 = setup.partition_world  # the partitioned groups' ranks (MiCS: the shard group)
    slots = 2 if overlap else 1
    bucket_bytes = persistent_bytes = 0
    group_rows, grown = [], False
    for rows, root_early in zip(layout.group_units, layout.root_early_grads):
        blocks = sum(1 for unit, _, _ in rows if unit != 0)
        filling = 1 + (1 if root_early and blocks and any(u == 0 for u, _, _ in rows) else 0)
        live = max(min(slots, len(rows)), min(filling, len(rows)))
        grown = grown or live > min(slots, len(rows))
        bucket_bytes += _live_bucket_numel(rows, n3, live, filling == 2, pieces) * b
        group_rows.append({"numel": sum(r[1] for r in rows), "shard_numel": sum(r[2] for r in rows),
                           "max_unit_numel": max(r[1] for r in rows), "unit_count": len(rows),
                           "block_units": blocks, "buckets_peak": live})
    converts = setup.comm_converts
    for group in layout.persistent:  # a stage-1 group: piece-sized buckets in backward
        persistent_bytes += bucket_peak_numel(group, slots, whole_units=converts) * b
    bucket_bytes += persistent_bytes
    sum_text = "Σ groups " if len(layout.group_units) > 1 else ""
    if not layout.numel:
        bucket_formula = "0"
    elif grown or (slots == 2 and any(len(rows) > 1 for rows in layout.group_units)):
        two = "U1 + U1/N + U2 + U2/N" if pieces else "U1 + U2"  # two units' buckets at once
        bucket_formula = f"{sum_text}({two})·{b}"
    else:
        bucket_formula = f"{sum_text}({'U + U/N' if pieces else 'U'})·{b}"
    if layout.persistent:
        bucket_formula += f" + {slots}·{'(Up + Up/N)' if converts else 'Up/N'}·{b}"
    return category_row(bucket_bytes, bucket_formula), persistent_bytes, group_rows


def _live_bucket_numel(rows: list, n: int, live: int, root_early: bool, pieces: bool) -> int:
    """The most bucket elements one group's backward holds at once: `live` buckets (1 or 2)
    of U each, + U/N with `pieces`. The root's bucket, filling over the whole backward when
    its first gradient comes early, lives beside the largest block's; otherwise buckets live
    in backward order (the blocks last to first, then the root), neighbours together."""
    size = {unit: numel + (numel // n if pieces else 0) for unit, numel, _ in rows}
    blocks = [size[unit] for unit in sorted(size) if unit != 0]
    if live == 1:
        return max(size.values())
    if root_early:
        return size[0] + max(blocks)
    order = blocks[::-1] + ([size[0]] if 0 in size else [])
    return max(a + b for a, b in zip(order, order[1:]))


def _gathered_param(work: WorkingSet, shapes: ModelShapes, setup: Setup, psi: int,
                    every_unit: int) -> dict:
    """W·b: the most elements the replayed gather schedule holds gathered at once; with hpZ
    plus every unit's secondary copy, Ψ/H·b (all of them held from forward to the step). The
    hybrid engine's generate holds `every_unit` elements (all units, padded) at once."""
    b = setup.param_bytes
    bounds = (f"prefetch ≤ {short_count(setup.prefetch_bucket_size)}, reuse < "
              f"{short_count(setup.max_reuse_distance)}, "
              f"live ≤ {short_count(setup.max_live_parameters)}")
    formula = (f"W·{b} (W = {work.peak_numel:,}: "
               f"{describe_live(work.live_at_peak, shapes.unit_names)} gathered at once; "
               f"{bounds})") if psi else "0"
    peak = work.peak_numel
    if setup.hybrid_generate and psi and every_unit > peak:
        peak = every_unit
        formula = (f"Ψ·{b} (every unit, {every_unit:,} elements: the hybrid engine's generate "
                   f"holds them at once; training alone holds {work.peak_numel:,})")
    secondary = psi // setup.hpz_world * b if setup.hpz_world and psi else 0
    if secondary:
        formula += f" + Ψ/{setup.hpz_world}·{b} (hpZ's secondary copies)"
    return category_row(peak * b + secondary, formula)


def _staging(shapes: ModelShapes, setup: Setup, option: Option, psi: int, work: WorkingSet,
             group_shards: list[int], params: Optional[ParamPlacement]
             ) -> tuple[dict, Optional[dict]]:
    """The staging row: the host's (staging_row) and, with offload_param, the device's."""
    b = setup.param_bytes
    # offload_param: every gather copies the unit's shard piece (numel / N, every unit padded
    # to a multiple of N) into a device buffer held until its all-gather completes
    inflight_shard = work.peak_inflight_numel // setup.partition_world
    device_staging = inflight_shard * b if option.offload_param != "none" and psi else 0
    return staging_row(
        setup, option, group_shards, device_staging,
        f"P·{b} (P = {inflight_shard:,}: the shard pieces of "
        f"{describe_live(work.inflight_at_peak, shapes.unit_names)} in flight at once)", params)


def _detail(shapes: ModelShapes, setup: Setup, layout: Stage3Layout, work: WorkingSet,
            persistent_buckets: int, overlap: bool, params: Optional[ParamPlacement]) -> dict:
    """Estimate.stage3: the units, the working set, the bounds and what the engine raises."""
    partitioned_units = [u for u, numel in enumerate(layout.unit_numel) if numel]
    names = list(shapes.unit_names) + [""] * len(layout.unit_numel)
    return {
        "units": [{"unit": u, "name": names[u] or "<root>", "numel": layout.unit_numel[u]}
                  for u in partitioned_units],
        "persistent_tensors": layout.persistent_count,
        "persistent_units": sum(group.unit_count for group in layout.persistent),
        "working_set": {"peak_numel": work.peak_numel,
                        "live_at_peak": [names[u] or "<root>" for u in work.live_at_peak],
                        "live_at_peak_text": describe_live(work.live_at_peak, names),
                        "first_micro_step_peak_numel": work.first_peak_numel,
                        "gathers_per_micro_step": work.gathers,
                        "gathered_numel_per_micro_step": work.gathered_numel,
                        "prefetches_per_micro_step": work.prefetches,
                        "reuses_per_micro_step": work.reuses,
                        "peak_inflight_numel": work.peak_inflight_numel,
                        "inflight_at_peak": [names[u] or "<root>"
                                             for u in work.inflight_at_peak]},
        "bounds": setup.stage3_dict(),
        "overlap_comm": overlap,
        # the persistent (stage-1) group's piece buckets, part of the bucket row
        "persistent_bucket_bytes": persistent_buckets,
        # what the engine raises: parameters on NVMe that do not fit its buffers (offload detail)
        "error": params.error if params else "",
    }
