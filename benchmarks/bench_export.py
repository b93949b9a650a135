"""zero_to_fp32 export: time and peak memory against model size.

    python benchmarks/bench_export.py                 # writes benchmarks/results/export.{md,json}
    python benchmarks/bench_export.py --sizes 5M --repeats 1 --out /tmp/bench    # smoke test

For each TinyGPT size a checkpoint is saved by a 2-rank stage-2 bf16 engine after one step
(fp32 master and Adam state in the rank files, bf16 weights in model_states.pt). Then every
export below runs in a fresh worker process (zero, torch, safetensors and tqdm imported first),
so the process's memory belongs to that export alone:

* state_dict         get_fp32_state_dict_from_zero_checkpoint: the whole fp32 dict in memory
* lazy               the same with lazy_mode=True, each tensor built by .contiguous() and dropped
* bin                convert_zero_checkpoint_to_fp32_state_dict: pytorch_model.bin (5GB default
                     shard size, so one file at these sizes)
* bin-100MB          the same, sharded at max_shard_size="100MB", with the index
* safetensors        model.safetensors, one file
* safetensors-100MB  safetensors shards of at most 100MB, with the index
* verify             only what every export does first: open the checkpoint and check every
                     file it reads against the manifest's SHA-256 (the whole rank files, Adam
                     moments included, though only the fp32 master is exported)

Per export: the wall time, and the peak of the process's anonymous resident memory (RssAnon,
sampled every 2 ms on a thread; the kernel keeps no anonymous-only peak) above its value just
before the export. Anonymous memory is what the export allocates. The resident set (VmRSS, and
ru_maxrss) also counts the page-cache pages of the memory-mapped rank files the export reads,
which the kernel can drop at any time; its peak (VmHWM, reset before the export) is reported
beside it to show the difference. The rank files were written just before, so they are read
from the page cache; the outputs go to --work-dir (written to the page cache, not fsynced).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.launch import run_worker, spawn_ranks  # noqa: E402
from benchmarks.memory import AnonPeak, proc_status, reset_peak_rss  # noqa: E402
from benchmarks.models import (count_params, engine_config, gpt_config, rank_batches,  # noqa: E402
                               seeded_model)
from benchmarks.report import header, machine_section, markdown_table, publish  # noqa: E402
from benchmarks.timing import rotated  # noqa: E402

SIZES = {  # TinyGPT (block 128, 8 heads): name -> vocab, n_layer, n_embd
    "5M": (8192, 4, 256),
    "34M": (16384, 8, 512),
    "65M": (24576, 10, 640),
    "110M": (32768, 12, 768),
}
MODES = ["verify", "state_dict", "lazy", "bin", "bin-100MB", "safetensors", "safetensors-100MB"]
MB = 10**6


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated subset of "
                        + ",".join(SIZES))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of "
                        + ",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3, help="exports of each (size, mode), "
                        "each in a fresh process; the mode order rotates every repeat")
    parser.add_argument("--stage", type=int, default=2, help="ZeRO stage of the saving engine")
    parser.add_argument("--world-size", type=int, default=2, help="ranks that save")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--work-dir", default="/var/tmp", help="where checkpoints and exports "
                        "go (removed afterwards)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                        help="directory of export.{md,json} ('' prints only)")
    parser.add_argument("--worker-mode", help=argparse.SUPPRESS)
    parser.add_argument("--worker-checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    parser.add_argument("--worker-result", help=argparse.SUPPRESS)
    return parser.parse_args()


def _sizes(name: str) -> dict:
    vocab, n_layer, n_embd = SIZES[name]
    return {"vocab": vocab, "block": 128, "n_layer": n_layer, "n_head": 8, "n_embd": n_embd}


# ---- the checkpoints: one 2-rank engine per size ----------------------------------------------
def _save_rank(rank, world, name, args) -> dict:
    import zero

    gpt = gpt_config(_sizes(name))
    model = seeded_model(gpt)
    params = count_params(model)
    config = engine_config(1, 1.0, {"stage": args.stage}, bf16=True)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    tokens, targets = rank_batches(gpt, 1, 1, rank)[0]
    engine.backward(engine(tokens, targets))
    engine.step()
    engine.save_checkpoint(os.path.join(args.checkpoints, name))
    engine.destroy()
    return {"params": params}


def _checkpoint_facts(path: str) -> dict:
    """Sizes of what a saved checkpoint holds: its files, the fp32 export's bytes and its
    largest tensor."""
    from zero import checkpoint_export

    tag_dir, _ = checkpoint_export.open_checkpoint(path)
    entries, _ = checkpoint_export.checkpoint_entries(path)
    return {"files": {f: os.path.getsize(os.path.join(tag_dir, f))
                      for f in sorted(os.listdir(tag_dir))},
            "fp32_bytes": sum(e.nbytes for e in entries),
            "largest_tensor_bytes": max(e.nbytes for e in entries),
            "tensors": len(entries)}


# ---- one export in a fresh process ------------------------------------------------------------
def _export(mode: str, checkpoint: str, output: str):
    from zero import checkpoint_export as export

    if mode == "verify":
        from zero.checkpoint_layout import located_arrays

        path, [(names, model_state)] = export.open_checkpoint(checkpoint)
        return located_arrays(path, model_state, "master", names=names)
    if mode == "state_dict":
        return export.get_fp32_state_dict_from_zero_checkpoint(checkpoint)
    if mode == "lazy":
        state = export.get_fp32_state_dict_from_zero_checkpoint(checkpoint, lazy_mode=True)
        for lazy in {id(v): v for v in state.values()}.values():
            value = lazy.contiguous()
            del value
        return None
    shard = "100MB" if mode.endswith("-100MB") else export.DEFAULT_MAX_SHARD_SIZE
    return export.convert_zero_checkpoint_to_fp32_state_dict(
        checkpoint, output, max_shard_size=shard, safe_serialization=mode.startswith("safe"))


def worker(args) -> dict:
    import torch
    import safetensors.torch  # noqa: F401  (imported before the baseline, as zero imports it)
    import tqdm  # noqa: F401
    from zero import checkpoint_export  # noqa: F401

    torch.set_num_threads(args.threads)
    gc.collect()
    before = proc_status()
    hwm_reset = reset_peak_rss()
    t0 = time.perf_counter()
    with AnonPeak() as peak:
        kept = _export(args.worker_mode, args.worker_checkpoint, args.worker_output)
        elapsed = time.perf_counter() - t0
    del kept
    after = proc_status()
    files = {f: os.path.getsize(os.path.join(args.worker_output, f))
             for f in sorted(os.listdir(args.worker_output))} \
        if os.path.isdir(args.worker_output) else {}
    return {"mode": args.worker_mode, "wall_s": elapsed, "anon_before": before["RssAnon"],
            "anon_peak": peak.peak, "anon_samples": peak.samples,
            "rss_before": before["VmRSS"], "rss_peak": after["VmHWM"] if hwm_reset else None,
            "files": files}


def _run_export(args, name: str, mode: str, checkpoint: str) -> dict:
    output = tempfile.mkdtemp(prefix=f"export_{name}_{mode}_", dir=args.work)
    shutil.rmtree(output)  # the export makes it
    command = [sys.executable, os.path.abspath(__file__), "--worker-mode", mode,
               "--worker-checkpoint", checkpoint, "--worker-output", output,
               "--threads", str(args.threads)]
    try:
        result, proc = run_worker(command, "--worker-result", dict(os.environ), capture=True)
        if result is None:
            result = {"mode": mode, "error": (proc.stderr or "no result")[-2000:]}
    finally:
        shutil.rmtree(output, ignore_errors=True)
    result["size"] = name
    print(f"[{name} {mode}] " + (f"{result['wall_s']:.2f} s, anon peak +"
                                 f"{(result['anon_peak'] - result['anon_before']) / MB:.1f} MB"
                                 if "error" not in result else result["error"][-300:]),
          flush=True)
    return result


# ---- the report -------------------------------------------------------------------------------
def _bound(mode: str, facts: dict, files: dict) -> tuple[str, int]:
    """What the export's anonymous peak should be bounded by, and its bytes."""
    if mode == "verify":
        return "nothing", 0
    if mode == "state_dict":
        return "the fp32 model", facts["fp32_bytes"]
    if mode == "lazy":
        return "largest tensor", facts["largest_tensor_bytes"]
    shards = {f: b for f, b in files.items() if not f.endswith(".json")}
    return "largest file", max(shards.values())


def summarize(res: dict) -> list[dict]:
    rows = []
    for name in res["args"]["sizes"]:
        facts = res["checkpoints"][name]
        for mode in res["args"]["modes"]:
            runs = [r for r in res["exports"] if r["size"] == name and r["mode"] == mode]
            good = [r for r in runs if "error" not in r]
            if not good:
                rows.append({"size": name, "mode": mode, "error": runs[0]["error"] if runs
                             else "not run"})
                continue
            what, bound = _bound(mode, facts, good[0]["files"])
            anon = [r["anon_peak"] - r["anon_before"] for r in good]
            rss = [r["rss_peak"] - r["rss_before"] for r in good if r["rss_peak"] is not None]
            times = [r["wall_s"] for r in good]
            rows.append({
                "size": name, "mode": mode, "params": facts["params"],
                "fp32_bytes": facts["fp32_bytes"], "files": len(good[0]["files"]),
                "checkpoint_bytes": sum(facts["files"].values()),
                "output_bytes": sum(good[0]["files"].values()),
                "median_s": statistics.median(times), "min_s": min(times), "runs": len(good),
                "anon_peak_max": max(anon), "anon_peak_median": statistics.median(anon),
                "bound": what, "bound_bytes": bound, "rss_peak_max": max(rss) if rss else None})
    return rows


def render(res: dict) -> str:
    rows = summarize(res)
    facts = res["machine"]
    lines = header("zero_to_fp32 export: time and peak memory against model size",
                   "bench_export.py", facts["date"], res["wall_s"], res["command"])
    lines += [
        f"Engine under test: `{facts['zero_root']}` at commit {facts['zero_commit']}"
        + (f" (uncommitted changes under zero/ or csrc/: `{facts['zero_dirty']}`)"
           if facts["zero_dirty"] else "") + ".", "",
        f"Each TinyGPT (block 128, 8 heads) was saved by a {res['args']['world_size']}-rank "
        f"stage-{res['args']['stage']} bf16 engine after one step; each export ran "
        f"{res['args']['repeats']} times, every time in a fresh process with "
        f"{res['args']['threads']} torch thread(s), the mode order rotated per repeat. The rank "
        "files are memory-mapped and were in the page cache (written just before); outputs were "
        "written to the page cache of a disk-backed directory, not fsynced.", "",
        "* **time**: the export call's wall time, median (and min) over the repeats; **MB/s**: "
        "fp32 bytes exported per second at the median.",
        "* **anon peak**: the highest RssAnon (anonymous resident memory: what the export "
        "allocated) sampled every 2 ms during the export, minus its value just before, the "
        "largest over the repeats. **÷ bound**: that over what the export must hold at once: "
        "the whole fp32 model for `state_dict`, the largest tensor for `lazy`, the largest "
        "output file for the file exports.",
        "* **RSS peak**: VmHWM (reset before the export) minus VmRSS before: this also counts "
        "the page-cache pages of the memory-mapped rank files as they are read, which the "
        "kernel reclaims under pressure; it is what `ru_maxrss` and `top` would show.", "",
        "## Results", ""]
    table = []
    for row in rows:
        if "error" in row:
            table.append([row["size"], "", "", f"`{row['mode']}`",
                          "error: " + row["error"][-120:]] + [""] * 7)
            continue
        verify = row["mode"] == "verify"
        table.append([
            row["size"], f"{row['params'] / 1e6:.1f}M", f"{row['fp32_bytes'] / MB:.0f}",
            f"`{row['mode']}`", "" if verify else row["files"] or "(memory)",
            f"{row['output_bytes'] / MB:.0f}" if row["output_bytes"] else "",
            f"{row['median_s']:.2f} ({row['min_s']:.2f})",
            f"{(row['checkpoint_bytes'] if verify else row['fp32_bytes']) / MB / row['median_s']:.0f}",
            f"{row['anon_peak_max'] / MB:.1f}",
            "" if verify else f"{row['bound']}: {row['bound_bytes'] / MB:.0f}",
            "" if verify else f"{row['anon_peak_max'] / row['bound_bytes']:.2f}",
            f"{row['rss_peak_max'] / MB:.1f}" if row["rss_peak_max"] is not None else "n/a"])
    lines.append(markdown_table(
        ["model", "Ψ", "fp32 MB", "mode", "files", "output MB", "time s, median (min)",
         "MB/s", "anon peak MB", "bound MB", "÷ bound", "RSS peak MB"], table))
    lines += ["", "MB/s: fp32 bytes exported per second; for `verify`, checkpoint bytes hashed "
              "per second. MB = 10^6 bytes.", "", "## What it shows", ""] + _findings(rows)
    lines += ["", "## Checkpoints", "", markdown_table(
        ["model", "Ψ", "model_states.pt MB", "rank files MB (each)", "tensors exported",
         "largest tensor MB"],
        [[name, f"{c['params'] / 1e6:.1f}M", f"{c['files']['model_states.pt'] / MB:.0f}",
          " / ".join(f"{b / MB:.0f}" for f, b in c["files"].items() if f.startswith("zero_rank")),
          c["tensors"], f"{c['largest_tensor_bytes'] / MB:.0f}"]
         for name, c in res["checkpoints"].items()])]
    lines += machine_section(facts)
    lines += [f"Load average (1 min) during the run: {res['load']}.", ""]
    return "\n".join(lines)


def _findings(rows: list[dict]) -> list[str]:
    """Per mode, how the anonymous peak and the time scale from the smallest model to the
    largest; then what the integrity check costs of each export of the largest."""
    out = []
    good = [r for r in rows if "error" not in r]
    for mode in dict.fromkeys(r["mode"] for r in good):
        runs = [r for r in good if r["mode"] == mode]
        if len(runs) < 2 or mode == "verify":
            continue
        small, large = runs[0], runs[-1]
        ratios = [r["anon_peak_max"] / r["bound_bytes"] for r in runs]
        out.append(
            f"* `{mode}`: model {small['fp32_bytes'] / MB:.0f} → {large['fp32_bytes'] / MB:.0f} "
            f"MB ({large['fp32_bytes'] / small['fp32_bytes']:.0f}×): anon peak "
            f"{small['anon_peak_max'] / MB:.0f} → {large['anon_peak_max'] / MB:.0f} MB, "
            f"{min(ratios):.2f}-{max(ratios):.2f}× its bound ({large['bound']}); time "
            f"{small['median_s']:.2f} → {large['median_s']:.2f} s.")
    largest = good[-1]["size"] if good else None
    verify = next((r for r in good if r["size"] == largest and r["mode"] == "verify"), None)
    if verify is not None:
        shares = ", ".join(f"`{r['mode']}` {verify['median_s'] / r['median_s']:.0%}"
                           for r in good if r["size"] == largest and r["mode"] != "verify")
        out.append(
            f"* Checking the files against the manifest (`verify`: SHA-256 of all "
            f"{verify['checkpoint_bytes'] / MB:.0f} MB of the {largest} checkpoint, the Adam "
            f"moments included) takes {verify['median_s']:.2f} s of each export's median time: "
            f"{shares}.")
    return out


def main() -> None:
    args = parse_args()
    if args.worker_result:
        try:
            result = worker(args)
        except BaseException as exc:  # noqa: BLE001 -- the parent reports it
            result = {"mode": args.worker_mode,
                      "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        with open(args.worker_result, "w") as f:
            json.dump(result, f)
        return

    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [s for s in args.sizes if s not in SIZES] + [m for m in args.modes if m not in MODES]
    if unknown:
        sys.exit(f"unknown sizes or modes {unknown}; sizes {list(SIZES)}, modes {MODES}")
    command = command_line()
    t_start = time.perf_counter()
    load = machine.LoadSampler()
    load.start()
    args.work = tempfile.mkdtemp(prefix="bench_export_", dir=args.work_dir)
    args.checkpoints = os.path.join(args.work, "checkpoints")
    try:
        checkpoints = {}
        for name in args.sizes:
            saved = spawn_ranks(_save_rank, name, args, args.work)
            if "error" in saved:
                sys.exit(f"saving the {name} checkpoint failed: {saved['error']}")
            checkpoints[name] = {"params": saved["ranks"][0]["params"], "save_wall_s":
                                 saved["wall_s"],
                                 **_checkpoint_facts(os.path.join(args.checkpoints, name))}
            print(f"[{name}] saved in {saved['wall_s']:.1f} s: "
                  f"{json.dumps(checkpoints[name]['files'])}", flush=True)
        exports = []
        for repeat in range(args.repeats):
            for name in args.sizes:
                for mode in rotated(args.modes, repeat):
                    exports.append(_run_export(args, name, mode,
                                               os.path.join(args.checkpoints, name)))
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
        load.stop()
    facts = {**machine.host_facts(), "date": machine.utc_now(), "zero_root": ZERO_ROOT,
             "zero_commit": machine.git_commit(ZERO_ROOT),
             "zero_dirty": machine.tree_dirty(ZERO_ROOT),
             "extension_sha256": machine.extension_sha256(ZERO_ROOT),
             **machine.checkout_facts(ROOT)}
    res = {"command": command,
           "args": {k: v for k, v in vars(args).items() if not k.startswith("worker")
                    and k not in ("work", "checkpoints")},
           "machine": facts, "checkpoints": checkpoints, "exports": exports,
           "load": machine.load_range(load.samples) if load.samples else "not sampled",
           "wall_s": time.perf_counter() - t_start}
    res["summary"] = summarize(res)
    publish(args.out, "export", render(res), res)


if __name__ == "__main__":
    main()
