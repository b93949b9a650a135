"""zero (ZeRO stages 0, 1, 2) against PyTorch DDP, side by side, in one invocation.

    python benchmarks/bench_ddp.py                      # the full run (a few minutes on 2 cores)
    python benchmarks/bench_ddp.py --steps 4 --warmup 1 --configs ddp-fp32,zero2-bf16  # smoke

World size 2 on gloo (CPU). Every configuration runs in a *fresh* pair of processes
(torch.multiprocessing spawn), so a process's peak RSS belongs to that configuration alone;
the configurations run one after the other with the same model, seed, data and micro-batch.

What each column measures (also written into the results file):

* step time: wall time of forward + backward + optimizer step of one training step, per
  rank; the per-step maximum over the ranks, median over the measured steps (after warm-up).
* engine-owned bytes (zero): the accounting registry's model-state categories (param,
  gradient, fp32_master, optimizer_state) and the reduction buckets, beside the ZeRO formula
  the engine reports for the same layout (Ψ padded as the partition planner lays it out).
* model-state bytes (DDP): the sum of the distinct storages behind the parameters, their
  gradients and the AdamW state (exp_avg, exp_avg_sq, step), measured after the optimizer
  step, beside 16Ψ (4 param + 4 grad + 8 Adam). DDP runs with gradient_as_bucket_view=True
  so its reduction buckets *are* the gradients (the default, False, adds another 4Ψ).
* RSS: ru_maxrss of each rank process (includes the torch runtime, the autograd graph's
  activations and every allocator cache; comparable only side by side). "RSS start" is taken
  after import + process-group init, before the model exists.
* bytes sent per step: zero's own counters (engine.memory_report()["comm"], the paper's
  convention: all-reduce of B bytes = 2B, reduce-scatter / all-gather of a B-byte buffer =
  B), differenced over the measured steps. DDP: 2Ψ·4 bytes (each fp32 gradient bucket is
  all-reduced once; DDP buckets hold exactly the gradients, no padding), same convention.

Precision columns:
* fp32: fp32 parameters, gradients and AdamW state, fp32 compute, for both.
* bf16: zero = DeepSpeed's bf16 mode (bf16 parameters and gradients, fp32 master weights and
  Adam state in the engine; forward/backward entirely in bf16). DDP = fp32 parameters,
  gradients and AdamW state with the forward under torch.autocast("cpu", torch.bfloat16)
  (matmuls in bf16, the rest fp32) -- the usual way to train bf16 with plain DDP.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The engine under test: this checkout, or another tree with a built zero/ (ZERO_ROOT), e.g. a
# snapshot of a commit while the checkout is being edited. Spawned ranks inherit it.
ZERO_ROOT = os.path.abspath(os.environ.get("ZERO_ROOT", ROOT))
if ZERO_ROOT not in sys.path:
    sys.path.insert(0, ZERO_ROOT)

MIB = 1024 * 1024
ALL_CONFIGS = ["ddp-fp32", "zero0-fp32", "zero1-fp32", "zero2-fp32",
               "ddp-bf16", "zero0-bf16", "zero1-bf16", "zero2-bf16"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured steps first")
    p.add_argument("--interleaved-steps", type=int, default=30,
                   help="measured steps per configuration in the interleaved timing run "
                        "(0 skips it)")
    p.add_argument("--repeats", type=int, default=2,
                   help="run every configuration this many times (fresh processes each, order "
                        "rotated per round) and pool the measured steps")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--bucket-numel", type=int, default=500_000,
                   help="zero reduce_bucket_size (elements); DDP bucket_cap_mb is the same "
                        "number of fp32 elements, so both cut the model into the same buckets")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: cores // world_size, at least 1)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (both)")
    p.add_argument("--configs", default=",".join(ALL_CONFIGS),
                   help="comma-separated subset of " + ",".join(ALL_CONFIGS))
    p.add_argument("--no-probe", action="store_true", help="skip the gloo collective probe")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="directory for ddp_vs_zero.md / .json ('' to write nothing)")
    return p.parse_args(argv)


# ---- worker side ---------------------------------------------------------------------------
def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _unique_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _adamw_params():
    return {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def _worker(rank, world, name, port, args, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(args.threads)
    try:
        result = _run_config(rank, world, name, args)
    except Exception:  # noqa: BLE001 -- report, then let spawn see the failure
        result = {"error": traceback.format_exc()}
        with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
        raise
    with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _run_config(rank, world, name, args):
    import zero  # noqa: F401 -- every worker loads the same libraries, DDP ones included
    from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

    dist.init_process_group("gloo", rank=rank, world_size=world)
    rss_start, rss_peak_start = _rss_now(), _rss_peak()
    if name in ("probe", "interleaved"):
        out = _probe(args) if name == "probe" else _interleaved(rank, args)
        dist.destroy_process_group()
        return out
    kind, precision = name.split("-")
    gpt = GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    torch.manual_seed(0)
    model = TinyGPT(gpt)
    numel = sum(p.numel() for p in model.parameters())
    batches = synthetic_batches(gpt, args.micro_batch, args.warmup + args.steps,
                                seed=1000 + rank)
    out = {"config": name, "rank": rank, "numel": numel, "threads": torch.get_num_threads(),
           "zero_module": os.path.dirname(zero.__file__)}
    if kind == "ddp":
        step_fn, finish = _ddp(model, precision, args, out)
    else:
        step_fn, finish = _zero(model, int(kind[-1]), precision, args, out)

    times, losses = [], []
    for i, (tokens, targets) in enumerate(batches):
        if i == args.warmup:
            out["comm_at_warmup_end"] = out.get("comm_snapshot", lambda: None)()
        t0 = time.perf_counter()
        loss, phases = step_fn(tokens, targets)
        elapsed = time.perf_counter() - t0
        losses.append(loss)
        if i >= args.warmup:
            times.append({"total": elapsed, **phases})
    finish()
    out["step_times"] = times
    out["losses"] = losses
    out["rss_start_bytes"] = rss_start
    out["rss_peak_at_start_bytes"] = rss_peak_start
    out["rss_end_bytes"] = _rss_now()
    out["rss_peak_bytes"] = _rss_peak()
    out.pop("comm_snapshot", None)
    dist.destroy_process_group()
    return out


def _interleaved(rank, args):
    """Every configuration in this one pair of processes, stepping round-robin (config A step
    i, config B step i, ...): host noise on a shared VM then hits all configurations alike,
    so their ratios are far steadier than runs made one after another. No memory numbers
    come from here (the process holds all models at once)."""
    from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

    gpt = GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    steps = args.warmup + args.interleaved_steps
    batches = synthetic_batches(gpt, args.micro_batch, steps, seed=1000 + rank)
    runners = {}
    for name in args.config_list:
        kind, precision = name.split("-")
        torch.manual_seed(0)
        model = TinyGPT(gpt)
        scratch = {}
        if kind == "ddp":
            runners[name] = _ddp(model, precision, args, scratch)[0]
        else:
            runners[name] = _zero(model, int(kind[-1]), precision, args, scratch)[0]
    times = {name: [] for name in runners}
    for i in range(steps):
        order = list(runners)
        order = order[i % len(order):] + order[:i % len(order)]  # no fixed neighbour
        for name in order:
            t0 = time.perf_counter()
            _, phases = runners[name](*batches[i])
            elapsed = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append({"total": elapsed, **phases})
    return {"rank": rank, "step_times": times}


def _zero(model, stage, precision, args, out):
    import zero

    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": args.clip,
        "optimizer": {"type": "AdamW", "params": _adamw_params()},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": args.bucket_numel,
                              "overlap_comm": True},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    out["engine_config"] = cfg
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    out["comm_snapshot"] = lambda: dict(engine._core.comm_stats())
    out["comm_at_init"] = dict(engine._core.comm_stats())

    def step(tokens, targets):
        t0 = time.perf_counter()
        loss = engine(tokens, targets)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        return float(loss.detach()), {"forward": t1 - t0, "backward": t2 - t1, "step": t3 - t2}

    def finish():
        report = engine.memory_report()
        out["report"] = report
        out["comm_at_end"] = dict(report["comm"])
        out["grad_norm_last"] = engine.last_step_result.get("grad_norm")
    return step, finish


def _ddp(model, precision, args, out):
    from torch.nn.parallel import DistributedDataParallel as DDP

    bucket_mb = args.bucket_numel * 4 / MIB
    ddp = DDP(model, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    p = _adamw_params()
    opt = torch.optim.AdamW(ddp.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                            weight_decay=p["weight_decay"])
    out["ddp_settings"] = {"bucket_cap_mb": bucket_mb, "gradient_as_bucket_view": True,
                           "autocast": "cpu/bfloat16" if precision == "bf16" else None,
                           "optimizer": "torch.optim.AdamW (defaults: foreach=None, fused=None)"}
    params = [q for q in ddp.parameters() if q.requires_grad]
    state = {"model_state_bytes": 0}

    def step(tokens, targets):
        t0 = time.perf_counter()
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ddp(tokens, targets)
        else:
            loss = ddp(tokens, targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        # measured here, where params, grads and Adam state all exist (the steady-state peak)
        tensors = [q for q in params] + [q.grad for q in params]
        for s in opt.state.values():
            tensors += [v for v in s.values() if torch.is_tensor(v)]
        state["model_state_bytes"] = max(state["model_state_bytes"], _unique_bytes(tensors))
        state["param_bytes"] = _unique_bytes(params)
        state["grad_bytes"] = _unique_bytes([q.grad for q in params])
        state["optimizer_state_bytes"] = _unique_bytes(
            [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])
        opt.zero_grad(set_to_none=False)
        t3 = time.perf_counter()
        return float(loss.detach()), {"forward": t1 - t0, "backward": t2 - t1, "step": t3 - t2}

    def finish():
        out.update(state)
    return step, finish


def _probe(args):
    """Times gloo's primitives on a Ψ-sized buffer: what the engines' collectives cost here."""
    from zero.models.tiny_gpt import GPTConfig, TinyGPT
    gpt = GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    numel = sum(p.numel() for p in TinyGPT(gpt).parameters())
    numel -= numel % dist.get_world_size()
    world = dist.get_world_size()
    out = {"numel": numel, "timings_ms": {}}
    for dtype in (torch.float32, torch.bfloat16):
        full = torch.ones(numel, dtype=dtype)
        shard = torch.empty(numel // world, dtype=dtype)
        ops = {
            "all_reduce(Ψ)": lambda: dist.all_reduce(full),
            "reduce_scatter(Ψ -> Ψ/N)": lambda: dist.reduce_scatter_tensor(shard, full),
            "all_gather(Ψ/N -> Ψ)": lambda: dist.all_gather_into_tensor(full, shard),
        }
        for op, fn in ops.items():
            fn()
            samples = []
            for _ in range(7):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            out["timings_ms"][f"{op} {str(dtype).split('.')[-1]}"] = \
                statistics.median(samples) * 1e3
    return out


# ---- parent side ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(name, args, tmp):
    t0 = time.perf_counter()
    error = None
    try:
        mp.spawn(_worker, args=(args.world_size, name, _free_port(), args, tmp),
                 nprocs=args.world_size, join=True)
    except Exception as exc:  # noqa: BLE001 -- keep going; the table shows the failure
        error = f"{type(exc).__name__}: {exc}"
    ranks = []
    for r in range(args.world_size):
        path = os.path.join(tmp, f"{name}.rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    errors = [r["error"] for r in ranks if "error" in r]
    if error or errors:
        return {"config": name, "error": errors[0] if errors else error,
                "wall_s": time.perf_counter() - t0}
    return {"config": name, "ranks": ranks, "wall_s": time.perf_counter() - t0}


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
    per_step, phase_steps, repeat_medians = [], {"forward": [], "backward": [], "step": []}, []
    for result in results:
        rs = result["ranks"]
        n = len(rs[0]["step_times"])
        times = [max(r["step_times"][i]["total"] for r in rs) for i in range(n)]
        repeat_medians.append(statistics.median(times) * 1e3)
        per_step += times
        for ph in phase_steps:
            phase_steps[ph] += [max(r["step_times"][i][ph] for r in rs) for i in range(n)]
    phases = {ph: statistics.median(v) for ph, v in phase_steps.items()}
    steps = len(ranks[0]["step_times"])
    numel = ranks[0]["numel"]
    s = {
        "config": name,
        "numel": numel,
        "step_ms_median": statistics.median(per_step) * 1e3,
        "step_ms_p10": sorted(per_step)[len(per_step) // 10] * 1e3,
        "step_ms_repeat_medians": repeat_medians,
        "measured_steps": len(per_step),
        "phase_ms_median": {k: v * 1e3 for k, v in phases.items()},
        "rss_peak_bytes": [statistics.median(res["ranks"][k]["rss_peak_bytes"] for res in results)
                           for k in range(len(ranks))],
        "rss_start_bytes": [statistics.median(res["ranks"][k]["rss_start_bytes"]
                                              for res in results) for k in range(len(ranks))],
        "loss_first": ranks[0]["losses"][0],
        "loss_last": ranks[0]["losses"][-1],
        "ddp_allreduce_bytes_per_step": 2 * numel * 4,
    }
    if name.startswith("ddp"):
        s["model_state_bytes"] = [r["model_state_bytes"] for r in ranks]
        s["model_state_expected_bytes"] = 16 * numel
        s["model_state_formula"] = "16Ψ (4+4+8)"
        s["breakdown"] = {k: ranks[0][k] for k in ("param_bytes", "grad_bytes",
                                                   "optimizer_state_bytes")}
        s["bucket_bytes"] = [0 for _ in ranks]  # gradient_as_bucket_view: buckets = grads
        s["engine_total_peak_bytes"] = s["model_state_bytes"]
        s["comm_bytes_per_step"] = 2 * numel * 4
        s["comm_source"] = "analytic 2Ψ·4 (fp32 all-reduce of every gradient bucket)"
    else:
        reports = [r["report"] for r in ranks]
        s["padded_numel"] = reports[0]["numel"]
        s["model_state_bytes"] = [rep["model_state_bytes"] for rep in reports]
        s["model_state_expected_bytes"] = reports[0]["model_state_expected_bytes"]
        s["model_state_formula"] = reports[0]["model_state_formula"]
        s["categories"] = {k: {f: v.get(f) for f in ("current", "peak", "expected", "formula")}
                           for k, v in reports[0]["categories"].items()}
        s["bucket_bytes"] = [rep["categories"].get("bucket", {}).get("peak", 0)
                             for rep in reports]
        s["engine_total_peak_bytes"] = [rep["total"]["peak"] for rep in reports]
        deltas = [_comm_delta(r) for r in ranks]
        s["comm_bytes_per_step_by_op"] = {k: v / steps for k, v in deltas[0].items()
                                          if k != "calls"}
        s["comm_calls_per_step"] = deltas[0]["calls"] / steps
        s["comm_bytes_per_step"] = deltas[0]["total_bytes"] / steps
        s["comm_source"] = "measured (engine counters, rank 0)"
    return s


def _step_stats(rank_times):
    """rank_times: one list of per-step dicts per rank. The slower rank's time of each step."""
    n = min(len(t) for t in rank_times)
    out = {}
    for key in ("total", "forward", "backward", "step"):
        per_step = sorted(max(t[i][key] for t in rank_times) * 1e3 for i in range(n))
        out[key] = {"median": statistics.median(per_step), "p10": per_step[n // 10]}
    out["steps"] = n
    return out


def summarize_interleaved(result):
    if "error" in result:
        return {"error": result["error"]}
    ranks = result["ranks"]
    return {name: _step_stats([r["step_times"][name] for r in ranks])
            for name in ranks[0]["step_times"]}


def machine_facts():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception as exc:  # noqa: BLE001
            return f"({exc})"
    return {"lscpu_head": sh("lscpu | head"), "nproc": sh("nproc"), "free_g": sh("free -g"),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "zero_root": ZERO_ROOT,
            "zero_commit": os.environ.get("ZERO_COMMIT")
                           or sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse HEAD 2>/dev/null")
                           or "unknown",
            "loadavg_end": sh("cat /proc/loadavg"),
            "zero_tree_dirty": sh(f"git -C {shlex.quote(ZERO_ROOT)} status --porcelain "
                                  "-- zero csrc 2>/dev/null | head -c 2000"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _mib(x):
    return f"{x / MIB:.2f}"


def _pair(values, fmt=_mib):
    values = values if isinstance(values, list) else [values]
    return " / ".join(fmt(v) for v in values)


def findings(ok, probe, interleaved):
    """What the numbers say, computed from this run (the mechanisms named are the engines'
    designs, the same every run)."""
    by = {s["config"]: s for s in ok}
    inter = (interleaved or {}).get("summary") or {}
    out = ["", "## Reading the numbers", ""]

    def ratio(name):
        ref = inter.get("ddp-" + name.split("-")[1])
        it = inter.get(name)
        if not (isinstance(it, dict) and isinstance(ref, dict) and "total" in it
                and "total" in ref):
            return None
        return it["total"]["median"] / ref["total"]["median"]

    for precision in ("fp32", "bf16"):
        names = [n for n in (f"zero{k}-{precision}" for k in range(3)) if n in by]
        ratios = {n: ratio(n) for n in names if ratio(n) is not None}
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
        "  zero's measured model state equals its formula on every rank in every row"
        if exact else
        "  **zero's measured model state differs from its formula in at least one row** "
        "(see the memory table)")
    out[-1] += (". At N=2 the stage-2 buckets (two unit-sized buffers with overlap_comm; the "
                "largest unit here is the 1M-element tied embedding, larger than "
                "reduce_bucket_size) give back part of the gradient saving. RSS is dominated by "
                "the torch runtime (~220 MiB before the model exists) and activations; DDP's "
                "RSS peak is higher than zero stage 0's although their model states are equal "
                "-- likely DDP's construction-time broadcast copy of the parameters and its "
                "first-iteration bucket rebuild, whose freed memory the allocator keeps (not "
                "attributed precisely).")
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


def render_markdown(summaries, probe, interleaved, facts, args, command, wall_s):
    ok = [s for s in summaries if "error" not in s]
    ddp = {s["config"].split("-")[1]: s for s in ok if s["config"].startswith("ddp")}
    numel = ok[0]["numel"] if ok else 0
    lines = [
        "# zero vs PyTorch DDP (world size 2, gloo, CPU)",
        "",
        f"Generated by `benchmarks/bench_ddp.py` on {facts['date']}; whole run {wall_s:.0f} s.",
        "",
        "```",
        command,
        "```",
        "",
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
    inter = (interleaved or {}).get("summary") or {}
    for s in summaries:
        if "error" in s:
            first = s["error"].strip().splitlines()[-1][:200]
            lines.append(f"| {s['config']} | FAILED: {first} | | | | |")
            continue
        precision = s["config"].split("-")[1]
        ref = ddp.get(precision)
        iso_ratio = f"{s['step_ms_median'] / ref['step_ms_median']:.2f}x" if ref else "-"
        cells = ["-", "-", "-"]
        it, it_ref = inter.get(s["config"]), inter.get(f"ddp-{precision}")
        if isinstance(it, dict) and "total" in it:
            cells[0] = f"{it['total']['median']:.1f} ({it['total']['p10']:.1f})"
            cells[1] = " / ".join(f"{it[k]['median']:.1f}" for k in ("forward", "backward", "step"))
            if isinstance(it_ref, dict) and "total" in it_ref:
                cells[2] = (f"{it['total']['median'] / it_ref['total']['median']:.2f}x, "
                            f"{it['total']['p10'] / it_ref['total']['p10']:.2f}x")
        lines.append(
            f"| {s['config']} | {cells[0]} | {cells[1]} | {cells[2]} | "
            f"{s['step_ms_median']:.1f} ({s['step_ms_p10']:.1f}) "
            f"[{', '.join(f'{m:.0f}' for m in s['step_ms_repeat_medians'])}] | {iso_ratio} |")
    if interleaved and "error" in interleaved:
        lines += ["", f"Interleaved run FAILED: {interleaved['error'].strip().splitlines()[-1]}"]
    lines += [
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
        by_op = f"all_reduce {_mib(s['comm_bytes_per_step'])} (analytic)"
        if "comm_bytes_per_step_by_op" in s:
            by_op = ", ".join(f"{k.replace('_bytes', '')} {_mib(v)}"
                              for k, v in s["comm_bytes_per_step_by_op"].items()
                              if v and k != "total_bytes")
        comm_ratio = s["comm_bytes_per_step"] / s["ddp_allreduce_bytes_per_step"]
        lines.append(
            f"| {s['config']} | {_mib(s['comm_bytes_per_step'])} | {by_op} | "
            f"{comm_ratio:.2f}x | {s['loss_first']:.4f} → {s['loss_last']:.4f} |")
    lines += [
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
            f"{_mib(s['model_state_expected_bytes'])} | {_pair(s['bucket_bytes'])} | "
            f"{_pair(s['engine_total_peak_bytes'])} | {_pair(s['rss_start_bytes'])} | "
            f"{_pair(s['rss_peak_bytes'])} |")
    zero_rows = [s for s in ok if not s["config"].startswith("ddp")]
    if zero_rows:
        lines += ["", "### zero's categories (rank 0, MiB: current / peak / formula)", "",
                  "| config | param | gradient | fp32_master | optimizer_state | bucket |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for s in zero_rows:
            cells = []
            for cat in ("param", "gradient", "fp32_master", "optimizer_state", "bucket"):
                c = s["categories"].get(cat)
                if not c:
                    cells.append("-")
                    continue
                exp = (f" / {_mib(c['expected'])} ({c['formula']})"
                       if c.get("expected") is not None else "")
                cells.append(f"{_mib(c['current'])} / {_mib(c['peak'])}{exp}")
            lines.append(f"| {s['config']} | " + " | ".join(cells) + " |")
    if probe and "error" not in probe:
        t = probe["ranks"][0]["timings_ms"]
        lines += ["", f"## gloo primitives on this machine (Ψ = {probe['ranks'][0]['numel']:,} "
                  "elements, median of 7, ms)", "",
                  "| op | fp32 | bf16 |", "| --- | ---: | ---: |"]
        for op in ("all_reduce(Ψ)", "reduce_scatter(Ψ -> Ψ/N)", "all_gather(Ψ/N -> Ψ)"):
            lines.append(f"| {op} | {t[op + ' float32']:.1f} | {t[op + ' bfloat16']:.1f} |")
    lines += findings(ok, probe, interleaved)
    lines += ["", "## Machine", "", "```", f"$ nproc\n{facts['nproc']}", "$ lscpu | head",
              facts["lscpu_head"], "$ free -g", facts["free_g"], "```", "",
              f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}. "
              f"/proc/loadavg at start: `{facts['loadavg_start']}`, at end: "
              f"`{facts['loadavg_end']}` (above 2 means other processes shared the 2 cores).",
              "",
              f"Engine under test: `{facts['zero_root']}` at commit {facts['zero_commit']}"
              + (" (with uncommitted changes under zero/ or csrc/)"
                 if facts["zero_tree_dirty"] else "") + ".", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.world_size)
    configs = list(dict.fromkeys(c.strip() for c in args.configs.split(",") if c.strip()))
    args.config_list = configs
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        sys.exit(f"unknown configs {unknown}; choose from {ALL_CONFIGS}")
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    if ZERO_ROOT != ROOT:
        command = f"ZERO_ROOT={shlex.quote(ZERO_ROOT)} " + command
    t0 = time.perf_counter()
    loadavg_start = open("/proc/loadavg").read().strip()
    results, summaries = [], []
    with tempfile.TemporaryDirectory(prefix="bench_ddp_") as tmp:
        probe = None
        if not args.no_probe:
            probe = _launch("probe", args, tmp)
            print(f"[probe] {json.dumps(probe.get('ranks', [{}])[0].get('timings_ms', probe))}",
                  flush=True)
        interleaved = None
        if args.interleaved_steps > 0:
            interleaved = _launch("interleaved", args, tmp)
            interleaved["summary"] = summarize_interleaved(interleaved)
            print(f"[interleaved] {json.dumps(interleaved['summary'], default=str)[:2000]}",
                  flush=True)
        by_config = {name: [] for name in configs}
        for rep in range(args.repeats):
            # rotate the order each round so slow drift on a shared host spreads evenly
            order = configs[rep % len(configs):] + configs[:rep % len(configs)]
            for name in order:
                result = _launch(name, args, tmp)
                result["repeat"] = rep
                results.append(result)
                by_config[name].append(result)
                if "error" in result:
                    print(f"[{rep}:{name}] FAILED after {result['wall_s']:.1f}s:\n"
                          f"{result['error']}", flush=True)
                else:
                    one = summarize([result], args)
                    print(f"[{rep}:{name}] step {one['step_ms_median']:.1f} ms  model state "
                          f"{_pair(one['model_state_bytes'])} MiB (formula "
                          f"{_mib(one['model_state_expected_bytes'])})  RSS peak "
                          f"{_pair(one['rss_peak_bytes'])} MiB  sent/step "
                          f"{_mib(one['comm_bytes_per_step'])} MiB  loss "
                          f"{one['loss_last']:.4f}  ({result['wall_s']:.1f}s)", flush=True)
        summaries = [summarize(by_config[name], args) for name in configs]
    wall = time.perf_counter() - t0
    facts = machine_facts()
    facts["loadavg_start"] = loadavg_start
    md = render_markdown(summaries, probe, interleaved, facts, args, command, wall)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ddp_vs_zero.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "ddp_vs_zero.json"), "w") as f:
            json.dump({"command": command, "args": vars(args), "machine": facts,
                       "wall_s": wall, "summary": summaries, "probe": probe,
                       "interleaved": interleaved,
                       "raw": results}, f, indent=1)
        print(f"wrote {args.out}/ddp_vs_zero.md and .json")
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
