"""bench_ddp.py's numbers and report: what the ranks measured, reduced per configuration
(summarize), and the Markdown that shows them with what they say (render_markdown)."""
from __future__ import annotations

import statistics

from benchmarks.report import (MIB, engine_under_test, header, last_line, machine_section,
                               mib, pair)
from benchmarks.timing import median_per_rank, p10, pool_rounds, step_stats

PHASES = ("forward", "backward", "step")
ZERO_CATEGORIES = ("param", "gradient", "fp32_master", "optimizer_state", "bucket")


def _pair(values) -> str:
    """rank 0 / rank 1, always both."""
    return pair(values, merge_equal=False)


# ---- numbers -------------------------------------------------------------------------------
def _comm_delta(rank_out):
    start, end = rank_out.get("comm_at_warmup_end"), rank_out.get("comm_at_end")
    if not start or not end:
        return None
    return {k: end[k] - start[k] for k in end}


def summarize(results, args):
    """The per-configuration numbers the tables show, pooled over the repeats (every rank's
    raw data stays in the JSON). Step times: the slower rank's time of each step, pooled over
    all measured steps of all repeats; memory and bytes are the same every repeat (RSS: the
    median over repeats, per rank)."""
    failed = [r for r in results if "error" in r]
    if failed:
        return {"config": results[0]["config"], "error": failed[0]["error"]}
    name = results[0]["config"]
    ranks = results[-1]["ranks"]
    pooled, round_ms = pool_rounds(results)
    per_step = pooled["total"]
    numel = ranks[0]["numel"]
    s = {
        "config": name,
        "numel": numel,
        "step_ms_median": statistics.median(per_step) * 1e3,
        "step_ms_p10": p10(per_step) * 1e3,
        "step_ms_repeat_medians": round_ms["total"],
        "measured_steps": len(per_step),
        "phase_ms_median": {k: statistics.median(pooled[k]) * 1e3 for k in PHASES},
        "rss_peak_bytes": median_per_rank(results, "rss_peak_bytes"),
        "rss_start_bytes": median_per_rank(results, "rss_start_bytes"),
        "loss_first": ranks[0]["losses"][0],
        "loss_last": ranks[0]["losses"][-1],
        "ddp_allreduce_bytes_per_step": 2 * numel * 4,
    }
    s.update(_ddp_numbers(ranks, numel) if name.startswith("ddp") else _zero_numbers(ranks))
    return s


def _ddp_numbers(ranks, numel):
    model_state = [r["model_state_bytes"] for r in ranks]
    return {
        "model_state_bytes": model_state,
        "model_state_expected_bytes": 16 * numel,
        "model_state_formula": "16Ψ (4+4+8)",
        "breakdown": {k: ranks[0][k] for k in ("param_bytes", "grad_bytes",
                                               "optimizer_state_bytes")},
        "bucket_bytes": [0 for _ in ranks],  # gradient_as_bucket_view: buckets = grads
        "engine_total_peak_bytes": model_state,
        "comm_bytes_per_step": 2 * numel * 4,
        "comm_source": "analytic 2Ψ·4 (fp32 all-reduce of every gradient bucket)",
    }


def _zero_numbers(ranks):
    reports = [r["report"] for r in ranks]
    steps = len(ranks[0]["step_times"])
    delta = _comm_delta(ranks[0])
    return {
        "padded_numel": reports[0]["numel"],
        "model_state_bytes": [rep["model_state_bytes"] for rep in reports],
        "model_state_expected_bytes": reports[0]["model_state_expected_bytes"],
        "model_state_formula": reports[0]["model_state_formula"],
        "categories": {k: {f: v.get(f) for f in ("current", "peak", "expected", "formula")}
                       for k, v in reports[0]["categories"].items()},
        "bucket_bytes": [rep["categories"].get("bucket", {}).get("peak", 0) for rep in reports],
        "engine_total_peak_bytes": [rep["total"]["peak"] for rep in reports],
        "comm_bytes_per_step_by_op": {k: v / steps for k, v in delta.items() if k != "calls"},
        "comm_calls_per_step": delta["calls"] / steps,
        "comm_bytes_per_step": delta["total_bytes"] / steps,
        "comm_source": "measured (engine counters, rank 0)",
    }


def summarize_interleaved(result):
    if "error" in result:
        return {"error": result["error"]}
    ranks = result["ranks"]
    return {name: step_stats([r["step_times"][name] for r in ranks])
            for name in ranks[0]["step_times"]}


# ---- the report ----------------------------------------------------------------------------
def render_markdown(summaries, probe, interleaved, facts, args, command, wall_s):
    ok = [s for s in summaries if "error" not in s]
    inter = (interleaved or {}).get("summary") or {}
    lines = header("zero vs PyTorch DDP (world size 2, gloo, CPU)", "bench_ddp.py",
                   facts["date"], wall_s, command)
    lines += _setup(args, ok[0]["numel"] if ok else 0)
    lines += _step_time_table(summaries, ok, inter)
    if interleaved and "error" in interleaved:
        lines += ["", f"Interleaved run FAILED: {last_line(interleaved['error'])}"]
    lines += _comm_table(summaries)
    lines += _memory_table(summaries)
    lines += _zero_categories([s for s in ok if not s["config"].startswith("ddp")])
    lines += _probe_table(probe)
    lines += findings(ok, probe, interleaved)
    lines += _machine(facts)
    return "\n".join(lines)


def _setup(args, numel):
    return [
        f"Model: TinyGPT(vocab={args.vocab}, block={args.block}, n_layer={args.n_layer}, "
        f"n_head={args.n_head}, n_embd={args.n_embd}), tied embeddings, "
        f"Ψ = {numel:,} parameters. Micro-batch {args.micro_batch} x {args.block} tokens per "
        f"rank, gradient_accumulation_steps 1, AdamW(lr 1e-3, wd 0.01), gradient clipping "
        f"{args.clip}, {args.threads} torch thread(s) per rank. Buckets: zero "
        f"reduce_bucket_size={args.bucket_numel:,} elements, overlap_comm=true; DDP "
        f"bucket_cap_mb={args.bucket_numel * 4 / MIB:.3f} (the same element count in fp32), "
        f"gradient_as_bucket_view=True. Two kinds of run: *isolated* -- each configuration "
        f"alone in a fresh pair of processes, {args.repeats} run(s) of {args.warmup} warm-up + "
        f"{args.steps} measured steps, order rotated per round (memory, bytes, parity and the "
        f"isolated times come from these); *interleaved* -- one pair of processes holding every "
        f"configuration, stepping them round-robin, {args.warmup} warm-up + "
        f"{args.interleaved_steps} measured steps each (the step-time comparison).",
        "",
        "**Columns.** *fp32*: fp32 everything, both sides. *bf16*: zero = DeepSpeed bf16 "
        "(bf16 params/grads, fp32 master + Adam state, whole forward/backward in bf16); "
        "DDP = fp32 params/grads/AdamW + `torch.autocast('cpu', torch.bfloat16)` forward. "
        "*step ms*: the slower rank's forward+backward+step, median over the measured steps "
        "(p10 beside it). "
        "*model state*: measured bytes per rank (zero: its accounting registry, categories "
        "param+gradient+fp32_master+optimizer_state; DDP: distinct storages of params, grads "
        "and AdamW state, whose 4-byte `step` tensors add a few hundred bytes) beside the "
        "formula (zero: the engine's own formula on its padded Ψ; DDP: 16Ψ). *buckets*: "
        "zero's reduction buffers (peak); DDP's are the grads themselves. *RSS peak*: "
        "ru_maxrss per rank (includes torch runtime, activations, allocator caches). "
        "*sent/step*: zero's engine counters (all-reduce of B = 2B, reduce-scatter/all-gather "
        "of B = B) differenced over the measured steps; DDP: "
        "2Ψ·4 by the same convention.",
        "",
    ]


def _step_time_table(summaries, ok, inter):
    ddp = {s["config"].split("-")[1]: s for s in ok if s["config"].startswith("ddp")}
    lines = [
        "## Step time (ms)",
        "",
        "*Interleaved*: all configurations in one pair of processes, stepping round-robin, so "
        "host noise hits them alike (the fair comparison on this shared VM). *Isolated*: each "
        "configuration alone in fresh processes (the runs the memory numbers come from); "
        "per-run medians in brackets show the run-to-run noise.",
        "",
        "| config | interleaved median (p10) | fwd / bwd / step | vs DDP same precision "
        "(median, p10) | isolated median (p10) [per-run medians] | vs DDP isolated |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED: {last_line(s['error'], 200)} | | | | |")
            continue
        precision = s["config"].split("-")[1]
        ref = ddp.get(precision)
        iso_ratio = f"{s['step_ms_median'] / ref['step_ms_median']:.2f}x" if ref else "-"
        cells = _interleaved_cells(inter.get(s["config"]), inter.get(f"ddp-{precision}"))
        lines.append(
            f"| {s['config']} | {cells[0]} | {cells[1]} | {cells[2]} | "
            f"{s['step_ms_median']:.1f} ({s['step_ms_p10']:.1f}) "
            f"[{', '.join(f'{m:.0f}' for m in s['step_ms_repeat_medians'])}] | {iso_ratio} |")
    return lines


def _interleaved_cells(it, it_ref):
    """median (p10), the phases' medians, and the ratio to DDP of the same precision."""
    cells = ["-", "-", "-"]
    if isinstance(it, dict) and "total" in it:
        cells[0] = f"{it['total']['median']:.1f} ({it['total']['p10']:.1f})"
        cells[1] = " / ".join(f"{it[k]['median']:.1f}" for k in PHASES)
        if isinstance(it_ref, dict) and "total" in it_ref:
            cells[2] = (f"{it['total']['median'] / it_ref['total']['median']:.2f}x, "
                        f"{it['total']['p10'] / it_ref['total']['p10']:.2f}x")
    return cells


def _comm_table(summaries):
    lines = [
        "",
        "## Communication per step and training parity",
        "",
        "| config | sent / step (MiB) | by op (MiB) | vs DDP 2Ψ·4 | "
        "loss step 1 → last (rank 0) |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | |")
            continue
        by_op = f"all_reduce {mib(s['comm_bytes_per_step'])} (analytic)"
        if "comm_bytes_per_step_by_op" in s:
            by_op = ", ".join(f"{k.replace('_bytes', '')} {mib(v)}"
                              for k, v in s["comm_bytes_per_step_by_op"].items()
                              if v and k != "total_bytes")
        comm_ratio = s["comm_bytes_per_step"] / s["ddp_allreduce_bytes_per_step"]
        lines.append(
            f"| {s['config']} | {mib(s['comm_bytes_per_step'])} | {by_op} | "
            f"{comm_ratio:.2f}x | {s['loss_first']:.4f} → {s['loss_last']:.4f} |")
    return lines


def _memory_table(summaries):
    lines = [
        "",
        "## Memory per rank (MiB; rank 0 / rank 1 where they differ by rank)",
        "",
        "| config | model state measured | formula | formula MiB | buckets | "
        "engine-owned total peak | RSS start | RSS peak |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | | |")
            continue
        lines.append(
            f"| {s['config']} | {_pair(s['model_state_bytes'])} | {s['model_state_formula']} | "
            f"{mib(s['model_state_expected_bytes'])} | {_pair(s['bucket_bytes'])} | "
            f"{_pair(s['engine_total_peak_bytes'])} | {_pair(s['rss_start_bytes'])} | "
            f"{_pair(s['rss_peak_bytes'])} |")
    return lines


def _zero_categories(zero_rows):
    if not zero_rows:
        return []
    lines = ["", "### zero's categories (rank 0, MiB: current / peak / formula)", "",
             "| config | param | gradient | fp32_master | optimizer_state | bucket |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in zero_rows:
        cells = []
        for cat in ZERO_CATEGORIES:
            c = s["categories"].get(cat)
            if not c:
                cells.append("-")
                continue
            exp = (f" / {mib(c['expected'])} ({c['formula']})"
                   if c.get("expected") is not None else "")
            cells.append(f"{mib(c['current'])} / {mib(c['peak'])}{exp}")
        lines.append(f"| {s['config']} | " + " | ".join(cells) + " |")
    return lines


def _probe_table(probe):
    if not probe or "error" in probe:
        return []
    t = probe["ranks"][0]["timings_ms"]
    lines = ["", f"## gloo primitives on this machine (Ψ = {probe['ranks'][0]['numel']:,} "
             "elements, median of 7, ms)", "",
             "| op | fp32 | bf16 |", "| --- | ---: | ---: |"]
    for op in ("all_reduce(Ψ)", "reduce_scatter(Ψ -> Ψ/N)", "all_gather(Ψ/N -> Ψ)"):
        lines.append(f"| {op} | {t[op + ' float32']:.1f} | {t[op + ' bfloat16']:.1f} |")
    return lines


def _machine(facts):
    return machine_section(facts, "lscpu | head") + [
        f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}. "
        f"/proc/loadavg at start: `{facts['loadavg_start']}`, at end: "
        f"`{facts['loadavg_end']}` (above 2 means other processes shared the 2 cores).",
        "",
        engine_under_test(facts)
        + (" (with uncommitted changes under zero/ or csrc/)"
           if facts["zero_tree_dirty"] else "") + ".", ""]


# ---- what the numbers say ------------------------------------------------------------------
def findings(ok, probe, interleaved):
    """What the numbers say, computed from this run (the mechanisms named are the engines'
    designs, the same every run)."""
    by = {s["config"]: s for s in ok}
    inter = (interleaved or {}).get("summary") or {}
    out = ["", "## Reading the numbers", ""]
    out += _time_findings(by, inter)
    out += _memory_findings(by, ok)
    out += _comm_and_parity(ok)
    return out


def _ratio_to_ddp(inter, name):
    ref = inter.get("ddp-" + name.split("-")[1])
    it = inter.get(name)
    if not (isinstance(it, dict) and isinstance(ref, dict) and "total" in it
            and "total" in ref):
        return None
    return it["total"]["median"] / ref["total"]["median"]


def _time_findings(by, inter):
    out = []
    for precision in ("fp32", "bf16"):
        names = [n for n in (f"zero{k}-{precision}" for k in range(3)) if n in by]
        ratios = {n: _ratio_to_ddp(inter, n) for n in names
                  if _ratio_to_ddp(inter, n) is not None}
        if not ratios:
            continue
        slower = [n for n, r in ratios.items() if r > 1.05]
        faster = [n for n, r in ratios.items() if r < 0.95]
        text = ", ".join(f"{n} {r:.2f}x" for n, r in ratios.items())
        verdict = ("within ±5% of DDP" if not slower and not faster else
                   ("slower than DDP: " + ", ".join(slower) if slower else "") +
                   ("; " if slower and faster else "") +
                   ("faster than DDP: " + ", ".join(faster) if faster else ""))
        out.append(f"* **Time, {precision}** (interleaved medians vs ddp-{precision}): {text} "
                   f"-- {verdict}.")
    out.append(
        "  Where zero loses time it is in work DDP does not do: stage 1 all-reduces the full "
        "gradients *and* all-gathers the updated parameters (3Ψb on the wire instead of 2Ψb); "
        "stage 2 copies every gradient into a unit-sized bucket before the reduce-scatter and "
        "adds its 1/N back into the shard; stages 1-2 all-gather the parameters after the step "
        "with nothing to overlap it with; and on gloo a reduce-scatter is no cheaper than an "
        "all-reduce of the same buffer (table above), so sharding saves memory here, not time. "
        "bf16 rows are not like-for-like in compute: zero runs the whole model in bf16, DDP "
        "autocasts only the matmuls (and casts the fp32 weights to bf16 on every forward).")
    return out


def _memory_findings(by, ok):
    out = []
    for precision in ("fp32", "bf16"):
        ref = by.get(f"ddp-{precision}")
        rows = [by[n] for n in (f"zero{k}-{precision}" for k in range(3)) if n in by]
        if not ref or not rows:
            continue
        parts = []
        for s in rows:
            ms = s["model_state_bytes"][0]
            share = ms / ref["model_state_bytes"][0]
            total = s["engine_total_peak_bytes"][0]
            parts.append(f"{s['config']} {ms / MIB:.1f} MiB ({share:.2f}x of DDP; with buckets "
                         f"{total / MIB:.1f} MiB; RSS peak "
                         f"{max(s['rss_peak_bytes']) / MIB:.0f} MiB)")
        out.append(f"* **Memory, {precision}**: DDP model state "
                   f"{ref['model_state_bytes'][0] / MIB:.1f} MiB (RSS peak "
                   f"{max(ref['rss_peak_bytes']) / MIB:.0f} MiB); " + "; ".join(parts) + ".")
    exact = all(max(s["model_state_bytes"]) == s["model_state_expected_bytes"]
                for s in ok if not s["config"].startswith("ddp"))
    out.append(
        ("  zero's measured model state equals its formula on every rank in every row"
         if exact else
         "  **zero's measured model state differs from its formula in at least one row** "
         "(see the memory table)")
        + ". At N=2 the stage-2 buckets (two unit-sized buffers with overlap_comm; the "
        "largest unit here is the 1M-element tied embedding, larger than "
        "reduce_bucket_size) give back part of the gradient saving. RSS is dominated by "
        "the torch runtime (~220 MiB before the model exists) and activations; DDP's "
        "RSS peak is higher than zero stage 0's although their model states are equal "
        "-- likely DDP's construction-time broadcast copy of the parameters and its "
        "first-iteration bucket rebuild, whose freed memory the allocator keeps (not "
        "attributed precisely).")
    return out


def _comm_and_parity(ok):
    out = []
    comm = [f"{s['config']} {s['comm_bytes_per_step'] / s['ddp_allreduce_bytes_per_step']:.2f}x"
            for s in ok if not s["config"].startswith("ddp")]
    if comm:
        out.append("* **Bytes sent per step vs DDP's 2Ψ·4**: " + ", ".join(comm) + ". bf16 "
                   "halves zero's volume (bf16 gradients and parameters on the wire); DDP with "
                   "autocast still all-reduces fp32 gradients.")
    fp32_losses = {s["config"]: s["loss_last"] for s in ok if s["config"].endswith("fp32")}
    if "ddp-fp32" in fp32_losses and len(fp32_losses) > 1:
        worst = max(abs(v - fp32_losses["ddp-fp32"]) for v in fp32_losses.values())
        out.append(f"* **Parity**: after the same steps on the same data, every fp32 zero stage's "
                   f"loss is within {worst:.1e} of DDP's (rank 0, last step).")
    return out
