"""zero's CPU Adam/AdamW kernel against torch's and DeepSpeed's, side by side, in one invocation.

    python benchmarks/bench_cpu_adam.py                     # the full run (~3-5 min on 2 cores)
    python benchmarks/bench_cpu_adam.py --sizes 2M --threads 1 --out /tmp/bench   # smoke test

For every thread count a fresh worker process runs (OMP_NUM_THREADS, MKL_NUM_THREADS and
torch.set_num_threads all set to it, so DeepSpeed's OpenMP kernel gets the same count) and, for
every size n, times one AdamW step on ONE flat fp32 tensor of n parameters:

* zero-<isa>        zero._C.cpu_adam_step(..., isa=<isa>, num_threads=t), fp32 grads, for each
                    ISA this CPU runs (scalar / avx2 / avx512; probed, not assumed);
* zero-<isa>-bf16   the best ISA with bf16 grads and a bf16 copy of the new weights (out16);
* torch-fused       torch.optim.AdamW(fused=True);
* torch-default     torch.optim.AdamW() with no implementation flag. On CPU this resolves to the
                    for-loop (single-tensor) implementation, not foreach: torch only defaults to
                    foreach on cuda/xpu/mtia/privateuse1;
* torch-foreach     torch.optim.AdamW(foreach=True);
* deepspeed         deepspeed.ops.adam.DeepSpeedCPUAdam (its cpu_adam op, JIT-built with
                    -march=native and OpenMP on first use; a failure is recorded, not faked).

Hyperparameters everywhere: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01, AdamW
(decoupled decay), bias correction on, grad scale 1.

Timing: zero's vector kernels, torch fused, DeepSpeed and the bandwidth probes are held in
memory together (~10.5 GB at n = 200M) and stepped round-robin, one step each per round, the
order rotated every round, so load from other processes hits them alike; zero scalar, torch's
for-loop and foreach implementations (an order of magnitude slower) run one after the other
afterwards.

Per (n, threads, implementation): the median wall time of one step over the measured steps
(after warm-up; at least --min-steps, up to --steps), params/s, the effective bandwidth at the
bytes one step must move, and the ratio to the memory-bandwidth floor measured in the same worker:

* bytes per parameter per step: fp32 grads: read p, g, m, v (16 B) + write p, m, v (12 B) = 28 B.
  bf16 grads + bf16 copy: read p, m, v (12) + g (2) + write p, m, v (12) + copy (2) = 28 B too.
  The written lines were just read, so no write-allocate (read-for-ownership) traffic is added.
* bandwidth (best of the measured rounds, as STREAM reports it), on fp32 buffers of n
  elements, same thread count, interleaved with the fast implementations: `a.copy_(b)`, the triad
  `torch.add(b, c, alpha=s, out=a)`, and the in-place axpy `a.add_(b, alpha=s)`. Each is given
  in the STREAM convention (copy 8 B, triad 12 B, axpy 12 B per element) and as actual DRAM
  traffic (copy and triad write lines they did not read, so each costs one more read for
  ownership: 12 B and 16 B; axpy writes what it read: 12 B). The floor uses the highest actual
  traffic rate of the three: floor = 28 B * n / that rate.

A correctness check runs in every worker before the timings: 3 AdamW steps on n = --check-n (not
a multiple of 16, so the vector tails run) from the same start with the same 3 gradients, zero
(each ISA, num_threads = t; and bf16 grads vs torch fed the same bf16 grads widened to fp32)
against torch fused; the max elementwise relative error on the parameters must be <= 1e-6.
DeepSpeed's result is compared with torch fused too (reported, not required to pass).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZERO_ROOT = os.path.abspath(os.environ.get("ZERO_ROOT", ROOT))
if ZERO_ROOT not in sys.path:
    sys.path.insert(0, ZERO_ROOT)

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
BYTES_PER_PARAM = 28
TOL = 1e-6
ISAS = ("scalar", "avx2", "avx512")


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"({exc})"


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


# ----------------------------------------------------------------------------------- worker
def time_steps(fn, warmup: int, steps: int, min_steps: int, budget_s: float) -> list[float]:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < steps:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_steps and sum(times) > budget_s:
            break
    return times


def rel_err(a, b) -> float:
    import torch
    return float(((a - b).abs() / b.abs().clamp_min(1e-30)).max())


def worker(args) -> dict:
    import torch
    threads = args.worker_threads
    torch.set_num_threads(threads)
    import zero  # noqa: F401
    import zero._C as C

    out: dict = {"threads": threads, "torch_threads": torch.get_num_threads(),
                 "env_OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                 "loadavg_start": loadavg(), "isa_probe": {}, "check": {}, "sizes": {}}

    # --- which ISAs run here
    isas = []
    for isa in ISAS:
        p, g, m, v = (torch.zeros(64) for _ in range(4))
        try:
            C.cpu_adam_step(p, g, m, v, LR, *BETAS, EPS, WD, True, True, 1, 1.0, None, isa, 1)
            isas.append(isa)
            out["isa_probe"][isa] = "ok"
        except Exception as exc:  # noqa: BLE001
            out["isa_probe"][isa] = f"{type(exc).__name__}: {exc}"
    best = isas[-1]
    out["isas"], out["best_isa"] = isas, best

    # --- DeepSpeed (import + JIT build of its op on first use)
    ds_cls, ds_error = None, None
    if not args.no_deepspeed:
        try:
            t0 = time.perf_counter()
            import deepspeed
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            probe = torch.nn.Parameter(torch.zeros(32))
            probe.grad = torch.ones(32)
            DeepSpeedCPUAdam([probe], lr=LR).step()
            ds_cls = DeepSpeedCPUAdam
            out["deepspeed_version"] = deepspeed.__version__
            out["deepspeed_load_s"] = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001  (the JIT build can sys.exit)
            ds_error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
            out["deepspeed_error"] = ds_error
    else:
        out["deepspeed_error"] = "skipped (--no-deepspeed)"

    def torch_opt(P, kind):
        if kind == "torch-fused":
            return torch.optim.AdamW([P], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
        if kind == "torch-foreach":
            return torch.optim.AdamW([P], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                     foreach=True)
        if kind == "torch-default":
            return torch.optim.AdamW([P], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        if kind == "deepspeed":
            return ds_cls([P], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        raise ValueError(kind)

    # --- correctness: 3 steps, zero vs torch fused
    n = args.check_n
    gen = torch.Generator().manual_seed(1234)
    p0 = torch.randn(n, generator=gen)
    grads = [torch.randn(n, generator=gen) * 0.1 for _ in range(3)]
    grads16 = [g.bfloat16() for g in grads]

    def run_torch(kind, gs):
        P = torch.nn.Parameter(p0.clone())
        opt = torch_opt(P, kind)
        for g in gs:
            P.grad = g.clone()
            opt.step()
        return P.detach()

    ref = run_torch("torch-fused", grads)
    ref16 = run_torch("torch-fused", [g.float() for g in grads16])
    for isa in isas:
        for variant, gs, r in (("fp32", grads, ref), ("bf16", grads16, ref16)):
            p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
            o16 = torch.empty(n, dtype=torch.bfloat16) if variant == "bf16" else None
            for s, g in enumerate(gs, 1):
                C.cpu_adam_step(p, g, m, v, LR, *BETAS, EPS, WD, True, True, s, 1.0, o16, isa,
                                threads)
            e = rel_err(p, r)
            rec = {"max_rel_err": e, "n_differing": int((p != r).sum()),
                   "max_abs_err": float((p - r).abs().max()),
                   "norm_rel_err": float((p - r).norm() / r.norm()), "pass": e <= TOL}
            if o16 is not None:
                rec["out16_equals_p_bf16"] = bool(torch.equal(o16, p.bfloat16()))
            out["check"][f"zero-{isa}-{variant}"] = rec
    if ds_cls is not None:
        try:
            d = run_torch("deepspeed", grads)
            e = rel_err(d, ref)
            out["check"]["deepspeed-fp32 (info)"] = {
                "max_rel_err": e, "n_differing": int((d != ref).sum()),
                "max_abs_err": float((d - ref).abs().max()),
                "norm_rel_err": float((d - ref).norm() / ref.norm()), "pass": e <= TOL}
        except Exception as exc:  # noqa: BLE001
            out["check"]["deepspeed-fp32 (info)"] = {"error": repr(exc)}
    for t in (p0, ref, ref16, *grads, *grads16):
        del t
    del p0, ref, ref16, grads, grads16
    gc.collect()

    # --- timings
    # Fast group (vector zero kernels, torch fused, DeepSpeed, and the bandwidth probes): all
    # held at once and stepped round-robin, one step each per round, the order rotated every
    # round, so load from other processes on a shared host hits them alike. Slow group (zero
    # scalar, torch default for-loop, torch foreach): one after the other afterwards.
    for n in args.sizes:
        rec: dict = {"n": n, "impls": {}}
        print(f"[t={threads}] n={n:,}", flush=True)
        g = torch.empty(n).normal_(0.0, 0.1)
        p0 = torch.empty(n).uniform_(-1.0, 1.0)

        def zero_state():
            st = {"p": p0.clone(), "m": torch.zeros(n), "v": torch.zeros(n), "step": 0}
            return st

        def zero_fn(st, isa, grad, o16=None):
            def fn():
                st["step"] += 1
                C.cpu_adam_step(st["p"], grad, st["m"], st["v"], LR, *BETAS, EPS, WD, True,
                                True, st["step"], 1.0, o16, isa, threads)
            return fn

        fast: dict = {}
        extra: dict = {}
        zst = zero_state()  # one p, m, v for every fp32 ISA (timing only; step keeps counting)
        for isa in isas:
            if isa != "scalar":
                fast[f"zero-{isa}"] = zero_fn(zst, isa, g)
        zst16 = zero_state()
        g16 = g.bfloat16()
        o16 = torch.empty(n, dtype=torch.bfloat16)
        fast[f"zero-{best}-bf16"] = zero_fn(zst16, best, g16, o16)
        extra[f"zero-{best}-bf16"] = {"grads": "bf16", "out16": "bf16"}
        keep = []
        for kind in ["torch-fused"] + (["deepspeed"] if ds_cls is not None else []):
            P = torch.nn.Parameter(p0.clone())
            P.grad = g
            opt = torch_opt(P, kind)
            keep.append((P, opt))
            fast[kind] = opt.step
        # bandwidth probes, fp32 buffers of n elements: a is written; g and p0 only read
        a = torch.zeros(n)
        bw_spec = {"copy": (lambda: a.copy_(g), 8, 12),
                   "triad": (lambda: torch.add(g, p0, alpha=0.5, out=a), 12, 16),
                   "axpy_inplace": (lambda: a.add_(g, alpha=1e-7), 12, 12)}
        for name, (fn, _, _) in bw_spec.items():
            fast[f"bw:{name}"] = fn
        names = list(fast)
        times: dict = {k: [] for k in names}
        for r in range(args.warmup + args.steps):
            k0 = r % len(names)
            for k in names[k0:] + names[:k0]:
                t0 = time.perf_counter()
                fast[k]()
                dt = time.perf_counter() - t0
                if r >= args.warmup:
                    times[k].append(dt)

        bw = {}
        for name, (_, stream_b, actual_b) in bw_spec.items():
            ts = times[f"bw:{name}"]
            best_t, med = min(ts), statistics.median(ts)
            bw[name] = {"times_s": ts, "min_s": best_t, "median_s": med,
                        "stream_GBps": stream_b * n / best_t / 1e9,
                        "actual_GBps": actual_b * n / best_t / 1e9,
                        "actual_GBps_median": actual_b * n / med / 1e9,
                        "bytes_stream": stream_b, "bytes_actual": actual_b}
        best_bw = max(x["actual_GBps"] for x in bw.values())
        floor_s = BYTES_PER_PARAM * n / (best_bw * 1e9)
        rec["bandwidth"] = bw
        rec["floor_GBps"] = best_bw
        rec["floor_s"] = floor_s

        def record(name, ts, mode, bytes_pp=BYTES_PER_PARAM):
            med = statistics.median(ts)
            r = {"times_s": ts, "median_s": med, "min_s": min(ts), "mode": mode,
                 "params_per_s": n / med, "eff_GBps": bytes_pp * n / med / 1e9,
                 "x_floor": med / floor_s, "bytes_per_param": bytes_pp}
            r.update(extra.get(name, {}))
            rec["impls"][name] = r
            print(f"  {name:18s} {med * 1e3:9.2f} ms  {n / med / 1e9:6.3f} Gparam/s  "
                  f"{r['eff_GBps']:6.1f} GB/s  x{r['x_floor']:.2f} floor  ({mode})", flush=True)

        for k in names:
            if not k.startswith("bw:"):
                record(k, times[k], "interleaved")
        del fast, keep, zst, zst16, g16, o16, a, bw_spec
        gc.collect()

        # slow group, one after the other
        if "scalar" in isas:
            zst = zero_state()
            ts = time_steps(zero_fn(zst, "scalar", g), args.warmup, args.steps,
                            args.min_steps, args.cell_budget)
            record("zero-scalar", ts, "sequential")
            del zst
            gc.collect()
        for kind in ["torch-default", "torch-foreach"]:
            P = torch.nn.Parameter(p0.clone())
            P.grad = g
            opt = torch_opt(P, kind)
            try:
                ts = time_steps(opt.step, args.warmup, args.steps, args.min_steps,
                                args.cell_budget)
                record(kind, ts, "sequential")
            except Exception as exc:  # noqa: BLE001
                rec["impls"][kind] = {"error": repr(exc)}
            del opt, P
            gc.collect()
        del g, p0
        gc.collect()
        out["sizes"][str(n)] = rec
    out["loadavg_end"] = loadavg()
    return out


# ----------------------------------------------------------------------------------- report
def fmt_n(n: int) -> str:
    return f"{n // 10**6}M" if n % 10**6 == 0 else f"{n:,}"


def write_report(res: dict, path_md: str) -> None:
    L: list[str] = []
    facts = res["machine"]
    L += ["# CPU Adam/AdamW: zero vs torch vs DeepSpeed", "",
          f"Generated by `benchmarks/bench_cpu_adam.py` on {facts['date']} "
          f"(zero commit `{facts['zero_commit']}`).", "",
          "```bash", res["command"], "```", "",
          "One AdamW step on ONE flat fp32 tensor of n parameters (lr 1e-3, betas (0.9, 0.999), "
          "eps 1e-8, weight_decay 0.01, bias correction on). Per thread count a fresh worker "
          "process runs with `OMP_NUM_THREADS` = `MKL_NUM_THREADS` = `torch.set_num_threads` = "
          "threads, and zero's `num_threads` = threads. Times are the median of the measured "
          f"steps after {res['args']['warmup']} warm-up steps.", "",
          "*interleaved* rows (zero's vector kernels, torch fused, DeepSpeed, and the bandwidth "
          "probes) are all held in memory at once and stepped round-robin, one step each per "
          "round, with the order rotated every round, "
          f"{res['args']['steps']} measured rounds: load from other processes then hits them "
          "alike, so their ratios are fairer than their absolute times. *sequential* rows "
          "(zero scalar, torch default, torch foreach: ~10× off the others) run one after "
          f"the other afterwards, at least {res['args']['min_steps']} and up to "
          f"{res['args']['steps']} measured steps (a cell stops at the minimum once it has "
          f"used {res['args']['cell_budget']} s).", "",
          "`torch-default` is `torch.optim.AdamW()` with no implementation flag: on CPU torch "
          "resolves that to the for-loop (single-tensor) implementation, not foreach (it "
          "defaults to foreach only on cuda/xpu/mtia/privateuse1), so `torch-foreach` "
          "(`foreach=True`) is measured as well.", "",
          "**Bytes per parameter per step: 28 B.** fp32 grads: read p, g, m, v (16 B) + write "
          "p, m, v (12 B). bf16 grads + bf16 weight copy: read p, m, v (12) + g (2), write "
          "p, m, v (12) + copy (2) = 28 B as well. Every written line was just read, so no "
          "write-allocate traffic is added. *eff GB/s* = 28 B × n / median; *× floor* = median / "
          "(28 B × n / bandwidth), where the bandwidth is the best *actual-traffic* rate of the "
          "copy / triad / in-place axpy measured in the same worker at the same n and thread "
          "count (table below). ≤ 1.0 would mean at or beyond what torch's own streaming ops "
          "reach.", ""]
    threads_list = [w["threads"] for w in res["workers"] if "sizes" in w]
    pref = ["zero-scalar", "zero-avx2", "zero-avx512"]
    impl_order: list[str] = []
    for w in res["workers"]:
        for s in w.get("sizes", {}).values():
            for k in s["impls"]:
                if k not in impl_order:
                    impl_order.append(k)
    rank = {k: i for i, k in enumerate(pref)}
    late = {"torch-fused": 50, "deepspeed": 51, "torch-foreach": 52, "torch-default": 53}
    impl_order.sort(key=lambda k: rank.get(k, late.get(k, 10)))
    sizes = res["args"]["sizes"]

    # compact matrix: Gparam/s
    L += ["## Throughput, Gparam/s (higher is better)", ""]
    cols = [(n, t) for t in threads_list for n in sizes]
    L.append("| implementation | " + " | ".join(f"{fmt_n(n)}, {t}T" for n, t in cols) + " |")
    L.append("| --- |" + " ---: |" * len(cols))
    byt = {w["threads"]: w for w in res["workers"]}
    for impl in impl_order:
        cells = []
        for n, t in cols:
            r = byt[t].get("sizes", {}).get(str(n), {}).get("impls", {}).get(impl)
            cells.append("—" if not r or "error" in r else f"{r['params_per_s'] / 1e9:.3f}")
        L.append(f"| {impl} | " + " | ".join(cells) + " |")
    L += [""]

    # full table
    L += ["## Per (n, threads)", "",
          "| n | threads | implementation | mode | median s/step | min s/step | steps | "
          "Gparam/s | eff GB/s (28 B) | × floor | vs torch-fused |",
          "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in threads_list:
        w = byt[t]
        for n in sizes:
            s = w["sizes"].get(str(n))
            if not s:
                continue
            tf = s["impls"].get("torch-fused", {}).get("median_s")
            for impl in impl_order:
                r = s["impls"].get(impl)
                if r is None:
                    continue
                if "error" in r:
                    L.append(f"| {fmt_n(n)} | {t} | {impl} | | error: {r['error']} "
                             "| | | | | | |")
                    continue
                sp = f"{tf / r['median_s']:.2f}×" if tf else "—"
                L.append(f"| {fmt_n(n)} | {t} | {impl} | {r['mode']} | {r['median_s']:.4f} | "
                         f"{r['min_s']:.4f} | {len(r['times_s'])} | "
                         f"{r['params_per_s'] / 1e9:.3f} | {r['eff_GBps']:.1f} | "
                         f"{r['x_floor']:.2f} | {sp} |")
    L += ["", "*vs torch-fused* = torch-fused's median / this median (above 1: faster than "
          "torch fused).", ""]

    # bandwidth
    L += ["## Memory-bandwidth floor (same worker, same n, same threads)", "",
          "GB/s in the STREAM convention (copy 8 B, triad 12 B, axpy 12 B per element) / as "
          "actual traffic (copy 12 B and triad 16 B: one extra read for ownership of the "
          "written line; the in-place axpy `a.add_(b, alpha)` writes what it read: 12 B). "
          f"Interleaved with the fast implementations; best of the {res['args']['steps']} "
          "measured rounds (the STREAM convention; medians are in the JSON).", "",
          "| n | threads | copy_ GB/s | triad GB/s | axpy in-place GB/s | floor GB/s | "
          "Adam floor s/step (28 B) | floor Gparam/s |",
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in threads_list:
        for n in sizes:
            s = byt[t]["sizes"].get(str(n))
            if not s:
                continue
            b = s["bandwidth"]
            c = " | ".join(f"{b[k]['stream_GBps']:.1f} / {b[k]['actual_GBps']:.1f}"
                           for k in ("copy", "triad", "axpy_inplace"))
            L.append(f"| {fmt_n(n)} | {t} | {c} | {s['floor_GBps']:.1f} | "
                     f"{s['floor_s']:.4f} | {n / s['floor_s'] / 1e9:.3f} |")
    L += [""]

    # correctness
    L += ["## Correctness (same run)", "",
          f"3 AdamW steps on n = {res['args']['check_n']:,} from the same start with the same 3 "
          "gradients; max elementwise relative error of the parameters against "
          f"`torch.optim.AdamW(fused=True)`; required ≤ {TOL:g}. bf16 rows: zero gets bf16 "
          "grads, torch fused gets the same bf16 grads widened to fp32; *out16* checks the bf16 "
          "copy equals the new fp32 weights rounded to bf16.", "",
          "| threads | check | max rel err | max abs err | ‖Δ‖/‖p‖ | elements differing | pass |",
          "| ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    all_pass = True
    for w in res["workers"]:
        for name, c in w.get("check", {}).items():
            if "error" in c:
                L.append(f"| {w['threads']} | {name} | error: {c['error']} | | | | |")
                continue
            ok = c["pass"]
            if not name.endswith("(info)"):
                all_pass &= ok
            extra = ""
            if "out16_equals_p_bf16" in c:
                extra = f"; out16 {'ok' if c['out16_equals_p_bf16'] else 'MISMATCH'}"
                if not name.endswith("(info)"):
                    all_pass &= c["out16_equals_p_bf16"]
            verdict = ("yes" if ok else "**NO**") if not name.endswith("(info)") else \
                f"n/a (info: elementwise {'≤' if ok else '>'} {TOL:g})"
            L.append(f"| {w['threads']} | {name} | {c['max_rel_err']:.3g} | "
                     f"{c['max_abs_err']:.3g} | {c['norm_rel_err']:.3g} | "
                     f"{c['n_differing']:,} | {verdict}{extra} |")
    L += ["", f"**zero vs torch fused: {'all checks pass' if all_pass else 'FAILED — see above'}"
          ".** DeepSpeed's row is information only: its kernel orders and fuses the arithmetic "
          "differently from torch (e.g. it multiplies by 1/sqrt(bc2) where torch divides), so "
          "most elements differ by a few ulps; the large elementwise relative error comes from "
          "parameters near zero, the normwise error ‖Δ‖/‖p‖ is the meaningful figure.", ""]

    # deepspeed status + ISA probe
    L += ["## DeepSpeed and ISA probe", ""]
    for w in res["workers"]:
        if "deepspeed_version" in w:
            L.append(f"* threads={w['threads']}: deepspeed {w['deepspeed_version']}, "
                     f"DeepSpeedCPUAdam ready in {w['deepspeed_load_s']:.1f} s (op cached in "
                     "~/.cache/torch_extensions after the first JIT build).")
        else:
            L.append(f"* threads={w['threads']}: DeepSpeed **not measured**: "
                     f"`{w.get('deepspeed_error', w.get('error', '?')).splitlines()[0]}`")
        if "isa_probe" in w:
            L.append(f"  ISA probe: {w['isa_probe']}")
    if res.get("deepspeed_build_flags"):
        L.append(f"* DeepSpeed cpu_adam build flags (build.ninja): "
                 f"`{res['deepspeed_build_flags']}`")
    L += [""]

    # machine
    L += ["## Machine", "", "```", f"$ nproc\n{facts['nproc']}", "$ lscpu | head -20",
          facts["lscpu_head"], "$ free -g", facts["free_g"], "```", "",
          f"torch {facts['torch']}, deepspeed {facts['deepspeed']}, Python {facts['python']}, "
          f"{facts['platform']}.", "",
          f"/proc/loadavg at start: `{res['loadavg_start']}`, at end: `{res['loadavg_end']}`; "
          "per worker: " + "; ".join(f"{w['threads']}T `{w.get('loadavg_start')}` → "
                                     f"`{w.get('loadavg_end')}`" for w in res["workers"])
          + ". Above 2 means other processes shared the 2 cores during the run, which slows "
          "every row (most of all the 2-thread ones) and widens the spread (compare median and "
          "min).", "",
          f"Wall time of the whole run: {res['wall_s']:.0f} s.", ""]
    with open(path_md, "w") as f:
        f.write("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10M,50M,100M,200M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=9,
                    help="measured rounds (interleaved) / max measured steps (sequential)")
    ap.add_argument("--min-steps", type=int, default=5)
    ap.add_argument("--cell-budget", type=float, default=3.0,
                    help="stop a cell at --min-steps once its measured steps took this long (s)")
    ap.add_argument("--check-n", type=int, default=10_000_003)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--worker-threads", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    if args.worker_threads:
        try:
            res = worker(args)
        except BaseException as exc:  # noqa: BLE001
            res = {"threads": args.worker_threads,
                   "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        with open(args.worker_out, "w") as f:
            json.dump(res, f)
        return

    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    if ZERO_ROOT != ROOT:
        command = f"ZERO_ROOT={shlex.quote(ZERO_ROOT)} " + command
    t_start = time.perf_counter()
    load_start = loadavg()
    print(f"loadavg start: {load_start}", flush=True)
    workers = []
    with tempfile.TemporaryDirectory(prefix="bench_cpu_adam_") as tmp:
        for t in [int(x) for x in args.threads.split(",") if x.strip()]:
            path = os.path.join(tmp, f"w{t}.json")
            env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t),
                       DS_BUILD_OPS="0", DS_ACCELERATOR="cpu")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker-threads", str(t),
                   "--worker-out", path] + sys.argv[1:]
            rc = subprocess.run(cmd, env=env).returncode
            if os.path.exists(path):
                with open(path) as f:
                    workers.append(json.load(f))
            else:
                workers.append({"threads": t, "error": f"worker exited {rc} without a result"})
            if "error" in workers[-1]:
                print(workers[-1]["error"], file=sys.stderr)
    import torch
    try:
        import importlib.metadata as md
        ds_version = md.version("deepspeed")
    except Exception:  # noqa: BLE001
        ds_version = "not installed"
    facts = {"lscpu_head": sh("lscpu | head -20"), "nproc": sh("nproc"), "free_g": sh("free -g"),
             "torch": torch.__version__, "deepspeed": ds_version,
             "python": platform.python_version(), "platform": platform.platform(),
             "zero_commit": os.environ.get("ZERO_COMMIT")
             or sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse HEAD 2>/dev/null") or "unknown",
             "zero_tree_dirty": sh(f"git -C {shlex.quote(ZERO_ROOT)} status --porcelain "
                                   "-- zero csrc 2>/dev/null | head -c 2000"),
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    ninja = os.path.expanduser("~/.cache/torch_extensions/py311_cpu/cpu_adam/build.ninja")
    flags = ""
    if os.path.exists(ninja):
        with open(ninja) as f:
            for line in f:
                if line.startswith("cflags"):
                    flags = " ".join(x for x in line.split()[2:] if not x.startswith("-I")
                                     and not x.startswith("-isystem") and "/" not in x)
    res = {"command": command, "args": {k: v for k, v in vars(args).items()
                                        if not k.startswith("worker")},
           "bytes_per_param": BYTES_PER_PARAM, "tolerance": TOL,
           "hyperparameters": {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD,
                               "adamw": True, "bias_correction": True, "grad_scale": 1.0},
           "machine": facts, "deepspeed_build_flags": flags, "workers": workers,
           "loadavg_start": load_start, "loadavg_end": loadavg(),
           "wall_s": time.perf_counter() - t_start}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_adam.json"), "w") as f:
        json.dump(res, f, indent=1)
    if all("sizes" in w for w in workers):
        write_report(res, os.path.join(args.out, "cpu_adam.md"))
    else:
        print("a worker failed; wrote only the JSON", file=sys.stderr)
    print(f"loadavg end: {res['loadavg_end']}; wall {res['wall_s']:.0f} s; "
          f"wrote {args.out}/cpu_adam.{{md,json}}", flush=True)


if __name__ == "__main__":
    main()
