"""bench_fsdp2.py's configurations and what their runs reduce to: per configuration the numbers
the report's tables show (summarize), and the interleaved run's step times with the paired
per-round ratios (summarize_interleaved). Every rank's raw data stays in the JSON."""
from __future__ import annotations

import statistics

from benchmarks.timing import p10, slowest_rank, step_stats

ALL_CONFIGS = ["zero3-fp32", "zero3-noreuse-fp32", "zero3pf-fp32", "fsdp2-fp32",
               "zero3-bf16", "zero3-noreuse-bf16", "zero3pf-bf16", "fsdp2-bf16"]
ZERO_KINDS = ("zero3", "zero3-noreuse", "zero3pf")
# zero configurations that set stage3_max_reuse_distance to 0 (the others keep the default)
NO_REUSE_KINDS = ("zero3-noreuse", "zero3pf")
PHASES = ("forward", "backward", "step")


def split_name(name):
    """'zero3-noreuse-fp32' -> ('zero3-noreuse', 'fp32')."""
    kind, precision = name.rsplit("-", 1)
    return kind, precision


def _delta(start, end):
    return {k: end[k] - start.get(k, 0) for k in end}


def summarize(result, args):
    """The per-configuration numbers the tables show (every rank's raw data stays in the
    JSON)."""
    if "error" in result:
        return {"config": result["config"], "error": result["error"]}
    name, ranks = result["config"], result["ranks"]
    kind, precision = split_name(name)
    b = 4 if precision == "fp32" else 2
    rank_times = [r["step_times"] for r in ranks]
    per_step = slowest_rank(rank_times)
    n = len(per_step)
    numel = ranks[0]["numel"]
    s = {
        "config": name, "kind": kind, "precision": precision, "param_bytes_b": b,
        "numel": numel, "root_numel": ranks[0]["root_numel"],
        "blocks_numel": ranks[0]["blocks_numel"],
        "step_ms_median": statistics.median(per_step) * 1e3,
        "step_ms_p10": p10(per_step) * 1e3,
        "phase_ms_median": {ph: statistics.median(slowest_rank(rank_times, ph)) * 1e3
                            for ph in PHASES},
        "measured_steps": n,
        "rss_start_bytes": [r["rss_start_bytes"] for r in ranks],
        "rss_peak_bytes": [r["rss_peak_bytes"] for r in ranks],
        "losses_rank0": ranks[0]["losses"],
        "grad_norms_rank0": ranks[0].get("grad_norms"),
        "loss_first": ranks[0]["losses"][0], "loss_last": ranks[0]["losses"][-1],
        "paper_3psi_b_bytes": 3 * numel * b,
        "formula_16psi_over_n_bytes": 16 * numel // args.world_size,
    }
    s.update(_comm_numbers(ranks[0], n))
    s.update(_profiled_numbers(ranks))
    if kind in ZERO_KINDS:
        s.update(_zero_numbers(ranks, n, b, args))
    else:
        s.update(_fsdp2_numbers(ranks, s, b, args.world_size))
    return s


def _comm_numbers(rank0, n):
    """Bytes and calls per measured step, rank 0's counters."""
    delta = _delta(rank0["comm_at_warmup_end"], rank0["comm_at_end"])
    # every *_bytes counter but the total (zero counts control messages -- rank-agreement
    # fingerprints, the learned launch order -- apart from the payload, as control_bytes)
    by_op = {k: v / n for k, v in delta.items() if k.endswith("_bytes") and k != "total_bytes"}
    return {"comm_bytes_per_step_by_op": by_op,
            "comm_bytes_per_step": sum(by_op.values()),
            "comm_calls_per_step": sum(v for k, v in delta.items()
                                       if k == "calls" or k.endswith("_calls")) / n,
            "comm_control_calls_per_step": delta.get("control_calls", 0) / n}


def _profiled_numbers(ranks):
    prof = [r.get("profiled_step") for r in ranks]
    if not all(prof):
        return {}
    return {"profiled": {k: [p[k] for p in prof] for k in
                         ("owned_at_start_bytes", "transient_peak_bytes", "step_peak_bytes",
                          "live_at_end_bytes", "autograd_held_param_bytes")},
            "comm_one_step_rank0": {k: v for k, v in prof[0]["comm_delta"].items()
                                    if k not in ("calls",)},
            "live_at_peak_by_op_rank0": prof[0].get("live_at_peak_by_op", [])}


def _category(report, category, field):
    return report["categories"].get(category, {}).get(field, 0)


def _zero_numbers(ranks, n, b, args):
    reports = [r["report"] for r in ranks]
    rep = reports[0]
    s = {
        "padded_numel": rep["numel"],
        "persistent_numel": rep["persistent_numel"],
        "model_state_bytes": [x["model_state_bytes"] for x in reports],
        "model_state_expected_bytes": rep["model_state_expected_bytes"],
        "model_state_formula": rep["model_state_formula"],
        "categories": {k: {f: v.get(f) for f in ("current", "peak", "expected", "formula")}
                       for k, v in rep["categories"].items()},
        "gathered_peak_bytes": [_category(x, "gathered_param", "peak") for x in reports],
        "bucket_bytes": [_category(x, "bucket", "peak") for x in reports],
    }
    s["working_set_bytes"] = [g + k for g, k in zip(s["gathered_peak_bytes"], s["bucket_bytes"])]
    s["engine_total_peak_bytes"] = [x["total"]["peak"] for x in reports]
    s["bucket_current_end_bytes"] = [_category(x, "bucket", "current") for x in reports]
    warm = [r.get("warmup_peaks") or {} for r in ranks]
    s["warmup_peak_bytes"] = {
        "bucket": [w.get("categories", {}).get("bucket", 0) for w in warm],
        "gathered_param": [w.get("categories", {}).get("gathered_param", 0) for w in warm],
        "total": [w.get("total", 0) for w in warm]}
    s.update(_schedule_numbers(ranks, n, args.warmup))
    s["comm_predicted"] = _zero_comm_predicted(rep["numel"], rep["persistent_numel"], s["units"],
                                               s["kept_after_forward_numel"]["mean"], b,
                                               args.world_size)
    s["comm_source"] = "measured: engine counters (rank 0), differenced over measured steps"
    return s


def _schedule_numbers(ranks, n, warmup):
    r0 = ranks[0]
    # the gather schedule over the measured steps (rank 0; the ranks agree by construction
    # -- every collective follows from the fingerprint-checked events)
    st0, st1 = r0["schedule_at_warmup_end"], r0["schedule_stats"]
    kept = r0["gathered_after_forward_numel"][warmup:warmup + n]
    return {
        "units": r0["units"],
        "prefetch_numel": r0["prefetch_default"],
        "schedule_stats": r0.get("schedule_stats"),
        "stage3_settings": r0["stage3_settings"],
        "schedule_per_step": {k: (st1[k] - st0[k]) / n for k in ("gathers", "reuses",
                                                                 "prefetches")},
        "max_inflight_seen": [r["schedule_stats"]["max_inflight_seen"] for r in ranks],
        "peak_gathered_numel": [r["schedule_stats"]["peak_gathered_numel"] for r in ranks],
        "gathered_numel_end": [r["schedule_stats"]["gathered_numel"] for r in ranks],
        "gathered_param_current_end": [r["gathered_param_current_end"] for r in ranks],
        "kept_after_forward_numel": {"mean": sum(kept) / n, "min": min(kept), "max": max(kept)},
    }


def _zero_comm_predicted(psi3, psip, units, k_mean, b, world):
    """The mechanism: every unit is all-gathered once in forward (it is used once there and
    released after, or kept for its backward), and again in backward unless it is still
    gathered when forward returns. K = elements still gathered at the end of forward
    (measured from the schedule, not from the byte counters), averaged per step."""
    return {
        f"all_gather (Ψ3·b forward + (Ψ3 − K)·b backward re-gathers, K = elements kept "
        f"gathered from forward to backward = {k_mean:,.0f}; + Ψp·b persistent params "
        f"after the step)":
            (2 * psi3 - k_mean) * b + psip * b,
        "reduce_scatter (Ψ3·b)": psi3 * b,
        "all_reduce (2·Ψp·b persistent grads + 2·8 B fp64 grad-norm scalar)":
            2 * psip * b + 16,
        f"schedule fingerprints ((2U+1) = {2 * units + 1} all-gathers of 3 int64 per rank)":
            (2 * units + 1) * 3 * 8 * world,
    }


def _fsdp2_numbers(ranks, s, b, world):
    return {
        "model_state_bytes": [r["model_state_bytes"] for r in ranks],
        "model_state_expected_bytes": 16 * s["numel"] // world,
        "model_state_formula": "16Ψ/N (4 param + 4 grad + 8 AdamW, all sharded)",
        "breakdown": {k: [r[k] for r in ranks] for k in (
            "param_bytes", "grad_bytes", "optimizer_state_bytes", "param_logical_bytes",
            "grad_logical_bytes", "optimizer_state_logical_bytes")},
        "gathered_peak_bytes": [r["unsharded_param_peak_bytes"] for r in ranks],
        "bucket_bytes": [0 for _ in ranks],  # FSDP2's comm buffers are transient
        "comm_buffer_peak_bytes": {
            "all_gather_flat_output": [r["all_gather_buffer_peak_bytes"] for r in ranks],
            "reduce_scatter_in_plus_out": [r["reduce_scatter_buffer_peak_bytes"]
                                           for r in ranks]},
        "working_set_bytes": [r["unsharded_plus_comm_peak_bytes"] for r in ranks],
        "fsdp_param_groups": ranks[0]["fsdp_param_groups"],
        "comm_predicted": {
            "all_gather (2·Ψblocks·b: blocks fwd+bwd; Ψroot·b: root once, kept after forward)":
                2 * s["blocks_numel"] * b + s["root_numel"] * b,
            "reduce_scatter (Ψ·b_reduce)": s["numel"] * b,
        },
        "comm_source": ("measured: wrapped FSDP2 all-gather/reduce-scatter calls (rank 0); "
                        "clip_grad_norm_'s scalar all-reduce not counted"),
    }


def summarize_interleaved(result):
    if "error" in result:
        return {"error": result["error"]}
    ranks = result["ranks"]
    summary = {name: step_stats([r["step_times"][name] for r in ranks])
               for name in ranks[0]["step_times"] if all(r["step_times"].get(name)
                                                         for r in ranks)}
    for r in ranks:
        for name, err in r.get("failed", {}).items():
            summary[name] = {"error": err}
    timed = [n for n in ranks[0]["step_times"] if n in summary and "total" in summary[n]]
    summary["paired"] = {f"{a}/{b}": _paired_ratio(ranks, a, b) for a, b in _pairs(timed)}
    return summary


def _pairs(timed):
    """Each zero configuration against FSDP2, and zero3 (reuse) against zero3-noreuse."""
    pairs = []
    for a in timed:
        kind, precision = split_name(a)
        if kind in ZERO_KINDS and f"fsdp2-{precision}" in timed:
            pairs.append((a, f"fsdp2-{precision}"))
        if kind == "zero3" and f"zero3-noreuse-{precision}" in timed:
            pairs.append((a, f"zero3-noreuse-{precision}"))
    return pairs


def _paired_ratio(ranks, a, b):
    """Configuration a over b within the same round (the rounds rotate the order, so a and b
    ran seconds apart): a burst of load from other processes hits both, which the ratio of the
    two medians does not cancel."""
    ta = slowest_rank([r["step_times"][a] for r in ranks])
    tb = slowest_rank([r["step_times"][b] for r in ranks])
    n = min(len(ta), len(tb))
    ratios = sorted(ta[i] / tb[i] for i in range(n))
    return {"median": statistics.median(ratios), "p10": ratios[n // 10],
            "p90": ratios[n - 1 - n // 10], "below_1": sum(x < 1 for x in ratios), "rounds": n}
