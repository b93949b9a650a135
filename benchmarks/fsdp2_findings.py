"""The "Reading the numbers" section of bench_fsdp2.py's report: what this run's numbers say,
one finding per function. Every number is computed from this run; the mechanisms named are
the engines' designs (read from their sources), not measured separately."""
from __future__ import annotations

from benchmarks.fsdp2_summary import PHASES, ZERO_KINDS
from benchmarks.report import MIB, mib, pair


def ratio(inter, a, b, key="total"):
    """a's interleaved median over b's (None when either did not run)."""
    ia, ib = inter.get(a), inter.get(b)
    if isinstance(ia, dict) and key in ia and isinstance(ib, dict) and key in ib:
        return ia[key]["median"] / ib[key]["median"]
    return None


def findings(by, inter, args):
    """What this run's numbers say. Every number is computed from this run; the mechanisms
    named are the engines' designs (read from their sources), not measured separately."""
    out = ["", "## Reading the numbers", ""]
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        zs = [by[f"{k}-{precision}"] for k in ZERO_KINDS if f"{k}-{precision}" in by]
        if not zs:
            continue
        if f is None:
            out.append(f"* **{precision}**: no FSDP2 result to compare with (see Failures).")
            continue
        out += _step_time(zs, f, inter, precision)
        out += _model_states(zs[0], f, precision, args)
        out.append(_gathered(zs, f, precision, args))
        out += _held_by_autograd(zs, f, precision)
        out.append(_buckets(zs[0], f, precision, args))
        out += _step_peak(zs, f, precision)
        out.append(_rss(zs, f, precision))
        out.append(_bytes_sent(zs, f, precision))
        out += _reuse(by, inter, precision)
        out.append(_schedule_bounds(zs, f["param_bytes_b"], precision))
    out += _parity(by)
    out.append(
        "* **Where the time goes (mechanisms from the sources, not separately measured)**: in "
        "the optimizer step zero's AdamW is a handful of ATen ops over each flat shard, while "
        "torch.optim.AdamW on CPU uses its per-parameter loop (foreach kernels are defaulted "
        "only on CUDA-like devices) over every DTensor parameter, each op going through "
        "DTensor dispatch. In forward/backward FSDP2 runs its Python hooks, DTensor wrapping "
        "and per-group copy-in/copy-out of flat all-gather and reduce-scatter buffers; zero "
        "copies each gradient into its unit's bucket, issues one fingerprint all-gather per "
        "unit event, and reduces the persistent parameters on a separate stage-1 path. On "
        "gloo every collective is a CPU-side copy plus a TCP round trip between the two "
        "processes, and the reduce-scatter is emulated, so the communication share of these "
        "times is not what a GPU interconnect would show.")
    return out


def _verdict(r, pr):
    """Faster or slower only when the paired ratio is beyond ±5% and at least 2/3 of the
    rounds agree (without paired rounds: the ratio of the medians alone)."""
    if pr and r < 0.95 and 3 * pr["below_1"] >= 2 * pr["rounds"]:
        return "faster than"
    if pr and r > 1.05 and 3 * (pr["rounds"] - pr["below_1"]) >= 2 * pr["rounds"]:
        return "slower than"
    if pr and (r < 0.95 or r > 1.05):
        return "not clearly apart from"
    if not pr:
        return "faster than" if r < 0.95 else "slower than" if r > 1.05 else "within ±5% of"
    return "within ±5% of"


def _step_time(zs, f, inter, precision):
    parts = []
    for z in zs:
        r = ratio(inter, z["config"], f["config"])
        if r is None:
            continue
        phases = ", ".join(
            f"{k} {inter[z['config']][k]['median']:.0f} vs "
            f"{inter[f['config']][k]['median']:.0f} ms" for k in PHASES)
        pr = inter.get("paired", {}).get(f"{z['config']}/{f['config']}")
        paired = ""
        if pr:
            r = pr["median"]
            paired = (f"paired per round {pr['median']:.2f}x, p10-p90 {pr['p10']:.2f}-"
                      f"{pr['p90']:.2f}, zero faster in {pr['below_1']} of {pr['rounds']} "
                      f"rounds; ")
        parts.append(f"{z['config']} {ratio(inter, z['config'], f['config']):.2f}x of "
                     f"medians ({paired}{_verdict(r, pr)} FSDP2; {phases})")
    if not parts:
        return []
    return [f"* **Step time, {precision}** (interleaved run, zero / FSDP2; the "
            f"verdict follows the paired ratio: faster or slower when it is beyond "
            f"±5% and at least 2/3 of the rounds agree): "
            + "; ".join(parts) + ". Isolated medians: "
            + ", ".join(f"{x['config']} {x['step_ms_median']:.0f} ms" for x in zs + [f]) + "."]


def _model_states(z, f, precision, args):
    zm, fm = z["model_state_bytes"][0], f["model_state_bytes"][0]
    return [
        f"* **Model states, {precision}**: zero {mib(zm)} MiB "
        f"({'exactly' if zm == z['model_state_expected_bytes'] else 'vs'} its formula "
        f"{z['model_state_formula']}), FSDP2 {mib(fm)} MiB (16Ψ/N = "
        f"{mib(f['model_state_expected_bytes'])} MiB). Same 16 bytes per parameter, "
        f"sharded, on both sides; zero's {(zm - fm) / 1024:+.1f} KiB are its "
        f"{z['persistent_numel']:,} persistent elements (parameters of ≤ "
        f"{args.persistence_threshold} elements: param and gradient kept whole on "
        f"every rank) and its alignment padding. In bf16 the split differs (zero: bf16 "
        f"param + bf16 grad + fp32 master + Adam; FSDP2: fp32 param + fp32 grad + Adam) "
        f"but the total is the same."]


def _gathered(zs, f, precision, args):
    b = f["param_bytes_b"]
    whole = f["numel"] * b

    def blocks(g, x):  # the gathered bytes as "root + k blocks"
        return (g / b - x["root_numel"]) / max(1, x["blocks_numel"] / args.n_layer)
    ws = []
    for z in zs:
        g, st = z["gathered_peak_bytes"][0], z["stage3_settings"]
        ws.append(f"{z['config']} (prefetch {st['stage3_prefetch_bucket_size']:,} elements, "
                  f"reuse distance {st['stage3_max_reuse_distance']:,}, ≤ "
                  f"{st['stage3_max_inflight_gathers']} all-gathers in flight) gathers at "
                  f"most {mib(g)} MiB = {g / whole:.2f} of the whole model at once (≈ root "
                  f"+ {blocks(g, z):.1f} blocks; "
                  f"{mib(z['kept_after_forward_numel']['mean'] * b)} MiB still gathered "
                  f"when forward returns)")
    fg = f["gathered_peak_bytes"][0]
    ws.append(f"FSDP2 at most {mib(fg)} MiB = {fg / whole:.2f} of it (≈ root + "
              f"{blocks(fg, f):.1f} blocks; its root group stays unsharded from forward "
              f"through backward, and its backward may prefetch the next block's "
              f"all-gather)")
    return (f"* **Gathered parameters, {precision}**: " + "; ".join(ws) + ". zero's "
            "gather schedule records the first step's unit order and later steps "
            "prefetch the next units while the current one computes."
            + "".join(_gathered_notes(zs, f)))


def _gathered_notes(zs, f):
    """Why each setting gathers what it does: reuse keeps everything, no reuse keeps the
    root and the prefetched blocks, and the default prefetch is larger than this model."""
    note = []
    reuse_all = [z["config"] for z in zs
                 if z["kept_after_forward_numel"]["min"] >= z["padded_numel"]]
    if reuse_all:
        note.append(
            f" In {', '.join(reuse_all)} every unit's next use after its forward is its "
            f"own backward, within the default reuse distance, and the whole model is "
            f"below stage3_max_live_parameters, so no unit is released between forward and "
            f"backward: the whole model stays gathered from the end of forward until each "
            f"unit's backward ends (then it is released).")
    lean = [z for z in zs if z["kept_after_forward_numel"]["max"] == 0]
    if lean:
        note.append(
            f" Without reuse ({', '.join(z['config'] for z in lean)}) a unit is released "
            f"when its forward or its backward ends; the root unit is in use for the "
            f"whole forward (its module's forward encloses the blocks'), so the peak is the "
            f"root, the block computing and the prefetched blocks: at most "
            f"stage3_max_inflight_gathers all-gathers in flight and at most "
            f"stage3_prefetch_bucket_size elements ahead, whichever binds first.")
    default_pf = [z for z in zs if z["kind"] == "zero3-noreuse"]
    if default_pf and default_pf[0]["prefetch_numel"] >= f["numel"]:
        note.append(
            f" The default stage3_prefetch_bucket_size ({default_pf[0]['prefetch_numel']:,}"
            f" elements, DeepSpeed's default) is larger than this whole model "
            f"({f['numel']:,}), so in {default_pf[0]['config']} the in-flight bound sets "
            f"the prefetch depth (most seen: "
            f"{pair(default_pf[0]['max_inflight_seen'], str)}); on 39a4e5b, before "
            f"that bound existed, the same default prefetch had the whole model gathered "
            f"or in flight at once.")
    return note


def _held_by_autograd(zs, f, precision):
    held = [(x["config"], x["profiled"]["autograd_held_param_bytes"][0])
            for x in zs + [f] if x.get("profiled")]
    if not held:
        return []
    zero_held = [(c, h) for c, h in held if not c.startswith("fsdp2")]
    return [
        f"* **Released parameters still held by autograd after forward, {precision}**: "
        + "; ".join(f"{c} {mib(h)} MiB" for c, h in held) + ". " +
        ("zero's release after a unit's forward drops the engine's reference to the "
         "gathered buffer (the registry counts it as freed), but autograd has saved "
         "views of the gathered weights (e.g. for the matmuls' weight gradients), so "
         "the buffer stays allocated until backward frees that graph node -- while "
         "backward all-gathers the same unit again into a new buffer. The registry's "
         "`gathered_param` peak therefore understates the real parameter working set "
         "(up to every released unit of the forward, i.e. about the whole model, plus "
         "the re-gathered ones); FSDP2 frees by resizing the storage to 0 and "
         "re-gathers into the same storage, so its saved views cost nothing between "
         "forward and backward."
         if any(h > 0 for _, h in zero_held) else
         "Neither side keeps released parameters alive through autograd.")]


def _buckets(z0, f, precision, args):
    steady, kept = z0["bucket_bytes"][0], z0["bucket_current_end_bytes"][0]
    warm = z0["warmup_peak_bytes"]["bucket"][0]
    text = (f"* **Buckets, {precision}**: after warm-up zero's reduce-scatter buckets peak at "
            f"{mib(steady)} MiB per step, in backward, and {mib(kept)} MiB stay allocated "
            f"between steps (the persistent small-parameter group's 1/N pieces). Each "
            f"partitioned unit's bucket (a full-unit input plus its 1/N output) is made for "
            f"that unit when its first gradient arrives, sized to it, and freed when its "
            f"reduce-scatter completes, at most two at once with overlap_comm (the stage-3 "
            f"default); until 45ed90a two buckets sized for the largest unit (here the root "
            f"with the {args.vocab}x{args.n_embd} tied embedding, {z0['root_numel']:,} "
            f"elements) stayed allocated all the time.")
    if warm > 1.05 * steady:
        text += (f" During the warm-up steps the buckets peaked at {mib(warm)} MiB: this engine "
                 f"learns the units' launch order from rank 0's first backward and agrees on "
                 f"it by broadcast, and more buckets live at once while that happens.")
    return text + (f" FSDP2 keeps no buckets either: a group's reduce-scatter input exists only "
                   f"around that group's reduction (largest seen: "
                   f"{mib(f['comm_buffer_peak_bytes']['reduce_scatter_in_plus_out'][0])} MiB "
                   f"input + output).")


def _step_peak(zs, f, precision):
    prof = [(x["config"], x.get("profiled")) for x in zs + [f]]
    if not all(p for _, p in prof):
        return []
    text = (
        f"* **Step peak, {precision}** (owned at the step's start + peak of the step's "
        f"own allocations): " + "; ".join(
            f"{c} {mib(p['step_peak_bytes'][0])} MiB ({mib(p['owned_at_start_bytes'][0])}"
            f" + {mib(p['transient_peak_bytes'][0])})" for c, p in prof) +
        ". Activations are identical (same model, batch and dtype of compute). FSDP2's "
        "owned-at-start has no gradients (zero_grad sets them to None; its gradient "
        "shards are allocated in backward and show up in the transient part); zero's "
        "includes its gradient shard (and the persistent group's small piece buckets; a "
        "partitioned unit's bucket lives in backward only, in the transient part).")
    fp_ = f["profiled"]
    for z in zs:
        zp_ = z["profiled"]
        gap = zp_["step_peak_bytes"][0] - fp_["step_peak_bytes"][0]
        owned_gap = zp_["owned_at_start_bytes"][0] - fp_["owned_at_start_bytes"][0]
        transient_gap = zp_["transient_peak_bytes"][0] - fp_["transient_peak_bytes"][0]
        text += (
            f" {z['config']} peaks {mib(gap)} MiB above FSDP2: {mib(owned_gap)} MiB "
            f"already at the step's start (what it keeps between steps beyond FSDP2: its "
            f"gradient shard, which FSDP2 drops at zero_grad and allocates again in "
            f"backward, and {mib(z['bucket_current_end_bytes'][0])} MiB of buckets) and "
            f"{mib(transient_gap)} MiB more in the step's own "
            f"allocations, against {mib(zp_['autograd_held_param_bytes'][0])} MiB of "
            f"released parameters that autograd holds at the end of its forward.")
    return [text + _profiler_caveat(prof)]


def _profiler_caveat(prof):
    uneven = [f"{c} {pair(p['transient_peak_bytes'])}" for c, p in prof
              if max(p["transient_peak_bytes"]) - min(p["transient_peak_bytes"]) > MIB]
    residue = [f"{c} {pair(p['live_at_end_bytes'])}" for c, p in prof
               if max(p["live_at_end_bytes"]) > MIB]
    return (
        " The transient peak is good to about a unit, not to the byte. The profiler "
        "records allocations from threads other than the training thread too (with gloo, "
        "presumably its worker threads), so whether collective temporaries overlap the "
        "peak depends on thread timing"
        + (f" (here the ranks differ: {'; '.join(uneven)} MiB)" if uneven else "")
        + (f"; more than 1 MiB allocated during the step and not seen freed at its end: "
           f"{'; '.join(residue)} MiB (still alive, or a free the profiler did not "
           f"record, which leaves its running total high)" if residue else
           "; no profiled step ended with more than 1 MiB it allocated left unfreed")
        + ".")


def _rss(zs, f, precision):
    return (f"* **RSS peak, {precision}**: " + "; ".join(
        f"{x['config']} {pair(x['rss_peak_bytes'])} MiB" for x in zs + [f]) +
        f" (RSS at start ≈ {mib(f['rss_start_bytes'][0])} MiB is the torch runtime). RSS "
        f"also holds whatever the allocator (glibc malloc) has not returned to the OS, so it "
        f"only roughly follows the peaks above.")


def _bytes_sent(zs, f, precision):
    parts = []
    for z in zs:
        pred = sum(z["comm_predicted"].values())
        parts.append(
            f"{z['config']} {mib(z['comm_bytes_per_step'])} MiB = "
            f"{z['comm_bytes_per_step'] / z['paper_3psi_b_bytes']:.4f} x 3Ψ·b "
            f"({z['comm_bytes_per_step'] - z['paper_3psi_b_bytes']:+,.0f} bytes; "
            f"{z['schedule_per_step']['gathers']:.0f} unit all-gathers per step; measured "
            f"− predicted {z['comm_bytes_per_step'] - pred:+,.0f} bytes)")
    fc = f["comm_bytes_per_step"]
    parts.append(f"FSDP2 {mib(fc)} MiB = {fc / f['paper_3psi_b_bytes']:.4f} x 3Ψ·b")
    calls = ", ".join(f"{z['config']} {z['comm_calls_per_step']:.0f} "
                      f"({z['comm_control_calls_per_step']:.0f} of them control)"
                      for z in zs)
    return (
        f"* **Bytes sent per step, {precision}** (b = {f['param_bytes_b']}): "
        + "; ".join(parts) + ". "
        f"zero's counters match the mechanism's prediction (table above): forward "
        f"all-gathers every unit once (Ψ3·b, the root included), backward all-gathers again "
        f"only the units released after forward ((Ψ3 − K)·b; K, the elements kept "
        f"gathered from forward to backward, is read from the schedule, not from the byte "
        f"counters), one reduce-scatter (Ψ3·b), and for the persistent parameters stage "
        f"1's 3Ψp·b (gradient all-reduce 2Ψp·b + all-gather of the updated parameters "
        f"Ψp·b). With reuse 0 (K = 0) that is the paper's 3Ψ·b on the padded Ψ; with the "
        f"default reuse distance (K = Ψ3) it is 2Ψ·b + Ψp·b, i.e. one all-gather of the "
        f"model per step instead of two. The prediction also counts two things that are not "
        f"payload: the fp64 gradient-norm all-reduce (16 bytes) and the schedule's "
        f"fingerprint all-gathers (one per unit event, 2U+1 = {2 * zs[0]['units'] + 1} per "
        f"step, 48 bytes each at N=2). They are tiny, but each one is a synchronising "
        f"collective. Calls per step: {calls}; FSDP2 {f['comm_calls_per_step']:.0f}. "
        f"FSDP2 keeps only its root group unsharded after forward (FSDP2's default for the "
        f"root), so it all-gathers the blocks twice and the root's {f['root_numel']:,} "
        f"elements once: between zero's two schedules.")


def _reuse(by, inter, precision):
    """zero3 against zero3-noreuse: what keeping units gathered into backward costs (memory)
    and saves (all-gathers, time)."""
    nz = by.get(f"zero3-noreuse-{precision}")
    rz = by.get(f"zero3-{precision}")
    if not (nz and rz):
        return []
    b = rz["param_bytes_b"]
    g = lambda x: x["gathered_peak_bytes"][0]  # noqa: E731
    text = (
        f"* **What reuse costs and saves, {precision}** (zero3 vs zero3-noreuse: same "
        f"prefetch and in-flight bounds, reuse distance 1e9 vs 0): reuse keeps "
        f"{mib(rz['kept_after_forward_numel']['mean'] * b)} MiB gathered from forward "
        f"into backward; gathered peak {mib(g(rz))} vs {mib(g(nz))} MiB "
        f"({mib(g(rz) - g(nz))} MiB more)")
    if rz.get("profiled") and nz.get("profiled"):
        rp, np_ = rz["profiled"]["step_peak_bytes"][0], nz["profiled"]["step_peak_bytes"][0]
        text += f", step peak {mib(rp)} vs {mib(np_)} MiB ({mib(rp - np_)} MiB more)"
    text += (f", RSS peak {pair(rz['rss_peak_bytes'])} vs {pair(nz['rss_peak_bytes'])}"
             f" MiB. It saves "
             f"{mib(nz['comm_bytes_per_step'] - rz['comm_bytes_per_step'])} MiB of "
             f"all-gather per step ({nz['schedule_per_step']['gathers']:.0f} → "
             f"{rz['schedule_per_step']['gathers']:.0f} unit all-gathers; sent per step "
             f"{nz['comm_bytes_per_step'] / nz['paper_3psi_b_bytes']:.3f} → "
             f"{rz['comm_bytes_per_step'] / rz['paper_3psi_b_bytes']:.3f} x 3Ψ·b)")
    return [text + _reuse_time(inter, rz["config"], nz["config"]) + "."]


def _reuse_time(inter, rz, nz):
    r = ratio(inter, rz, nz)
    if r is None:
        return ""
    pr = inter.get("paired", {}).get(f"{rz}/{nz}")
    text = (f"; step time with reuse / without: {r:.2f}x of the interleaved "
            f"medians ({inter[rz]['total']['median']:.0f} vs "
            f"{inter[nz]['total']['median']:.0f} ms; backward "
            f"{inter[rz]['backward']['median']:.0f} vs "
            f"{inter[nz]['backward']['median']:.0f} ms)")
    if pr:
        text += (f", {pr['median']:.2f}x paired per round (p10-p90 "
                 f"{pr['p10']:.2f}-{pr['p90']:.2f}; reuse faster in "
                 f"{pr['below_1']} of {pr['rounds']} rounds)")
    return text


def _schedule_bounds(zs, b, precision):
    checks = []
    for z in zs:
        st = z["stage3_settings"]
        inflight_ok = max(z["max_inflight_seen"]) <= st["stage3_max_inflight_gathers"]
        live_ok = max(z["peak_gathered_numel"]) <= st["stage3_max_live_parameters"]
        reg_eq = all(p * b == r for p, r in zip(z["peak_gathered_numel"],
                                                z["gathered_peak_bytes"]))
        end_ok = (all(v == 0 for v in z["gathered_numel_end"])
                  and all(v == 0 for v in z["gathered_param_current_end"]))
        checks.append(
            f"{z['config']}: in flight ≤ {pair(z['max_inflight_seen'], str)} (bound "
            f"{st['stage3_max_inflight_gathers']}, {'held' if inflight_ok else 'EXCEEDED'}), "
            f"peak gathered {max(z['peak_gathered_numel']):,} elements (live bound "
            f"{st['stage3_max_live_parameters']:,}, {'held' if live_ok else 'EXCEEDED'}; "
            f"registry peak {'=' if reg_eq else '≠'} elements × b), "
            f"{'nothing' if end_ok else 'SOMETHING'} gathered after the last step")
    return f"* **Schedule bounds, {precision}**: " + "; ".join(checks) + "."


def _max_difference(xs, ys):
    return max(abs(x - y) for x, y in zip(xs, ys))


def _parity(by):
    parity, drift = [], []
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        for k in ZERO_KINDS:
            z = by.get(f"{k}-{precision}")
            if z and f:
                worst = _max_difference(z["losses_rank0"], f["losses_rank0"])
                parity.append(f"{z['config']} vs {f['config']} {worst:.1e}")
    for kind in ZERO_KINDS + ("fsdp2",):
        lo, hi = by.get(f"{kind}-fp32"), by.get(f"{kind}-bf16")
        if lo and hi:
            drift.append(f"{kind} {_max_difference(lo['losses_rank0'], hi['losses_rank0']):.1e}")
    if not parity:
        return []
    n = len(next(iter(by.values()))["losses_rank0"])
    return [
        f"* **Parity** (largest rank-0 loss difference over the {n} steps of the isolated "
        f"runs, same data): " + ", ".join(parity) + ". bf16 vs fp32 of the same framework: "
        + ", ".join(drift) + ". fp32 agrees to float rounding. In bf16 the two recipes "
        "round in different places (zero keeps bf16 parameters and gradients and "
        "clips on them; FSDP2 keeps fp32 shards and casts to bf16 for the all-gather, "
        "casting the bf16-reduced gradient back to fp32), and at this loss level (≈ "
        "ln(vocab), the model has barely started to learn) per-step noise dominates, so "
        "the bf16 trajectories part after a few steps. " + _grad_norms(by) + "Whether one "
        "bf16 recipe trains better cannot be read from "
        "these few steps (run e.g. `--steps 40 --warmup 0 --interleaved-steps 0 "
        "--no-profile --configs zero3pf-bf16,fsdp2-bf16,fsdp2-fp32` to follow the trend)."]


def _grad_norms(by):
    """Pre-clipping gradient norms of the first steps, zero against FSDP2."""
    parts = []
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        z = next((by[f"{k}-{precision}"] for k in ZERO_KINDS if f"{k}-{precision}" in by), None)
        if f and z and f.get("grad_norms_rank0") and z.get("grad_norms_rank0"):
            pairs = [(a, c) for a, c in zip(z["grad_norms_rank0"][:3], f["grad_norms_rank0"][:3])
                     if a and c]
            if pairs:
                rel = max(abs(a - c) / c for a, c in pairs)
                parts.append(f"{z['config']} vs {f['config']} {rel:.1e}")
    if not parts:
        return ""
    return ("Pre-clipping gradient norms of the first 3 steps, largest relative "
            "difference: " + ", ".join(parts) + " (neither side mis-scales gradients). ")
