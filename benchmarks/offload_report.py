"""bench_offload.py's numbers and report: each configuration's rounds reduced to the numbers
the tables show (summarize), the per-round paired differences, and the Markdown with its
findings (render_markdown)."""
from __future__ import annotations

import os

from benchmarks.facts import load_range
from benchmarks.report import (MIB, engine_under_test, header, last_line, machine_section,
                               mib, pair)
from benchmarks.timing import median, median_per_rank, p10, pool_rounds

ANCHOR = "anchor"
PROBE = "gloo-probe"
PHASES = ("total", "forward", "backward", "sync", "step")
PAIRS = [("z2-cpu", "z2"), ("z2-cpu-dpu", "z2-cpu"), ("z2-nvme", "z2-cpu"),
         ("z3-cpu-param", "z3"), ("z2-cpu-r0.5", "z2"), ("z3-cpu-pnvme", "z3-cpu-param"),
         ("z3-infinity", "z3-cpu-pnvme")]


def _mib(x):
    """MiB to one decimal, this report's precision."""
    return mib(x, 1)


def _pair(values, fmt=_mib):
    return pair(values, fmt)


def load_text(samples, nproc):
    cores = int(nproc) if str(nproc).isdigit() else (os.cpu_count() or 1)
    return f"{load_range(samples)}, {sum(x > cores for x in samples)} of them above {cores}"


# ---- numbers -------------------------------------------------------------------------------
def summarize(name, results):
    failed = [r for r in results if "error" in r]
    if failed:
        return {"config": name, "error": failed[0]["error"]}
    if name in (ANCHOR, PROBE):
        rs = [r["ranks"][0] for r in results]
        keys = list(rs[0]["seconds"])
        return {"config": name, "numel": rs[0].get("numel"),
                "shard_numel": rs[0].get("shard_numel"),
                "ms": {k: median([r["seconds"][k] for r in rs]) * 1e3 for k in keys},
                "ms_per_round": {k: [r["seconds"][k] * 1e3 for r in rs] for k in keys}}
    phases, round_phase = pool_rounds(results, PHASES)
    last = results[-1]["ranks"]
    reports = [r["report"] for r in last]
    rep = reports[0]
    return {
        "config": name,
        "numel": last[0]["numel"],
        "padded_numel": rep["numel"],
        "measured_steps": len(phases["total"]),
        "ms": {k: median(v) * 1e3 for k, v in phases.items()},
        "ms_p10": p10(phases["total"]) * 1e3,
        "round_medians_ms": round_phase["total"],
        "round_phase_ms": round_phase,
        "by_location": [r["model_state_by_location"] for r in reports],
        "by_location_exact": all(r["model_state_by_location"]["measured"]
                                 == r["model_state_by_location"]["expected"] for r in reports),
        "model_state_bytes": rep["model_state_bytes"],
        "model_state_formula": rep["model_state_formula"],
        "categories": {c: {"current": v["current"], "peak": v["peak"],
                           "locations": sorted(v.get("by_location", {})),
                           "formula": v.get("formula")} for c, v in rep["categories"].items()},
        "staging_peak": [r["categories"].get("staging", {}).get("peak", 0) for r in reports],
        "device_total_peak": [r["by_location"]["device"]["peak"] for r in reports],
        "rss_peak_bytes": median_per_rank(results, "rss_peak_bytes"),
        "rss_start_bytes": median_per_rank(results, "rss_start_bytes"),
        "cpu_ms_per_step": [v * 1e3 for v in median_per_rank(results, "cpu_s_per_step")],
        "io_per_step": {key: median_per_rank(results, lambda r, key=key:
                                             r["io_per_step"].get(key, 0))
                        for key in ("read_bytes", "write_bytes")},
        "init_s": median([res["ranks"][0]["init_s"] for res in results]),
        "offload_info": last[0]["offload_info"],
        "step_profile": _profile_over_rounds([res["ranks"][0]["step_profile"]
                                              for res in results]),
        "swap_files": [r["swap_files"] for r in last],
        "swap_files_left_after_exit": [res.get("swap_files_left_after_exit") for res in results],
        "loss_first": last[0]["losses"][0],
        "loss_last": last[0]["losses"][-1],
    }


def _profile_over_rounds(profiles):
    """Medians over the rounds' profiled steps (rank 0): wall, ATen self CPU, and per op its
    self CPU time (0 in a round where the op was not among the top 8)."""
    ops = {}
    for prof in profiles:
        for t in prof["top"]:
            ops.setdefault(t["op"], {"calls": t["calls"]})
    top = []
    for op, meta in ops.items():
        vals = [next((t["self_cpu_ms"] for t in prof["top"] if t["op"] == op), 0.0)
                for prof in profiles]
        top.append({"op": op, "self_cpu_ms": median(vals), "calls": meta["calls"]})
    top.sort(key=lambda t: t["self_cpu_ms"], reverse=True)
    return {"wall_ms": median([p["wall_ms"] for p in profiles]),
            "self_cpu_ms_total": median([p["self_cpu_ms_total"] for p in profiles]),
            "top": top[:8], "rounds": len(profiles)}


def paired(by, a, b, phase="total"):
    """Per round: median of a's steps minus median of b's (the same round's fresh runs, run
    close together); returns the median over rounds and the range."""
    ra, rb = by[a]["round_phase_ms"][phase], by[b]["round_phase_ms"][phase]
    diffs = [x - y for x, y in zip(ra, rb)]
    return {"median": median(diffs), "min": min(diffs), "max": max(diffs), "n": len(diffs)}


def _ms(x):
    return f"{x:+.0f}"


def _rng(d):
    return f"{_ms(d['median'])} ms [{_ms(d['min'])}..{_ms(d['max'])}]"


def _verdict(d):
    if d["max"] < 0:
        return f"faster in all {d['n']} rounds"
    if d["min"] > 0:
        return f"slower in all {d['n']} rounds"
    return "within the round-to-round noise"


def _loc(s, where):
    return s["by_location"][0]["measured"][where]


def _rss(s):
    return max(s["rss_peak_bytes"])


# ---- the report ----------------------------------------------------------------------------
def render_markdown(summaries, facts, args, command, wall_s, rendered_from=None):
    by = {s["config"]: s for s in summaries if "error" not in s}
    engines = [s for s in summaries if s["config"] not in (ANCHOR, PROBE)]
    lines = header(f"Offload: what it saves and what it costs (world size {args.world_size}, "
                   "gloo, CPU)", "bench_offload.py", facts["date"], wall_s, command)
    if rendered_from:
        lines += [f"(Report rebuilt from `{rendered_from}` by `--render-only`; the numbers are "
                  "that run's.)", ""]
    lines += _setup(args, next((s["numel"] for s in engines if "numel" in s), 0),
                    facts.get("nvme", {}))
    lines += _step_time_table(engines, by)
    lines += _paired_table(by)
    lines += _location_table(engines)
    lines += _categories_table(engines)
    lines += _anchor_table(by.get(ANCHOR), summaries, args)
    lines += _probe_table(by.get(PROBE), args)
    lines += _profile_table([s for s in engines if "step_profile" in s])
    lines += _nvme_files(by.get("z2-nvme"))
    lines += findings(by, by.get(ANCHOR), by.get(PROBE), args)
    lines += _machine(facts)
    return "\n".join(lines)


def _setup(args, numel, nf):
    return [
        f"Model: TinyGPT(vocab={args.vocab}, block={args.block}, n_layer={args.n_layer}, "
        f"n_head={args.n_head}, n_embd={args.n_embd}), tied embeddings, Ψ = {numel:,} "
        f"parameters. bf16 (DeepSpeed's bf16 mode: bf16 params/grads, fp32 master + AdamW "
        f"state), AdamW(lr 1e-3, wd 0.01), gradient clipping {args.clip}, micro-batch "
        f"{args.micro_batch} x {args.block} tokens per rank, gradient_accumulation_steps 1, "
        f"reduce_bucket_size {args.bucket_numel:,}, overlap_comm true, pin_memory false (a CPU "
        f"build of torch cannot pin), {args.threads} torch thread(s) per rank (the engine's CPU "
        f"Adam uses the same count). {args.rounds} round(s); in each, every configuration runs "
        f"in fresh processes ({args.warmup} warm-up + {args.steps} measured steps), order "
        f"rotated per round; times pool the measured steps of all rounds.",
        "",
        f"NVMe swap directory: under `{nf.get('path')}` on `{nf.get('source')}` "
        f"({nf.get('fstype')}; not tmpfs; O_DIRECT {nf.get('o_direct')}; the kernel reports the "
        f"device rotational={nf.get('rotational')}). This is the VM's virtio disk, not a "
        f"dedicated NVMe drive.",
        "",
        "**This machine has no accelerator: the \"device\" is the CPU itself.** Device<->host "
        "copies are memcpys within the same DRAM, the non-offloaded optimizer step runs on the "
        "same cores as the offloaded one, and forward/backward compete with any host-side "
        "work for the same 2 cores. On a GPU the device step is much faster, the copies cross "
        "PCIe, and DPU has idle host cores to overlap into, so the time columns would differ; "
        "the byte columns would not.",
        "",
    ]


def _step_time_table(engines, by):
    lines = [
        "## Step time (ms; slower rank per step, median over the measured steps of all rounds)",
        "",
        "*forward*, *backward* (engine.backward, reductions included), *wait* (a barrier "
        "before the step: the other rank's lag), *engine.step()*: each the slower rank's, "
        "median, so they need not add up to the total.",
        "",
        "| config | total (p10) [per-round medians] | forward | backward | wait | "
        "engine.step() | vs z2 / z3 | CPU ms/step per rank | disk read / write per step "
        "(MiB/rank) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in engines:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED: "
                         f"{last_line(s['error'], 200)} | | | | | | | |")
            continue
        ref = by.get("z3" if s["config"].startswith("z3") else "z2")
        ratio = f"{s['ms']['total'] / ref['ms']['total']:.2f}x" if ref else "-"
        io = s["io_per_step"]
        lines.append(
            f"| {s['config']} | {s['ms']['total']:.0f} ({s['ms_p10']:.0f}) "
            f"[{', '.join(f'{m:.0f}' for m in s['round_medians_ms'])}] | "
            f"{s['ms']['forward']:.0f} | {s['ms']['backward']:.0f} | {s['ms']['sync']:.0f} | "
            f"{s['ms']['step']:.0f} | "
            f"{ratio} | {_pair(s['cpu_ms_per_step'], lambda x: f'{x:.0f}')} | "
            f"{_pair(io['read_bytes'])} / {_pair(io['write_bytes'])} |")
    return lines


def _paired_table(by):
    pairs = [(x, y) for x, y in PAIRS if x in by and y in by]
    if not pairs:
        return []
    lines = ["", "### Paired by round (ms): per round, this config's median minus the "
             "baseline's; median over rounds [min..max]", "",
             "Each round runs every configuration once, close together in time, so a "
             "per-round difference cancels slow load drift that pooled medians keep.", "",
             "| config - baseline | total | forward | backward | engine.step() |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for x, y in pairs:
        cells = []
        for k in ("total", "forward", "backward", "step"):
            d = paired(by, x, y, k)
            cells.append(f"{d['median']:+.0f} [{d['min']:+.0f}..{d['max']:+.0f}]")
        lines.append(f"| {x} - {y} | " + " | ".join(cells) + " |")
    return lines


def _location_table(engines):
    lines = [
        "",
        "## Model states by location and the other buffers (MiB per rank; rank 0 / rank 1 "
        "where they differ)",
        "",
        "| config | device | host | NVMe | = expected | formula (all locations) | staging "
        "(location) | device total peak (states + buckets + gathered) | RSS peak |",
        "| --- | ---: | ---: | ---: | :---: | --- | ---: | ---: | ---: |",
    ]
    for s in engines:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | | | |")
            continue
        m = [b["measured"] for b in s["by_location"]]
        st = s["categories"].get("staging")
        st_cell = (f"{_pair(s['staging_peak'])} ({', '.join(st['locations'])})"
                   if st and max(s["staging_peak"]) else "0")
        lines.append(
            f"| {s['config']} | {_pair([x['device'] for x in m])} | "
            f"{_pair([x['host'] for x in m])} | {_pair([x['nvme'] for x in m])} | "
            f"{'yes' if s['by_location_exact'] else '**no**'} | {s['model_state_formula']} | "
            f"{st_cell} | {_pair(s['device_total_peak'])} | {_pair(s['rss_peak_bytes'])} |")
    return lines


def _categories_table(engines):
    lines = ["", "### Categories (rank 0, MiB current, where they live)", "",
             "| config | param | gradient | fp32_master | optimizer_state | bucket | "
             "gathered_param (peak) | staging |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in engines:
        if "error" in s:
            continue
        cells = []
        for cat in ("param", "gradient", "fp32_master", "optimizer_state", "bucket",
                    "gathered_param", "staging"):
            c = s["categories"].get(cat)
            if not c or not c["peak"]:
                cells.append("-")
                continue
            value = c["peak"] if cat == "gathered_param" else c["current"]
            where = ",".join(x.replace("host_pageable", "host") for x in c["locations"])
            cells.append(f"{_mib(value)} ({where})")
        lines.append(f"| {s['config']} | " + " | ".join(cells) + " |")
    return lines


def _per_round_rows(summary):
    return [f"| {k} | {v:.1f} [{', '.join(f'{x:.1f}' for x in summary['ms_per_round'][k])}] |"
            for k, v in summary["ms"].items()]


def _anchor_table(anchor, summaries, args):
    if anchor:
        return (["", f"## Anchor: one process, {args.threads} thread, Ψ = {anchor['numel']:,}, "
                 f"Ψ/N = {anchor['shard_numel']:,} (ms, median; per round in brackets)", "",
                 "| what | ms |", "| --- | ---: |"] + _per_round_rows(anchor))
    if ANCHOR in [s["config"] for s in summaries]:
        return ["", "Anchor FAILED."]
    return []


def _probe_table(probe, args):
    if not probe:
        return []
    return (["", f"## gloo on this machine ({args.world_size} ranks, median of 7; ms, "
             "per round in brackets)", "", "| op | ms |", "| --- | ---: |"]
            + _per_round_rows(probe))


def _profile_table(profiled):
    if not profiled:
        return []
    lines = ["", "## Inside engine.step() (rank 0, one extra step per round under "
             "torch.profiler; medians over the rounds)", "",
             "Main-thread ATen / c10d ops by self CPU time. The fused CPU Adam kernel, the "
             "offload copy worker's memcpys outside ATen and the NVMe I/O are not ATen ops "
             "and do not appear; *wall* is the profiled step() wall time.", "",
             "| config | wall ms | ATen self CPU ms | top ops (self ms × calls) |",
             "| --- | ---: | ---: | --- |"]
    for s in profiled:
        sp = s["step_profile"]
        top = ", ".join(f"{t['op']} {t['self_cpu_ms']:.1f}×{t['calls']}"
                        for t in sp["top"][:5])
        lines.append(f"| {s['config']} | {sp['wall_ms']:.0f} | "
                     f"{sp['self_cpu_ms_total']:.0f} | {top} |")
    return lines


def _nvme_files(sf):
    if not sf:
        return []
    files = ", ".join(f"{k} {_mib(v)} MiB" for d in sf["swap_files"] for k, v in d.items())
    return ["", f"NVMe: swap files per rank {files}; "
            f"I/O backend `{sf['offload_info'][0]['swap'].split(' (')[-1].rstrip(')')}`; "
            f"files left after the processes exited: "
            f"{sum(len(x or []) for x in sf['swap_files_left_after_exit'])}."]


def _machine(facts):
    nf = facts.get("nvme", {})
    return machine_section(facts, more=[
        f"$ findmnt -T {nf.get('path')} -o TARGET,SOURCE,FSTYPE", nf.get("findmnt", "")]) + [
        f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}.",
        "",
        f"Load: /proc/loadavg at start `{facts['loadavg_start']}`, at end "
        f"`{facts['loadavg_end']}`; 1-min load sampled every 5 s: "
        f"{facts.get('loadavg_samples_text', 'n/a')}. The machine has "
        f"{facts['nproc']} cores; a load above {facts['nproc']} means other processes "
        f"shared them during the run (the rounds and rotation spread that over all "
        f"configurations, the per-round medians show how much it moved).",
        "",
        engine_under_test(facts) + _engine_tree(facts) + _checkout(facts) + ".", ""]


def _engine_tree(facts):
    """Whether the engine's tree had uncommitted changes, or how its snapshot was made."""
    if facts.get("zero_is_git_tree", True):
        return (" (with uncommitted changes under zero/ or csrc/)"
                if facts["zero_tree_dirty"] else " (zero/ and csrc/ clean)")
    return (" -- a snapshot, not a git tree: `git archive <commit> "
            f"{' '.join(facts.get('zero_root_packages') or ['zero'])} | tar -x -C "
            f"{facts['zero_root']} && cp zero/_C*.so {facts['zero_root']}/zero/` "
            "(the commit's Python packages plus the extension already built in the "
            "checkout, copied, not rebuilt), so edits to the checkout during the run "
            "could not reach it; the ranks imported "
            f"{', '.join(f'`{m}`' for m in facts.get('modules_imported', []))}")


def _checkout(facts):
    """The extension's hash and the checkout's commit (at the start and the end, when it
    moved during the run) and status."""
    moved = facts.get("checkout_commit_at_start") not in (None, facts["checkout_commit"])
    return (f"; extension sha256 {facts['zero_extension_sha256']}…; checkout "
            + (f"{facts['checkout_commit_at_start']} at the start, " if moved else "")
            + f"{facts['checkout_commit']}" + (" at the end" if moved else "")
            + (" with uncommitted changes: `" + " ".join(
                facts["checkout_dirty"].split())[:300] + "`"
               if facts["checkout_dirty"] else " (clean)"))


# ---- what the numbers say ------------------------------------------------------------------
NEEDED = ("z2", "z2-cpu", "z2-cpu-dpu", "z2-nvme", "z3", "z3-cpu-param", "z2-cpu-r0.5")


def findings(by, anchor, probe, args):
    """Six sentences, every number from this run; the wording that depends on a sign or on the
    noise is chosen from the data."""
    out = ["", "## Findings", ""]
    if any(k not in by for k in NEEDED) or not anchor or not probe:
        out.append("(some configurations failed or were not run; no findings written)")
        return out
    out.append(_saves(by))
    out.append(_costs(by, anchor["ms"]))
    out.append(_dpu(by, anchor["ms"]))
    out.append(_nvme(by, args))
    out.append(_where_time_goes(by, probe["ms"]))
    out.append(
        "6. **On a GPU the time columns would differ:** the device update takes a few ms, the "
        "copies cross PCIe (pinned memory, which this CPU build cannot use) and the host "
        "cores idle during forward/backward, so offload typically costs step time there and "
        "DPU has something to overlap; only the byte columns carry over.")
    if all(k in by for k in ("z3-cpu-pnvme", "z3-infinity")):
        out.append(_infinity(by))
    return out


def _saves(by):
    z2, cpu, dpu, nvme, z3, z3p, half = (by[k] for k in NEEDED)
    exact = all(s["by_location_exact"] for s in by.values() if "by_location" in s)
    return (
        f"1. **Saves (device).** CPU offload takes the fp32 master, Adam m, v and the gradient "
        f"shard (12Ψ/N + 2Ψ/N = {_mib(_loc(cpu, 'host'))} MiB per rank) off the device, so "
        f"device model states fall "
        f"from {_mib(_loc(z2, 'device'))} to {_mib(_loc(cpu, 'device'))} MiB per rank at stage 2 "
        f"(-{1 - _loc(cpu, 'device') / _loc(z2, 'device'):.0%}; ratio 0.5 keeps "
        f"{_mib(_loc(half, 'device'))} MiB there) and, with offload_param too, from "
        f"{_mib(_loc(z3, 'device'))} to {_mib(_loc(z3p, 'device'))} MiB at stage 3 "
        f"(-{1 - _loc(z3p, 'device') / _loc(z3, 'device'):.0%}), byte for byte as the engine "
        f"expects ({'every' if exact else '**not every**'} row), while the host adds staging "
        f"({_pair(cpu['staging_peak'])} MiB; {_pair(dpu['staging_peak'])} with DPU; "
        f"{_pair(nvme['staging_peak'])} for NVMe, nearly the {_mib(_loc(nvme, 'nvme'))} MiB it "
        f"put on disk, because it holds two 4M-element chunks of each array) -- and since "
        f"device and host are the same DRAM here, process RSS does not fall (peak "
        f"{_mib(_rss(z2))} MiB for z2 vs {_mib(_rss(cpu))} for z2-cpu).")


ADAM_FUSED = "zero._C.cpu_adam_step, Ψ/N, bf16 grads + bf16 copy"
ADAM_OPS = "torch AdamW(foreach=False), one flat Ψ/N fp32 tensor (op by op)"
MEMCPY = "memcpy Ψ/N bf16 (one staging copy)"


def _costs(by, a):
    z2, cpu, z3, z3p = by["z2"], by["z2-cpu"], by["z3"], by["z3-cpu-param"]
    d_cpu, d_z3, d_half = (paired(by, x, y) for x, y in
                           (("z2-cpu", "z2"), ("z3-cpu-param", "z3"), ("z2-cpu-r0.5", "z2")))
    return (
        f"2. **Costs (time, here).** Paired by round, CPU offload changes the stage-2 step by "
        f"{_rng(d_cpu)} ({_verdict(d_cpu)}; engine.step() {z2['ms']['step']:.0f} -> "
        f"{cpu['ms']['step']:.0f} ms), optimizer + parameter offload the stage-3 step by "
        f"{_rng(d_z3)} ({_verdict(d_z3)}; step() {z3['ms']['step']:.0f} -> "
        f"{z3p['ms']['step']:.0f} ms) and ratio 0.5 by {_rng(d_half)} ({_verdict(d_half)}). "
        f"On this CPU-only machine the offloaded step runs the fused CPU Adam "
        f"({a[ADAM_FUSED]:.0f} ms on Ψ/N; torch AdamW(fused=True): "
        f"{a['torch AdamW(fused=True), one flat Ψ/N fp32 tensor']:.0f} ms on Ψ/N, "
        f"{a['torch AdamW(fused=True), model params, Ψ fp32']:.0f} ms on all Ψ in one "
        f"process) where the non-offloaded one updates op by op in ATen (~{a[ADAM_OPS]:.0f} ms "
        f"by torch's for-loop AdamW on Ψ/N), and a device<->host copy is a {a[MEMCPY]:.1f} ms "
        f"memcpy of Ψ/N bf16.")


def _dpu(by, a):
    d_dpu, d_dpu_step = paired(by, "z2-cpu-dpu", "z2-cpu"), paired(by, "z2-cpu-dpu", "z2-cpu",
                                                                   "step")
    fb = (paired(by, "z2-cpu-dpu", "z2-cpu", "forward")["median"]
          + paired(by, "z2-cpu-dpu", "z2-cpu", "backward")["median"])
    hideable = max(-d_dpu_step["median"], 0.0)
    return (
        f"3. **DPU.** delayed_update changes engine.step() by {_rng(d_dpu_step)} "
        f"({_verdict(d_dpu_step)}), roughly the host update it moves onto the updater thread "
        f"(fused CPU Adam ~{a[ADAM_FUSED]:.0f} ms plus Ψ/N copies of ~{a[MEMCPY]:.0f} ms each, "
        f"some of which DPU adds back: grads into its own buffer, the previous update's "
        f"parameters applied), while forward + backward change by {fb:+.0f} ms and the whole "
        f"step by {_rng(d_dpu)} ({_verdict(d_dpu)}): all DPU can hide here is "
        f"~{hideable:.0f} ms of a ~{by['z2-cpu']['ms']['total']:.0f} ms step, because step() "
        f"is dominated by the all-gather and the norm, which it does not move.")


def _nvme(by, args):
    d_nvme, d_nvme_step = paired(by, "z2-nvme", "z2-cpu"), paired(by, "z2-nvme", "z2-cpu", "step")
    io = by["z2-nvme"]["io_per_step"]
    io_bytes = sum(io["read_bytes"]) + sum(io["write_bytes"])
    return (
        f"4. **NVMe.** The swap file adds {_rng(d_nvme)} per step over host memory "
        f"({_verdict(d_nvme)}; {_ms(d_nvme_step['median'])} ms of it in engine.step()), "
        f"because every step reads and writes the whole 12Ψ/N state with O_DIRECT "
        f"({_pair(io['read_bytes'])} MiB read + {_pair(io['write_bytes'])} MiB written per "
        f"rank, ~{io_bytes / MIB / max(d_nvme_step['median'] / 1e3, 1e-9):.0f} MiB/s for both "
        f"ranks over the added time) on {args.nvme_fs}, the VM's virtio disk, not a local NVMe "
        f"drive.")


def _step_op_ms(by, op):
    """The median over every configuration's profiled steps of one op's self CPU ms."""
    return median([t["self_cpu_ms"] for s in by.values() if "step_profile" in s
                 for t in s["step_profile"]["top"] if t["op"] == op])


def _where_time_goes(by, g):
    z2 = by["z2"]
    reduce_scatter = g["reduce_scatter Ψ -> Ψ/N bf16 (backward's gradient reduction)"]
    gather = g["all_gather Ψ/N -> Ψ bf16 (the step's parameter gather)"]
    return (
        f"5. **Where the time goes.** Forward + backward are "
        f"{z2['ms']['forward'] + z2['ms']['backward']:.0f} of the {z2['ms']['total']:.0f} ms z2 "
        f"step (backward includes the reduce-scatters; gloo needs {reduce_scatter:.0f} ms for "
        f"Ψ bf16), and engine.step() is mostly the parameter all-gather ({gather:.0f} "
        f"ms on gloo; stage 3 has none, hence its shorter step), one aten::pow of "
        f"~{_step_op_ms(by, 'aten::pow'):.0f} ms in the global gradient norm, "
        f"~{_step_op_ms(by, 'aten::copy_'):.0f} ms of aten::copy_ and, "
        f"without offload, the op-by-op update (table above).")


def _infinity(by):
    z3p, pn, inf = by["z3-cpu-param"], by["z3-cpu-pnvme"], by["z3-infinity"]
    d_pn, d_inf = paired(by, "z3-cpu-pnvme", "z3-cpu-param"), paired(by, "z3-infinity",
                                                                      "z3-cpu-pnvme")
    io_pn, io_inf = pn["io_per_step"], inf["io_per_step"]
    return (
        f"7. **Parameters on NVMe (ZeRO-Infinity).** offload_param nvme moves the "
        f"{_mib(_loc(pn, 'nvme'))} MiB bf16 parameter shard from host memory to the swap "
        f"file (host model states {_mib(_loc(z3p, 'host'))} -> {_mib(_loc(pn, 'host'))} MiB; "
        f"the host keeps buffer_count buffers of one unit each, staging "
        f"{_pair(pn['staging_peak'])} MiB) at {_rng(d_pn)} per step over parameters in "
        f"host memory ({_verdict(d_pn)}; {_pair(io_pn['read_bytes'])} MiB read + "
        f"{_pair(io_pn['write_bytes'])} MiB written per rank per step: each unit is read "
        f"for forward and again for backward when the buffers cannot hold it, and written "
        f"once by the step). With the optimizer on NVMe too, device model states are "
        f"{_mib(_loc(inf, 'device'))} MiB and host {_mib(_loc(inf, 'host'))} MiB per rank, "
        f"everything else ({_mib(_loc(inf, 'nvme'))} MiB) on disk, at {_rng(d_inf)} more "
        f"per step ({_verdict(d_inf)}; {_pair(io_inf['read_bytes'])} MiB read + "
        f"{_pair(io_inf['write_bytes'])} MiB written per rank per step).")
