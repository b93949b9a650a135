"""bench_fsdp2.py's Markdown report: the set-up, one table per kind of number (summary, step
time by phase, bytes sent, zero's gather schedule, memory detail, losses), the findings
(fsdp2_findings.py) and the machine."""
from __future__ import annotations

from benchmarks.fsdp2_findings import findings
from benchmarks.fsdp2_summary import PHASES, ZERO_KINDS
from benchmarks.report import engine_under_test, header, last_line, machine_section, mib, pair
from benchmarks.under_test import ROOT


def render_markdown(summaries, interleaved, facts, args, command, wall_s):
    ok = [s for s in summaries if "error" not in s]
    inter = (interleaved or {}).get("summary") or {}
    lines = header("zero stage 3 vs PyTorch FSDP2 (world size 2, gloo, CPU)", "bench_fsdp2.py",
                   facts["date"], wall_s, command)
    lines += _setup(ok, args)
    lines += _summary_table(summaries, inter)
    lines += _phase_table(summaries, inter)
    if interleaved and "error" in interleaved:
        lines += ["", f"Interleaved run FAILED: {last_line(interleaved['error'])}"]
    lines += _comm_table(summaries)
    lines += _schedule_table([s for s in ok if s["kind"] in ZERO_KINDS])
    lines += _memory_detail(ok)
    lines += _losses(ok)
    lines += _failures([s for s in summaries if "error" in s])
    lines += findings({s["config"]: s for s in ok}, inter, args)
    lines += _machine(facts)
    return "\n".join(lines)


def _setup(ok, args):
    per_block = ok[0]["blocks_numel"] // max(1, args.n_layer) if ok else 0
    return [
        f"Model: TinyGPT(vocab={args.vocab}, block={args.block}, n_layer={args.n_layer}, "
        f"n_head={args.n_head}, n_embd={args.n_embd}), tied embeddings, Ψ = {ok[0]['numel']:,} "
        f"parameters ({ok[0]['root_numel']:,} in the root unit -- embeddings, tied head, "
        f"final norm -- and {per_block:,} per block)."
        if ok else "",
        "",
        f"Micro-batch {args.micro_batch} x {args.block} tokens per rank, "
        f"gradient_accumulation_steps 1, AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, "
        f"wd 0.01), gradient clipping {args.clip}, {args.threads} torch thread(s) per rank. "
        f"zero: stage 3, stage3_param_persistence_threshold={args.persistence_threshold}, "
        f"reduce_bucket_size={args.bucket_numel:,}, overlap_comm default (true at stage 3); "
        f"`zero3` = the engine's other stage-3 defaults (stage3_prefetch_bucket_size 5e7, "
        f"stage3_max_reuse_distance 1e9, stage3_max_live_parameters 1e9, "
        f"stage3_max_inflight_gathers 2), `zero3-noreuse` = the same with "
        f"stage3_max_reuse_distance 0, `zero3pf` = stage3_max_reuse_distance 0 and "
        f"stage3_prefetch_bucket_size = one block "
        f"({args.prefetch_numel or per_block:,} elements). "
        f"FSDP2: `fully_shard` on each block then on the root, default reshard_after_forward, "
        f"`torch.optim.AdamW` (default implementation), `clip_grad_norm_`, "
        f"`zero_grad()` after the step. Isolated runs: {args.warmup} warm-up + {args.steps} "
        f"measured steps (+1 profiled step) per configuration in fresh processes; interleaved "
        f"run: {args.warmup} warm-up + {args.interleaved_steps} measured steps per "
        f"configuration, round-robin in one pair of processes.",
        "",
        "**bf16** means: zero = DeepSpeed bf16 (bf16 params/grads, fp32 master + Adam state); "
        "FSDP2 = `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16)` (fp32 "
        "sharded params/grads/AdamW, bf16 all-gather, compute and reduce-scatter).",
        "",
    ]


def _summary_table(summaries, inter):
    lines = [
        "## Summary (per rank; MiB; rank 0 / rank 1 where they differ)",
        "",
        "| config | step ms interleaved median (p10) | step ms isolated median (p10) | "
        "model states measured | model-state formula | gathered params peak | buckets "
        "peak | working set peak | released params still held by autograd after forward | "
        "step peak (profiler) | RSS peak | sent / step | sent / 3Ψ·b |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED: {last_line(s['error'], 300)} "
                         "| | | | | | | | | | | |")
            continue
        it = inter.get(s["config"])
        cell = (f"{it['total']['median']:.0f} ({it['total']['p10']:.0f})"
                if isinstance(it, dict) and "total" in it else "-")
        prof = s.get("profiled")
        lines.append(
            f"| {s['config']} | {cell} | {s['step_ms_median']:.0f} ({s['step_ms_p10']:.0f}) | "
            f"{pair(s['model_state_bytes'])} | {s['model_state_formula']} = "
            f"{mib(s['model_state_expected_bytes'])} | {pair(s['gathered_peak_bytes'])} | "
            f"{pair(s['bucket_bytes'])} | {pair(s['working_set_bytes'])} | "
            f"{pair(prof['autograd_held_param_bytes']) if prof else '-'} | "
            f"{pair(prof['step_peak_bytes']) if prof else '-'} | {pair(s['rss_peak_bytes'])} | "
            f"{mib(s['comm_bytes_per_step'])} | "
            f"{s['comm_bytes_per_step'] / s['paper_3psi_b_bytes']:.4f} |")
    return lines + ["", COLUMNS]


COLUMNS = (
    "*Columns.* *model states*: zero = its accounting registry (param + gradient + "
    "fp32_master + optimizer_state) beside the engine's own formula on its padded Ψ "
    "(\"persistent\" terms: parameters ≤ the persistence threshold, kept whole); FSDP2 = "
    "distinct storages of the local shards of the DTensor params, grads and AdamW state "
    "after optimizer.step(), beside 16Ψ/N. *gathered params peak*: zero's registry "
    "`gathered_param` peak; FSDP2's unsharded parameter storages alive at once (sampled at "
    "its unshard / post-backward / reduce-scatter points). *buckets peak*: zero's "
    "reduce-scatter buckets, peak after warm-up (see the findings for what stays "
    "allocated between steps and the warm-up peak); FSDP2 keeps none. "
    "*working set peak*: zero = gathered peak + buckets (its registry's view); FSDP2 = "
    "peak of unsharded params + the flat all-gather outputs and reduce-scatter inputs "
    "still referenced (sampled). *released params still held by autograd*: parameter "
    "storages that autograd saved during forward and that no module parameter uses any "
    "more at the end of forward (i.e. the framework released them), summed at their size "
    "then (FSDP2 frees by resizing the storage to 0; see the findings). *step peak*: "
    "bytes owned at the start of one extra step + the peak of the live bytes allocated "
    "during it (torch.profiler CPU allocation events: activations, gathered params, grads, "
    "temporaries). *sent / step*: paper convention (all-gather and reduce-scatter of a "
    "B-byte full buffer = B, all-reduce = 2B); 3Ψ·b with the unpadded Ψ and b = bytes of "
    "the communicated dtype.")


def _phase_table(summaries, inter):
    lines = [
        "",
        "## Step time by phase (ms, interleaved medians; slower rank per step)",
        "",
        "| config | total median | p10 | forward | backward | step (FSDP2: clip + AdamW + "
        "zero_grad) | / FSDP2, paired per round: median (p10-p90) | isolated fwd / bwd / step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | | |")
            continue
        it = inter.get(s["config"])
        iso = " / ".join(f"{s['phase_ms_median'][k]:.0f}" for k in PHASES)
        pr = inter.get("paired", {}).get(f"{s['config']}/fsdp2-{s['precision']}")
        pr_cell = (f"{pr['median']:.2f} ({pr['p10']:.2f}-{pr['p90']:.2f})" if pr else "-")
        if isinstance(it, dict) and "total" in it:
            lines.append(f"| {s['config']} | {it['total']['median']:.0f} | "
                         f"{it['total']['p10']:.0f} | {it['forward']['median']:.0f} | "
                         f"{it['backward']['median']:.0f} | {it['step']['median']:.0f} | "
                         f"{pr_cell} | {iso} |")
        else:
            err = (it or {}).get("error", "not run") if isinstance(it, dict) else "not run"
            lines.append(f"| {s['config']} | - ({last_line(str(err), 120)}) "
                         f"| | | | | | {iso} |")
    return lines


def _comm_table(summaries):
    lines = [
        "",
        "## Bytes sent per step (MiB, rank 0, paper convention)",
        "",
        "| config | measured total | by op (measured) | predicted by the mechanism | "
        "3Ψ·b | measured − 3Ψ·b (bytes) | calls / step |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | |")
            continue
        by_op = ", ".join(f"{k.replace('_bytes', '')} {mib(v)}"
                          for k, v in s["comm_bytes_per_step_by_op"].items() if v)
        pred = "; ".join(f"{k}: {mib(v)}" for k, v in s["comm_predicted"].items())
        lines.append(
            f"| {s['config']} | {mib(s['comm_bytes_per_step'])} | {by_op} | {pred} "
            f"(sum {mib(sum(s['comm_predicted'].values()))}) | "
            f"{mib(s['paper_3psi_b_bytes'])} | "
            f"{s['comm_bytes_per_step'] - s['paper_3psi_b_bytes']:+,.0f} | "
            f"{s['comm_calls_per_step']:.0f} |")
    return lines


def _schedule_table(zs_ok):
    if not zs_ok:
        return []
    lines = [
        "",
        "## zero's gather schedule (rank 0 per measured step; bounds over the whole run)",
        "",
        "| config | prefetch bound (elements) | reuse distance | in-flight bound | "
        "live bound | unit all-gathers / step (2U − reuses) | reuses / step | "
        "prefetches / step | kept gathered at the end of forward (MiB) | most all-gathers "
        "in flight seen | peak gathered elements (× b, MiB) | registry gathered peak "
        "(MiB) | gathered at the end |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    lines += [_schedule_row(z) for z in zs_ok]
    return lines + [
        "",
        f"U = {zs_ok[0]['units']} gather units (6 blocks + the root). *most all-gathers in "
        "flight seen*: the schedule's own counter, read right after each prefetch starts "
        "one. *peak gathered elements*: the schedule's counter since the engine was built "
        "(warm-up included); the registry peak is reset after warm-up. *kept gathered at "
        "the end of forward*: the schedule's gathered elements when forward returns "
        "(units it keeps for their backward under the reuse distance).",
    ]


def _schedule_row(z):
    st, ps, b = z["stage3_settings"], z["schedule_per_step"], z["param_bytes_b"]
    kept = z["kept_after_forward_numel"]
    kept_cell = (mib(kept["mean"] * b) if kept["min"] == kept["max"] else
                 f"{mib(kept['min'] * b)}..{mib(kept['max'] * b)} "
                 f"(mean {mib(kept['mean'] * b)})")
    return (
        f"| {z['config']} | {st['stage3_prefetch_bucket_size']:,} | "
        f"{st['stage3_max_reuse_distance']:,} | {st['stage3_max_inflight_gathers']} | "
        f"{st['stage3_max_live_parameters']:,} | {ps['gathers']:.1f} "
        f"({2 * z['units'] - ps['reuses']:.1f}) | {ps['reuses']:.1f} | "
        f"{ps['prefetches']:.1f} | {kept_cell} | {pair(z['max_inflight_seen'], str)} | "
        f"{pair(z['peak_gathered_numel'], lambda v: f'{v:,}')} "
        f"({pair([v * b for v in z['peak_gathered_numel']])}) | "
        f"{pair(z['gathered_peak_bytes'])} | "
        f"{pair(z['gathered_numel_end'], str)} elements, registry "
        f"{pair(z['gathered_param_current_end'])} MiB |")


def _memory_detail(ok):
    lines = ["", "## Memory detail (rank 0, MiB)", ""]
    for s in ok:
        lines.append(_zero_memory(s) if s["kind"] in ZERO_KINDS else _fsdp2_memory(s))
        prof = s.get("profiled")
        if prof:
            lines.append(f"  profiled step: owned at start {pair(prof['owned_at_start_bytes'])}"
                         f", transient peak {pair(prof['transient_peak_bytes'])}, step peak "
                         f"{pair(prof['step_peak_bytes'])}, live at the end "
                         f"{pair(prof['live_at_end_bytes'])}; RSS start "
                         f"{pair(s['rss_start_bytes'])}, RSS peak {pair(s['rss_peak_bytes'])}.")
        if s.get("live_at_peak_by_op_rank0"):  # runs before this column: absent
            lines.append("  allocated in the step and alive at its peak, by op (rank 0): " +
                         "; ".join(f"{mib(size)} `{op}`"
                                   for op, size in s["live_at_peak_by_op_rank0"]) + ".")
    return lines


def _zero_memory(s):
    cats = []
    for cat in ("param", "gradient", "fp32_master", "optimizer_state", "gathered_param",
                "bucket"):
        c = s["categories"].get(cat)
        if not c:
            continue
        exp = (f", formula {mib(c['expected'])} ({c['formula']})"
               if c.get("expected") is not None else "")
        cats.append(f"{cat} {mib(c['current'])} now / {mib(c['peak'])} peak{exp}")
    return (f"* **{s['config']}** (Ψ3 padded = {s['padded_numel']:,} partitioned, "
            f"Ψp = {s['persistent_numel']:,} persistent): " + "; ".join(cats) +
            f"; engine total peak {pair(s['engine_total_peak_bytes'])}.")


def _fsdp2_memory(s):
    bd = s["breakdown"]
    cb = s["comm_buffer_peak_bytes"]
    return (
        f"* **{s['config']}**: params {pair(bd['param_bytes'])}, grads "
        f"{pair(bd['grad_bytes'])}, AdamW state {pair(bd['optimizer_state_bytes'])} "
        f"(storages; logical shard bytes {pair(bd['param_logical_bytes'])} / "
        f"{pair(bd['grad_logical_bytes'])} / "
        f"{pair(bd['optimizer_state_logical_bytes'])}); largest flat all-gather "
        f"output {pair(cb['all_gather_flat_output'])}, largest reduce-scatter input + "
        f"output {pair(cb['reduce_scatter_in_plus_out'])}; parameter groups: "
        + ", ".join(f"{g['module']} ({g['numel']:,} local elements)"
                    for g in s["fsdp_param_groups"]) + ".")


def _losses(ok):
    lines = ["", "## Loss (rank 0, every step of the isolated run)", "",
             "| config | losses |", "| --- | --- |"]
    for s in ok:
        lines.append(f"| {s['config']} | " + " ".join(f"{x:.5f}" for x in s["losses_rank0"])
                     + " |")
    return lines


def _failures(failed):
    if not failed:
        return []
    lines = ["", "## Failures", ""]
    for s in failed:
        lines += [f"**{s['config']}**:", "", "```", s["error"].strip()[-3000:], "```", ""]
    return lines


def _machine(facts):
    return machine_section(facts) + [
        f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}. "
        f"/proc/loadavg at start: `{facts['loadavg_start']}`, at end: "
        f"`{facts['loadavg_end']}`; 1-minute load sampled every 5 s during the run: "
        f"{facts.get('loadavg_samples_text', 'not sampled')} (above 2 means other "
        f"processes shared the 2 cores; the interleaved timings are the ones to compare).",
        "",
        engine_under_test(facts)
        + (" (with uncommitted changes under zero/ or csrc/)"
           if facts["zero_tree_dirty"] else "")
        + (f", extension `zero/_C*.so` sha256 {facts['zero_extension_sha256']}…"
           if facts.get("zero_extension_sha256") else "") + "."
        + _checkout(facts), ""]


def _checkout(facts):
    """The checkout's own state, when the engine measured is another tree."""
    if facts["zero_root"] == ROOT:
        return ""
    return (f" The checkout `{ROOT}` was at {facts['checkout_commit']}"
            + (", with uncommitted changes: `" + " ".join(facts["checkout_dirty"].split()) + "`"
               if facts["checkout_dirty"] else ", clean") + ".")
