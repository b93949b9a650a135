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
import gc
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.cpu_adam_report import write_report  # noqa: E402
from benchmarks.launch import run_worker  # noqa: E402
from benchmarks.models import ADAMW  # noqa: E402
from benchmarks.report import write_results  # noqa: E402
from benchmarks.timing import round_robin  # noqa: E402

LR, BETAS, EPS, WD = ADAMW["lr"], tuple(ADAMW["betas"]), ADAMW["eps"], ADAMW["weight_decay"]
BYTES_PER_PARAM = 28
TOL = 1e-6
ISAS = ("scalar", "avx2", "avx512")


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def parse_args():
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
    return args


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
    return float(((a - b).abs() / b.abs().clamp_min(1e-30)).max())


def worker(args) -> dict:
    import torch
    threads = args.worker_threads
    torch.set_num_threads(threads)
    import zero  # noqa: F401
    import zero._C as C

    out: dict = {"threads": threads, "torch_threads": torch.get_num_threads(),
                 "env_OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                 "loadavg_start": machine.loadavg(), "isa_probe": {}, "check": {}, "sizes": {}}
    isas = _probe_isas(C, out["isa_probe"])
    out["isas"], out["best_isa"] = isas, isas[-1]
    ds_cls = _load_deepspeed(args, out)
    out["check"] = _check(C, isas, ds_cls, args.check_n, threads)
    gc.collect()
    for n in args.sizes:
        print(f"[t={threads}] n={n:,}", flush=True)
        out["sizes"][str(n)] = _time_size(C, n, isas, ds_cls, threads, args)
    out["loadavg_end"] = machine.loadavg()
    return out


def _probe_isas(C, probe: dict) -> list[str]:
    """Which ISAs run here: each one tried on a small step, the failure recorded."""
    import torch

    isas = []
    for isa in ISAS:
        p, g, m, v = (torch.zeros(64) for _ in range(4))
        try:
            C.cpu_adam_step(p, g, m, v, LR, *BETAS, EPS, WD, True, True, 1, 1.0, None, isa, 1)
            isas.append(isa)
            probe[isa] = "ok"
        except Exception as exc:  # noqa: BLE001
            probe[isa] = f"{type(exc).__name__}: {exc}"
    return isas


def _load_deepspeed(args, out: dict):
    """DeepSpeedCPUAdam (import + JIT build of its op on first use), or None with the reason
    in out["deepspeed_error"]."""
    import torch

    if args.no_deepspeed:
        out["deepspeed_error"] = "skipped (--no-deepspeed)"
        return None
    try:
        t0 = time.perf_counter()
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        probe = torch.nn.Parameter(torch.zeros(32))
        probe.grad = torch.ones(32)
        DeepSpeedCPUAdam([probe], lr=LR).step()
        out["deepspeed_version"] = deepspeed.__version__
        out["deepspeed_load_s"] = time.perf_counter() - t0
        return DeepSpeedCPUAdam
    except BaseException as exc:  # noqa: BLE001  (the JIT build can sys.exit)
        out["deepspeed_error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
        return None


def torch_opt(P, kind, ds_cls=None):
    import torch

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


def _compare(p, ref) -> dict:
    e = rel_err(p, ref)
    return {"max_rel_err": e, "n_differing": int((p != ref).sum()),
            "max_abs_err": float((p - ref).abs().max()),
            "norm_rel_err": float((p - ref).norm() / ref.norm()), "pass": e <= TOL}


def _check(C, isas, ds_cls, n, threads) -> dict:
    """Correctness: 3 steps from the same start with the same gradients, zero (each ISA,
    fp32 grads; bf16 grads against torch fed the same bf16 grads widened) vs torch fused."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    p0 = torch.randn(n, generator=gen)
    grads = [torch.randn(n, generator=gen) * 0.1 for _ in range(3)]
    grads16 = [g.bfloat16() for g in grads]

    def run_torch(kind, gs):
        P = torch.nn.Parameter(p0.clone())
        opt = torch_opt(P, kind, ds_cls)
        for g in gs:
            P.grad = g.clone()
            opt.step()
        return P.detach()

    ref = run_torch("torch-fused", grads)
    ref16 = run_torch("torch-fused", [g.float() for g in grads16])
    check = {}
    for isa in isas:
        for variant, gs, r in (("fp32", grads, ref), ("bf16", grads16, ref16)):
            p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
            o16 = torch.empty(n, dtype=torch.bfloat16) if variant == "bf16" else None
            for s, g in enumerate(gs, 1):
                C.cpu_adam_step(p, g, m, v, LR, *BETAS, EPS, WD, True, True, s, 1.0, o16, isa,
                                threads)
            rec = _compare(p, r)
            if o16 is not None:
                rec["out16_equals_p_bf16"] = bool(torch.equal(o16, p.bfloat16()))
            check[f"zero-{isa}-{variant}"] = rec
    if ds_cls is not None:
        try:
            check["deepspeed-fp32 (info)"] = _compare(run_torch("deepspeed", grads), ref)
        except Exception as exc:  # noqa: BLE001
            check["deepspeed-fp32 (info)"] = {"error": repr(exc)}
    return check


def _zero_step(C, state, isa, grad, threads, o16=None):
    """One zero._C.cpu_adam_step on state's p, m, v (its step count goes on)."""
    def step():
        state["step"] += 1
        C.cpu_adam_step(state["p"], grad, state["m"], state["v"], LR, *BETAS, EPS, WD, True,
                        True, state["step"], 1.0, o16, isa, threads)
    return step


def _zero_state(p0):
    import torch

    return {"p": p0.clone(), "m": torch.zeros(p0.numel()), "v": torch.zeros(p0.numel()),
            "step": 0}


# bandwidth probes: bytes per element in the STREAM convention and as actual DRAM traffic
BANDWIDTH_BYTES = {"copy": (8, 12), "triad": (12, 16), "axpy_inplace": (12, 12)}


def _time_size(C, n, isas, ds_cls, threads, args) -> dict:
    """One size: the fast group held at once and stepped round-robin (vector zero kernels,
    torch fused, DeepSpeed, the bandwidth probes), then the slow group one after the other
    (zero scalar, torch default for-loop, torch foreach)."""
    import torch

    rec: dict = {"n": n, "impls": {}}
    g = torch.empty(n).normal_(0.0, 0.1)
    p0 = torch.empty(n).uniform_(-1.0, 1.0)
    best = isas[-1]
    times = _time_fast_group(C, g, p0, isas, ds_cls, threads, args)
    bw = {name: _bandwidth(times.pop(f"bw:{name}"), n, *nbytes)
          for name, nbytes in BANDWIDTH_BYTES.items()}
    rec["bandwidth"] = bw
    rec["floor_GBps"] = max(x["actual_GBps"] for x in bw.values())
    rec["floor_s"] = BYTES_PER_PARAM * n / (rec["floor_GBps"] * 1e9)
    for name, ts in times.items():
        _record(rec, name, ts, "interleaved")
    rec["impls"][f"zero-{best}-bf16"].update({"grads": "bf16", "out16": "bf16"})
    gc.collect()
    if "scalar" in isas:
        ts = time_steps(_zero_step(C, _zero_state(p0), "scalar", g, threads), args.warmup,
                        args.steps, args.min_steps, args.cell_budget)
        _record(rec, "zero-scalar", ts, "sequential")
        gc.collect()
    for kind in ["torch-default", "torch-foreach"]:
        P = torch.nn.Parameter(p0.clone())
        P.grad = g
        opt = torch_opt(P, kind)
        try:
            ts = time_steps(opt.step, args.warmup, args.steps, args.min_steps, args.cell_budget)
            _record(rec, kind, ts, "sequential")
        except Exception as exc:  # noqa: BLE001
            rec["impls"][kind] = {"error": repr(exc)}
        del opt, P
        gc.collect()
    return rec


def _time_fast_group(C, g, p0, isas, ds_cls, threads, args) -> dict:
    """Seconds of every measured round of each fast implementation and bandwidth probe, all
    held in memory together and stepped round-robin, the order rotated every round."""
    import torch

    n, best = g.numel(), isas[-1]
    fast: dict = {}
    zst = _zero_state(p0)  # one p, m, v for every fp32 ISA (timing only; step keeps counting)
    for isa in isas:
        if isa != "scalar":
            fast[f"zero-{isa}"] = _zero_step(C, zst, isa, g, threads)
    fast[f"zero-{best}-bf16"] = _zero_step(C, _zero_state(p0), best, g.bfloat16(), threads,
                                           torch.empty(n, dtype=torch.bfloat16))
    for kind in ["torch-fused"] + (["deepspeed"] if ds_cls is not None else []):
        P = torch.nn.Parameter(p0.clone())
        P.grad = g
        fast[kind] = torch_opt(P, kind, ds_cls).step
    a = torch.zeros(n)  # the probes write a; g and p0 are only read
    fast["bw:copy"] = lambda: a.copy_(g)
    fast["bw:triad"] = lambda: torch.add(g, p0, alpha=0.5, out=a)
    fast["bw:axpy_inplace"] = lambda: a.add_(g, alpha=1e-7)
    timed = round_robin({k: (lambda i, fn=fn: fn()) for k, fn in fast.items()},
                        args.warmup + args.steps, args.warmup)
    return {k: [s for s, _ in t] for k, t in timed.items()}


def _bandwidth(ts, n, stream_b, actual_b) -> dict:
    best_t, med = min(ts), statistics.median(ts)
    return {"times_s": ts, "min_s": best_t, "median_s": med,
            "stream_GBps": stream_b * n / best_t / 1e9,
            "actual_GBps": actual_b * n / best_t / 1e9,
            "actual_GBps_median": actual_b * n / med / 1e9,
            "bytes_stream": stream_b, "bytes_actual": actual_b}


def _record(rec, name, ts, mode, bytes_pp=BYTES_PER_PARAM):
    n = rec["n"]
    med = statistics.median(ts)
    r = {"times_s": ts, "median_s": med, "min_s": min(ts), "mode": mode,
         "params_per_s": n / med, "eff_GBps": bytes_pp * n / med / 1e9,
         "x_floor": med / rec["floor_s"], "bytes_per_param": bytes_pp}
    rec["impls"][name] = r
    print(f"  {name:18s} {med * 1e3:9.2f} ms  {n / med / 1e9:6.3f} Gparam/s  "
          f"{r['eff_GBps']:6.1f} GB/s  x{r['x_floor']:.2f} floor  ({mode})", flush=True)


# ----------------------------------------------------------------------------------- parent
def _run_workers(args) -> list[dict]:
    """A fresh worker process per thread count, with OMP_NUM_THREADS and MKL_NUM_THREADS set
    to it (so DeepSpeed's OpenMP kernel gets the same count)."""
    workers = []
    for t in [int(x) for x in args.threads.split(",") if x.strip()]:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t),
                   DS_BUILD_OPS="0", DS_ACCELERATOR="cpu")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-threads", str(t)] \
            + sys.argv[1:]
        result, proc = run_worker(cmd, "--worker-out", env)
        workers.append(result if result is not None else
                       {"threads": t, "error": f"worker exited {proc.returncode} without a result"})
        if "error" in workers[-1]:
            print(workers[-1]["error"], file=sys.stderr)
    return workers


def cpu_adam_facts() -> dict:
    try:
        import importlib.metadata as md
        ds_version = md.version("deepspeed")
    except Exception:  # noqa: BLE001
        ds_version = "not installed"
    return {**machine.host_facts(), "deepspeed": ds_version,
            "zero_commit": machine.git_commit(ZERO_ROOT),
            "zero_tree_dirty": machine.tree_dirty(ZERO_ROOT), "date": machine.utc_now()}


def deepspeed_build_flags() -> str:
    """The compiler flags DeepSpeed's JIT build of cpu_adam used (paths left out)."""
    ninja = os.path.expanduser("~/.cache/torch_extensions/py311_cpu/cpu_adam/build.ninja")
    flags = ""
    if os.path.exists(ninja):
        with open(ninja) as f:
            for line in f:
                if line.startswith("cflags"):
                    flags = " ".join(x for x in line.split()[2:] if not x.startswith("-I")
                                     and not x.startswith("-isystem") and "/" not in x)
    return flags


def main() -> None:
    args = parse_args()
    if args.worker_threads:
        try:
            res = worker(args)
        except BaseException as exc:  # noqa: BLE001
            res = {"threads": args.worker_threads,
                   "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        with open(args.worker_out, "w") as f:
            json.dump(res, f)
        return

    command = command_line(name_commit=False)
    t_start = time.perf_counter()
    load_start = machine.loadavg()
    print(f"loadavg start: {load_start}", flush=True)
    workers = _run_workers(args)
    res = {"command": command, "args": {k: v for k, v in vars(args).items()
                                        if not k.startswith("worker")},
           "bytes_per_param": BYTES_PER_PARAM, "tolerance": TOL,
           "hyperparameters": {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD,
                               "adamw": True, "bias_correction": True, "grad_scale": 1.0},
           "machine": cpu_adam_facts(), "deepspeed_build_flags": deepspeed_build_flags(),
           "workers": workers, "loadavg_start": load_start, "loadavg_end": machine.loadavg(),
           "wall_s": time.perf_counter() - t_start}
    write_results(args.out, "cpu_adam", None, res)
    if all("sizes" in w for w in workers):
        write_report(res, os.path.join(args.out, "cpu_adam.md"))
    else:
        print("a worker failed; wrote only the JSON", file=sys.stderr)
    print(f"loadavg end: {res['loadavg_end']}; wall {res['wall_s']:.0f} s; "
          f"wrote {args.out}/cpu_adam.{{md,json}}", flush=True)


if __name__ == "__main__":
    main()
