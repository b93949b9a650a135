"""What optimizer / parameter offload costs and saves, side by side, in one invocation.

    python benchmarks/bench_offload.py                  # the full run (~5 min on 2 cores)
    python benchmarks/bench_offload.py --rounds 1 --steps 2 --warmup 1 --n-layer 2 \
        --n-embd 128 --vocab 2048 --out /tmp/bench     # smoke test (~1 min)

World size 2 on gloo (CPU), bf16 (DeepSpeed's bf16 mode: bf16 params and grads, fp32 master
and AdamW state), one TinyGPT, the same seed, data and micro-batch for every configuration:

    z2            stage 2, no offload
    z2-cpu        stage 2, offload_optimizer {device: cpu}
    z2-cpu-dpu    stage 2, offload_optimizer {device: cpu, delayed_update: true}  (zero-only key)
    z2-nvme       stage 2, offload_optimizer {device: nvme, nvme_path: <--nvme-dir>}
    z3            stage 3, no offload
    z3-cpu-param  stage 3, offload_optimizer {device: cpu} + offload_param {device: cpu}
    z2-cpu-r0.5   stage 2, offload_optimizer {device: cpu, ratio: 0.5}
    z3-cpu-pnvme  stage 3, offload_optimizer {device: cpu} + offload_param {device: nvme}
    z3-infinity   stage 3, offload_optimizer {device: nvme} + offload_param {device: nvme}
                  (ZeRO-Infinity: every model state but the gradient shard on disk)
    anchor        one process: torch.optim.AdamW(fused=True) on the model's Ψ fp32 parameters,
                  the same on one flat Ψ/N tensor (a rank's shard), zero._C.cpu_adam_step on Ψ/N
                  with bf16 grads + bf16 copy (the host kernel of the offloaded step), and a
                  Ψ/N bf16 memcpy (what one device<->host staging copy is on a CPU-only machine)

Every configuration runs in a *fresh* set of processes (tests/distributed_harness.py's
run_distributed: forkserver with torch preloaded), so a process's peak RSS belongs to that
configuration alone. The configurations are run in rounds, the order rotated each round, so
load from other processes on a shared machine spreads over all of them; measured steps are
pooled over the rounds (per-round medians are kept to show the noise).

What each column measures (also written into the results file):

* step time: wall time of forward, backward (engine.backward) and engine.step() of one training
  step, per rank; per step the slower rank, median over the measured steps of all rounds.
* model-state bytes by location: engine.memory_report()["model_state_by_location"]
  (param + gradient + fp32_master + optimizer_state, measured from the engine's accounting
  registry, beside the engine's own expectation for that layout).
* staging: the registry's `staging` category (host buffers the offloaded step streams through).
* device total: every byte the registry holds on the device (model states + buckets +
  gathered stage-3 units), peak.
* RSS peak: ru_maxrss of each rank (includes the torch runtime and activations).
* CPU/step: user+sys CPU time of the rank process per measured step (all its threads: the
  offload copy worker, the DPU updater and the NVMe I/O threads included).
* disk I/O/step: /proc/self/io read_bytes / write_bytes per measured step (the NVMe swap
  traffic; O_DIRECT, so it reaches the block device).

On a CPU-only machine the "device" is the CPU itself: device<->host copies are memcpys in the
same DRAM and the "device" optimizer step runs on the same cores as the host one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The engine under test: this checkout, or another tree with a built zero/ (ZERO_ROOT).
ZERO_ROOT = os.path.abspath(os.environ.get("ZERO_ROOT", ROOT))
if ZERO_ROOT not in sys.path:
    sys.path.insert(0, ZERO_ROOT)
_TESTS = os.path.join(ROOT, "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

MIB = 1024 * 1024
ANCHOR = "anchor"
PROBE = "gloo-probe"
CONFIGS = {
    "z2": (2, {}),
    "z2-cpu": (2, {"offload_optimizer": {"device": "cpu"}}),
    "z2-cpu-dpu": (2, {"offload_optimizer": {"device": "cpu", "delayed_update": True}}),
    "z2-nvme": (2, {"offload_optimizer": {"device": "nvme", "nvme_path": None}}),
    "z3": (3, {}),
    "z3-cpu-param": (3, {"offload_optimizer": {"device": "cpu"},
                         "offload_param": {"device": "cpu"}}),
    "z2-cpu-r0.5": (2, {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}),
    "z3-cpu-pnvme": (3, {"offload_optimizer": {"device": "cpu"},
                         "offload_param": {"device": "nvme", "nvme_path": None}}),
    "z3-infinity": (3, {"offload_optimizer": {"device": "nvme", "nvme_path": None},
                        "offload_param": {"device": "nvme", "nvme_path": None}}),
}
ALL = list(CONFIGS) + [ANCHOR, PROBE]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5,
                   help="fresh processes per configuration and round; order rotated per round")
    p.add_argument("--steps", type=int, default=10, help="measured steps per configuration run")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--bucket-numel", type=int, default=500_000, help="reduce_bucket_size")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--anchor-steps", type=int, default=10)
    p.add_argument("--nvme-dir", default="/var/tmp",
                   help="parent directory of the NVMe swap directory (must not be tmpfs)")
    p.add_argument("--configs", default=",".join(ALL))
    p.add_argument("--timeout", type=float, default=300, help="per run, seconds")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="directory for offload.md / .json ('' to write nothing)")
    p.add_argument("--render-only", default=None,
                   help="rebuild the markdown from a previous run's JSON (measures nothing)")
    return p.parse_args(argv)


# ---- worker side ---------------------------------------------------------------------------
def _rss_now() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _io() -> dict:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f)}
    except OSError:
        return {}


def _gpt(a):
    from zero.models.tiny_gpt import GPTConfig
    return GPTConfig(vocab_size=a["vocab"], block_size=a["block"], n_layer=a["n_layer"],
                     n_head=a["n_head"], n_embd=a["n_embd"])


def engine_config(name, a, nvme_path=None):
    stage, extra = CONFIGS[name]
    zero_cfg = {"stage": stage, "reduce_bucket_size": a["bucket_numel"], "overlap_comm": True}
    for key, value in extra.items():
        value = dict(value)
        if "nvme_path" in value:
            value["nvme_path"] = nvme_path
        zero_cfg[key] = value
    return {
        "train_micro_batch_size_per_gpu": a["micro_batch"],
        "gradient_accumulation_steps": 1,
        "gradient_clipping": a["clip"],
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
                                                  "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero_cfg,
    }


def _run_config(rank, world, name, a, nvme_path):
    import torch.distributed as dist
    import zero
    from zero.models.tiny_gpt import TinyGPT, synthetic_batches

    torch.set_num_threads(a["threads"])
    rss_start = _rss_now()
    gpt = _gpt(a)
    torch.manual_seed(0)
    model = TinyGPT(gpt)
    numel = sum(p.numel() for p in model.parameters())
    cfg = engine_config(name, a, nvme_path)
    t0 = time.perf_counter()
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    init_s = time.perf_counter() - t0
    batches = synthetic_batches(gpt, a["micro_batch"], a["warmup"] + a["steps"],
                                seed=1000 + rank)
    times, losses, pending = [], [], []
    cpu0 = io0 = None
    for i, (tokens, targets) in enumerate(batches):
        if i == a["warmup"]:
            cpu0, io0, wall0 = _cpu_s(), _io(), time.perf_counter()
        t0 = time.perf_counter()
        loss = engine(tokens, targets)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        dist.barrier()  # the other rank's lag lands here, not in step()
        t3 = time.perf_counter()
        engine.step()
        t4 = time.perf_counter()
        losses.append(float(loss.detach()))
        if i >= a["warmup"]:
            times.append({"total": t4 - t0, "forward": t1 - t0, "backward": t2 - t1,
                          "sync": t3 - t2, "step": t4 - t3})
    cpu1, io1, wall1 = _cpu_s(), _io(), time.perf_counter()
    n = len(times)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the profiler
    report = engine.memory_report()
    report.pop("comm", None)
    # One extra step whose engine.step() runs under torch.profiler (not in the times above):
    # which ATen / c10d ops the step spends its main-thread CPU time in.
    tokens, targets = batches[-1]
    engine.backward(engine(tokens, targets))
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.step()
        profiled_wall = time.perf_counter() - t0
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    step_profile = {"wall_ms": profiled_wall * 1e3,
                    "self_cpu_ms_total": sum(e.self_cpu_time_total for e in events) / 1e3,
                    "top": [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                             "calls": e.count} for e in events[:8]]}
    info = [dict(engine._core.group_offload_info(g)) for g in range(engine._core.group_count)]
    swap_files = {}
    if nvme_path:
        for entry in os.listdir(nvme_path):
            if entry.startswith(f"zero-swap-{os.getpid()}-"):
                swap_files[entry] = os.path.getsize(os.path.join(nvme_path, entry))
    if CONFIGS[name][1].get("offload_optimizer", {}).get("delayed_update"):
        engine.apply_delayed_update()
    out = {
        "config": name, "rank": rank, "numel": numel, "threads": torch.get_num_threads(),
        "engine_config": cfg, "init_s": init_s, "step_times": times, "losses": losses,
        "cpu_s_per_step": (cpu1 - cpu0) / max(n, 1),
        "wall_s_measured": wall1 - wall0,
        "io_per_step": {k: (io1.get(k, 0) - io0.get(k, 0)) / max(n, 1)
                        for k in ("read_bytes", "write_bytes")} if io0 else {},
        "report": report, "offload_info": info, "swap_files": swap_files,
        "step_profile": step_profile,
        "rss_start_bytes": rss_start, "rss_end_bytes": _rss_now(),
        "rss_peak_bytes": rss_peak,
        "rss_peak_after_profiled_step_bytes":
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "zero_module": os.path.dirname(zero.__file__),
        "offload_module": getattr(sys.modules.get("offload"), "__file__", None),
    }
    del engine
    return out


def _median_time(fn, steps, warm=2):
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _run_anchor(rank, world, a, shard_numel):
    """One process, one thread: what an AdamW step on these sizes costs on this CPU."""
    import zero  # noqa: F401
    import zero._C as C
    from zero.models.tiny_gpt import TinyGPT

    torch.set_num_threads(a["threads"])
    torch.manual_seed(0)
    model = TinyGPT(_gpt(a))
    params = [p for p in model.parameters()]
    numel = sum(p.numel() for p in params)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt = torch.optim.AdamW(params, fused=True, **hyper)
    steps = a["anchor_steps"]
    out = {"config": ANCHOR, "numel": numel, "shard_numel": shard_numel,
           "threads": torch.get_num_threads(), "seconds": {}}
    out["seconds"]["torch AdamW(fused=True), model params, Ψ fp32"] = \
        _median_time(opt.step, steps)
    del opt, model, params
    flat = torch.zeros(shard_numel, requires_grad=True)
    flat.grad = torch.randn(shard_numel) * 1e-3
    opt = torch.optim.AdamW([flat], fused=True, **hyper)
    out["seconds"]["torch AdamW(fused=True), one flat Ψ/N fp32 tensor"] = \
        _median_time(opt.step, steps)
    del opt
    p = flat.detach().clone()
    g16 = (torch.randn(shard_numel) * 1e-3).bfloat16()
    m, v = torch.zeros(shard_numel), torch.zeros(shard_numel)
    o16 = torch.empty(shard_numel, dtype=torch.bfloat16)
    state = {"step": 0}

    def zero_adam():
        state["step"] += 1
        C.cpu_adam_step(p, g16, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, True, state["step"],
                        1.0, o16, "auto", a["threads"])
    out["seconds"]["zero._C.cpu_adam_step, Ψ/N, bf16 grads + bf16 copy"] = \
        _median_time(zero_adam, steps)
    flat2 = torch.zeros(shard_numel, requires_grad=True)
    flat2.grad = torch.randn(shard_numel) * 1e-3
    opt = torch.optim.AdamW([flat2], foreach=False, **hyper)
    out["seconds"]["torch AdamW(foreach=False), one flat Ψ/N fp32 tensor (op by op)"] = \
        _median_time(opt.step, max(3, steps // 2), warm=1)
    del opt, flat2
    src = torch.randn(shard_numel).bfloat16()
    dst = torch.empty_like(src)
    out["seconds"]["memcpy Ψ/N bf16 (one staging copy)"] = \
        _median_time(lambda: dst.copy_(src), steps)
    out["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def _run_probe(rank, world, a, shard_numel):
    """What gloo's collectives cost here on the engine's buffer sizes (bf16)."""
    import torch.distributed as dist

    full = torch.ones(shard_numel * world, dtype=torch.bfloat16)
    shard = torch.empty(shard_numel, dtype=torch.bfloat16)
    scalar = torch.ones(1)
    ops = {"all_gather Ψ/N -> Ψ bf16 (the step's parameter gather)":
               lambda: dist.all_gather_into_tensor(full, shard),
           "reduce_scatter Ψ -> Ψ/N bf16 (backward's gradient reduction)":
               lambda: dist.reduce_scatter_tensor(shard, full),
           "all_reduce 1 fp32 (the norm)": lambda: dist.all_reduce(scalar)}
    out = {"config": PROBE, "seconds": {}}
    for name, fn in ops.items():
        fn()
        samples = []
        for _ in range(7):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        out["seconds"][name] = statistics.median(samples)
    return out


# ---- parent side ---------------------------------------------------------------------------
def _launch(name, args, nvme_root, shard_numel, tag):
    from distributed_harness import run_distributed

    a = vars(args)
    t0 = time.perf_counter()
    nvme_path = None
    try:
        if name == ANCHOR:
            ranks = run_distributed(_run_anchor, 1, args=(a, shard_numel), timeout=args.timeout)
        elif name == PROBE:
            ranks = run_distributed(_run_probe, args.world_size, args=(a, shard_numel),
                                    timeout=args.timeout)
        else:
            if any(block.get("device") == "nvme" for block in CONFIGS.get(name, (0, {}))[1].values()):
                nvme_path = os.path.join(nvme_root, f"{name}-{tag}")
                os.makedirs(nvme_path, exist_ok=True)
            ranks = run_distributed(_run_config, args.world_size, args=(name, a, nvme_path),
                                    timeout=args.timeout)
    except Exception:  # noqa: BLE001 -- keep going; the table shows the failure
        return {"config": name, "error": traceback.format_exc(),
                "wall_s": time.perf_counter() - t0}
    finally:
        if nvme_path:
            left = os.listdir(nvme_path)
            shutil.rmtree(nvme_path, ignore_errors=True)
    result = {"config": name, "ranks": ranks, "wall_s": time.perf_counter() - t0}
    if nvme_path:
        result["swap_files_left_after_exit"] = left
    return result


class LoadSampler(threading.Thread):
    def __init__(self, every=5.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._stop_event = every, [], threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            with open("/proc/loadavg") as f:
                self.samples.append(float(f.read().split()[0]))
            self._stop_event.wait(self.every)

    def stop(self):
        self._stop_event.set()


def _sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"({exc})"


def nvme_facts(nvme_root):
    facts = {"path": nvme_root,
             "findmnt": _sh(f"findmnt -T {shlex.quote(nvme_root)} -o TARGET,SOURCE,FSTYPE"),
             "fstype": _sh(f"findmnt -n -T {shlex.quote(nvme_root)} -o FSTYPE"),
             "source": _sh(f"findmnt -n -T {shlex.quote(nvme_root)} -o SOURCE")}
    dev = os.path.basename(facts["source"])
    facts["rotational"] = _sh(f"cat /sys/block/{dev}/queue/rotational 2>/dev/null")
    probe = os.path.join(nvme_root, ".odirect_probe")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | getattr(os, "O_DIRECT", 0), 0o600)
        os.close(fd)
        facts["o_direct"] = "accepted"
    except OSError as exc:
        facts["o_direct"] = f"refused ({exc})"
    finally:
        if os.path.exists(probe):
            os.unlink(probe)
    return facts


def _load_text(samples, nproc):
    cores = int(nproc) if str(nproc).isdigit() else (os.cpu_count() or 1)
    return (f"min {min(samples):.2f}, median {statistics.median(samples):.2f}, max "
            f"{max(samples):.2f} over {len(samples)} samples, {sum(x > cores for x in samples)} "
            f"of them above {cores}")


def machine_facts():
    return {"lscpu_head": _sh("lscpu | head -20"), "nproc": _sh("nproc"),
            "cpu_model": _sh("lscpu | sed -n 's/^Model name: *//p'"),
            "free_g": _sh("free -g"), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "zero_root": ZERO_ROOT,
            "zero_commit": os.environ.get("ZERO_COMMIT")
                           or _sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse --short HEAD "
                                  "2>/dev/null") or "unknown",
            "zero_root_packages": sorted(
                d for d in os.listdir(ZERO_ROOT)
                if os.path.exists(os.path.join(ZERO_ROOT, d, "__init__.py"))),
            "zero_is_git_tree": _sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse "
                                    "--show-toplevel 2>/dev/null") == ZERO_ROOT,
            "zero_tree_dirty": _sh(f"git -C {shlex.quote(ZERO_ROOT)} status --porcelain "
                                   "-- zero csrc 2>/dev/null | head -c 2000"),
            "zero_extension_sha256": _sh(f"sha256sum {shlex.quote(ZERO_ROOT)}/zero/_C*.so "
                                         "2>/dev/null | cut -c1-16"),
            "checkout_commit": _sh(f"git -C {shlex.quote(ROOT)} rev-parse --short HEAD"),
            "checkout_dirty": _sh(f"git -C {shlex.quote(ROOT)} status --porcelain "
                                  "| head -c 2000"),
            "loadavg_end": _sh("cat /proc/loadavg"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _med(values):
    return statistics.median(values) if values else float("nan")


def summarize(name, results):
    failed = [r for r in results if "error" in r]
    if failed:
        return {"config": name, "error": failed[0]["error"]}
    if name in (ANCHOR, PROBE):
        rs = [r["ranks"][0] for r in results]
        keys = list(rs[0]["seconds"])
        return {"config": name, "numel": rs[0].get("numel"),
                "shard_numel": rs[0].get("shard_numel"),
                "ms": {k: _med([r["seconds"][k] for r in rs]) * 1e3 for k in keys},
                "ms_per_round": {k: [r["seconds"][k] * 1e3 for r in rs] for k in keys}}
    phases = {k: [] for k in ("total", "forward", "backward", "sync", "step")}
    round_medians = []
    round_phase = {k: [] for k in phases}
    for res in results:
        ranks = res["ranks"]
        n = len(ranks[0]["step_times"])
        per_step = [max(r["step_times"][i]["total"] for r in ranks) for i in range(n)]
        round_medians.append(_med(per_step) * 1e3)
        phases["total"] += per_step
        round_phase["total"].append(_med(per_step) * 1e3)
        for k in ("forward", "backward", "sync", "step"):
            vals = [max(r["step_times"][i][k] for r in ranks) for i in range(n)]
            phases[k] += vals
            round_phase[k].append(_med(vals) * 1e3)
    last = results[-1]["ranks"]
    reports = [r["report"] for r in last]
    rep = reports[0]
    cats = rep["categories"]
    sw = len(last)
    s = {
        "config": name,
        "numel": last[0]["numel"],
        "padded_numel": rep["numel"],
        "measured_steps": len(phases["total"]),
        "ms": {k: _med(v) * 1e3 for k, v in phases.items()},
        "ms_p10": sorted(phases["total"])[len(phases["total"]) // 10] * 1e3,
        "round_medians_ms": round_medians,
        "round_phase_ms": round_phase,
        "by_location": [r["model_state_by_location"] for r in reports],
        "by_location_exact": all(r["model_state_by_location"]["measured"]
                                 == r["model_state_by_location"]["expected"] for r in reports),
        "model_state_bytes": rep["model_state_bytes"],
        "model_state_formula": rep["model_state_formula"],
        "categories": {c: {"current": v["current"], "peak": v["peak"],
                           "locations": sorted(v.get("by_location", {})),
                           "formula": v.get("formula")} for c, v in cats.items()},
        "staging_peak": [r["categories"].get("staging", {}).get("peak", 0) for r in reports],
        "device_total_peak": [r["by_location"]["device"]["peak"] for r in reports],
        "rss_peak_bytes": [_med([res["ranks"][k]["rss_peak_bytes"] for res in results])
                           for k in range(sw)],
        "rss_start_bytes": [_med([res["ranks"][k]["rss_start_bytes"] for res in results])
                            for k in range(sw)],
        "cpu_ms_per_step": [_med([res["ranks"][k]["cpu_s_per_step"] for res in results]) * 1e3
                            for k in range(sw)],
        "io_per_step": {key: [_med([res["ranks"][k]["io_per_step"].get(key, 0)
                                    for res in results]) for k in range(sw)]
                        for key in ("read_bytes", "write_bytes")},
        "init_s": _med([res["ranks"][0]["init_s"] for res in results]),
        "offload_info": last[0]["offload_info"],
        "step_profile": _profile_over_rounds([res["ranks"][0]["step_profile"]
                                              for res in results]),
        "swap_files": [r["swap_files"] for r in last],
        "swap_files_left_after_exit": [res.get("swap_files_left_after_exit") for res in results],
        "loss_first": last[0]["losses"][0],
        "loss_last": last[0]["losses"][-1],
    }
    return s


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
        top.append({"op": op, "self_cpu_ms": _med(vals), "calls": meta["calls"]})
    top.sort(key=lambda t: t["self_cpu_ms"], reverse=True)
    return {"wall_ms": _med([p["wall_ms"] for p in profiles]),
            "self_cpu_ms_total": _med([p["self_cpu_ms_total"] for p in profiles]),
            "top": top[:8], "rounds": len(profiles)}


def _mib(x):
    return f"{x / MIB:.1f}"


def _pair(values, fmt=_mib):
    values = values if isinstance(values, list) else [values]
    if len(set(values)) == 1:
        return fmt(values[0])
    return " / ".join(fmt(v) for v in values)


PAIRS = [("z2-cpu", "z2"), ("z2-cpu-dpu", "z2-cpu"), ("z2-nvme", "z2-cpu"),
         ("z3-cpu-param", "z3"), ("z2-cpu-r0.5", "z2"), ("z3-cpu-pnvme", "z3-cpu-param"),
         ("z3-infinity", "z3-cpu-pnvme")]


def paired(by, a, b, phase="total"):
    """Per round: median of a's steps minus median of b's (the same round's fresh runs, run
    close together); returns the median over rounds and the range."""
    ra, rb = by[a]["round_phase_ms"][phase], by[b]["round_phase_ms"][phase]
    diffs = [x - y for x, y in zip(ra, rb)]
    return {"median": _med(diffs), "min": min(diffs), "max": max(diffs), "n": len(diffs)}


def _ms(x):
    return f"{x:+.0f}"


def _verdict(d):
    if d["max"] < 0:
        return f"faster in all {d['n']} rounds"
    if d["min"] > 0:
        return f"slower in all {d['n']} rounds"
    return "within the round-to-round noise"


def findings(by, anchor, probe, args):
    """Six sentences, every number from this run; the wording that depends on a sign or on the
    noise is chosen from the data."""
    out = ["", "## Findings", ""]
    need = ("z2", "z2-cpu", "z2-cpu-dpu", "z2-nvme", "z3", "z3-cpu-param", "z2-cpu-r0.5")
    if any(k not in by for k in need) or not anchor or not probe:
        out.append("(some configurations failed or were not run; no findings written)")
        return out
    z2, cpu, dpu, nvme, z3, z3p, half = (by[k] for k in need)

    def loc(s, where):
        return s["by_location"][0]["measured"][where]

    def ms(s, k="total"):
        return s["ms"][k]

    def rng(d):
        return f"{_ms(d['median'])} ms [{_ms(d['min'])}..{_ms(d['max'])}]"
    exact = all(s["by_location_exact"] for s in by.values() if "by_location" in s)
    a, g = anchor["ms"], probe["ms"]
    adam_fused = a["zero._C.cpu_adam_step, Ψ/N, bf16 grads + bf16 copy"]
    adam_ops = a["torch AdamW(foreach=False), one flat Ψ/N fp32 tensor (op by op)"]
    memcpy = a["memcpy Ψ/N bf16 (one staging copy)"]
    gather = g["all_gather Ψ/N -> Ψ bf16 (the step's parameter gather)"]
    pow_ms = _med([t["self_cpu_ms"] for s in by.values() if "step_profile" in s
                   for t in s["step_profile"]["top"] if t["op"] == "aten::pow"])
    copy_ms = _med([t["self_cpu_ms"] for s in by.values() if "step_profile" in s
                    for t in s["step_profile"]["top"] if t["op"] == "aten::copy_"])
    d_cpu, d_z3, d_half = (paired(by, x, y) for x, y in
                           (("z2-cpu", "z2"), ("z3-cpu-param", "z3"), ("z2-cpu-r0.5", "z2")))
    d_dpu, d_dpu_step = paired(by, "z2-cpu-dpu", "z2-cpu"), paired(by, "z2-cpu-dpu", "z2-cpu",
                                                                   "step")
    fb = (paired(by, "z2-cpu-dpu", "z2-cpu", "forward")["median"]
          + paired(by, "z2-cpu-dpu", "z2-cpu", "backward")["median"])
    d_nvme, d_nvme_step = paired(by, "z2-nvme", "z2-cpu"), paired(by, "z2-nvme", "z2-cpu", "step")
    io = nvme["io_per_step"]
    io_bytes = sum(io["read_bytes"]) + sum(io["write_bytes"])
    rss = lambda s: max(s["rss_peak_bytes"])  # noqa: E731
    out.append(
        f"1. **Saves (device).** CPU offload takes the fp32 master, Adam m, v and the gradient "
        f"shard (12Ψ/N + 2Ψ/N = {_mib(loc(cpu, 'host'))} MiB per rank) off the device, so "
        f"device model states fall "
        f"from {_mib(loc(z2, 'device'))} to {_mib(loc(cpu, 'device'))} MiB per rank at stage 2 "
        f"(-{1 - loc(cpu, 'device') / loc(z2, 'device'):.0%}; ratio 0.5 keeps "
        f"{_mib(loc(half, 'device'))} MiB there) and, with offload_param too, from "
        f"{_mib(loc(z3, 'device'))} to {_mib(loc(z3p, 'device'))} MiB at stage 3 "
        f"(-{1 - loc(z3p, 'device') / loc(z3, 'device'):.0%}), byte for byte as the engine "
        f"expects ({'every' if exact else '**not every**'} row), while the host adds staging "
        f"({_pair(cpu['staging_peak'])} MiB; {_pair(dpu['staging_peak'])} with DPU; "
        f"{_pair(nvme['staging_peak'])} for NVMe, nearly the {_mib(loc(nvme, 'nvme'))} MiB it "
        f"put on disk, because it holds two 4M-element chunks of each array) -- and since "
        f"device and host are the same DRAM here, process RSS does not fall (peak "
        f"{_mib(rss(z2))} MiB for z2 vs {_mib(rss(cpu))} for z2-cpu).")
    out.append(
        f"2. **Costs (time, here).** Paired by round, CPU offload changes the stage-2 step by "
        f"{rng(d_cpu)} ({_verdict(d_cpu)}; engine.step() {ms(z2, 'step'):.0f} -> "
        f"{ms(cpu, 'step'):.0f} ms), optimizer + parameter offload the stage-3 step by "
        f"{rng(d_z3)} ({_verdict(d_z3)}; step() {ms(z3, 'step'):.0f} -> "
        f"{ms(z3p, 'step'):.0f} ms) and ratio 0.5 by {rng(d_half)} ({_verdict(d_half)}). "
        f"On this CPU-only machine the offloaded step runs the fused CPU Adam "
        f"({adam_fused:.0f} ms on Ψ/N; torch AdamW(fused=True): "
        f"{a['torch AdamW(fused=True), one flat Ψ/N fp32 tensor']:.0f} ms on Ψ/N, "
        f"{a['torch AdamW(fused=True), model params, Ψ fp32']:.0f} ms on all Ψ in one "
        f"process) where the non-offloaded one updates op by op in ATen (~{adam_ops:.0f} ms "
        f"by torch's for-loop AdamW on Ψ/N), and a device<->host copy is a {memcpy:.1f} ms "
        f"memcpy of Ψ/N bf16.")
    hideable = max(-d_dpu_step["median"], 0.0)
    out.append(
        f"3. **DPU.** delayed_update changes engine.step() by {rng(d_dpu_step)} "
        f"({_verdict(d_dpu_step)}), roughly the host update it moves onto the updater thread "
        f"(fused CPU Adam ~{adam_fused:.0f} ms plus Ψ/N copies of ~{memcpy:.0f} ms each, some "
        f"of which DPU adds back: grads into its own buffer, the previous update's parameters "
        f"applied), while forward + backward change by {fb:+.0f} ms and the whole step by "
        f"{rng(d_dpu)} ({_verdict(d_dpu)}): all DPU can hide here is ~{hideable:.0f} ms of a "
        f"~{ms(cpu):.0f} ms step, because step() is dominated by the all-gather and the norm, "
        f"which it does not move.")
    out.append(
        f"4. **NVMe.** The swap file adds {rng(d_nvme)} per step over host memory "
        f"({_verdict(d_nvme)}; {_ms(d_nvme_step['median'])} ms of it in engine.step()), "
        f"because every step reads and writes the whole 12Ψ/N state with O_DIRECT "
        f"({_pair(io['read_bytes'])} MiB read + {_pair(io['write_bytes'])} MiB written per "
        f"rank, ~{io_bytes / MIB / max(d_nvme_step['median'] / 1e3, 1e-9):.0f} MiB/s for both "
        f"ranks over the added time) on {args.nvme_fs}, the VM's virtio disk, not a local NVMe "
        f"drive.")
    out.append(
        f"5. **Where the time goes.** Forward + backward are "
        f"{ms(z2, 'forward') + ms(z2, 'backward'):.0f} of the {ms(z2):.0f} ms z2 step (backward "
        f"includes the reduce-scatters; gloo needs "
        f"{g['reduce_scatter Ψ -> Ψ/N bf16 (backward' + chr(39) + 's gradient reduction)']:.0f}"
        f" ms for Ψ bf16), and engine.step() is mostly the parameter all-gather ({gather:.0f} "
        f"ms on gloo; stage 3 has none, hence its shorter step), one aten::pow of "
        f"~{pow_ms:.0f} ms in the global gradient norm, ~{copy_ms:.0f} ms of aten::copy_ and, "
        f"without offload, the op-by-op update (table above).")
    out.append(
        "6. **On a GPU the time columns would differ:** the device update takes a few ms, the "
        "copies cross PCIe (pinned memory, which this CPU build cannot use) and the host "
        "cores idle during forward/backward, so offload typically costs step time there and "
        "DPU has something to overlap; only the byte columns carry over.")
    if all(k in by for k in ("z3-cpu-pnvme", "z3-infinity")):
        pn, inf = by["z3-cpu-pnvme"], by["z3-infinity"]
        d_pn, d_inf = paired(by, "z3-cpu-pnvme", "z3-cpu-param"), paired(by, "z3-infinity",
                                                                          "z3-cpu-pnvme")
        io_pn, io_inf = pn["io_per_step"], inf["io_per_step"]
        out.append(
            f"7. **Parameters on NVMe (ZeRO-Infinity).** offload_param nvme moves the "
            f"{_mib(loc(pn, 'nvme'))} MiB bf16 parameter shard from host memory to the swap "
            f"file (host model states {_mib(loc(z3p, 'host'))} -> {_mib(loc(pn, 'host'))} MiB; "
            f"the host keeps buffer_count buffers of one unit each, staging "
            f"{_pair(pn['staging_peak'])} MiB) at {rng(d_pn)} per step over parameters in "
            f"host memory ({_verdict(d_pn)}; {_pair(io_pn['read_bytes'])} MiB read + "
            f"{_pair(io_pn['write_bytes'])} MiB written per rank per step: each unit is read "
            f"for forward and again for backward when the buffers cannot hold it, and written "
            f"once by the step). With the optimizer on NVMe too, device model states are "
            f"{_mib(loc(inf, 'device'))} MiB and host {_mib(loc(inf, 'host'))} MiB per rank, "
            f"everything else ({_mib(loc(inf, 'nvme'))} MiB) on disk, at {rng(d_inf)} more "
            f"per step ({_verdict(d_inf)}; {_pair(io_inf['read_bytes'])} MiB read + "
            f"{_pair(io_inf['write_bytes'])} MiB written per rank per step).")
    return out


def render_markdown(summaries, facts, args, command, wall_s, rendered_from=None):
    by = {s["config"]: s for s in summaries if "error" not in s}
    anchor = by.get(ANCHOR)
    probe = by.get(PROBE)
    engines = [s for s in summaries if s["config"] not in (ANCHOR, PROBE)]
    numel = next((s["numel"] for s in engines if "numel" in s), 0)
    nf = facts.get("nvme", {})
    lines = [
        f"# Offload: what it saves and what it costs (world size {args.world_size}, gloo, CPU)",
        "",
        f"Generated by `benchmarks/bench_offload.py` on {facts['date']}; whole run "
        f"{wall_s:.0f} s.",
        "",
        "```",
        command,
        "```",
        "",
    ]
    if rendered_from:
        lines += [f"(Report rebuilt from `{rendered_from}` by `--render-only`; the numbers are "
                  "that run's.)", ""]
    lines += [
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
                         f"{s['error'].strip().splitlines()[-1][:200]} | | | | | | | |")
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
    pairs = [(x, y) for x, y in PAIRS if x in by and y in by]
    if pairs:
        lines += ["", "### Paired by round (ms): per round, this config's median minus the "
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
    lines += [
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
    lines += ["", "### Categories (rank 0, MiB current, where they live)", "",
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
    if anchor:
        lines += ["", f"## Anchor: one process, {args.threads} thread, Ψ = {anchor['numel']:,}, "
                  f"Ψ/N = {anchor['shard_numel']:,} (ms, median; per round in brackets)", "",
                  "| what | ms |", "| --- | ---: |"]
        for k, v in anchor["ms"].items():
            per = ", ".join(f"{x:.1f}" for x in anchor["ms_per_round"][k])
            lines.append(f"| {k} | {v:.1f} [{per}] |")
    elif ANCHOR in [s["config"] for s in summaries]:
        lines += ["", "Anchor FAILED."]
    if probe:
        lines += ["", f"## gloo on this machine ({args.world_size} ranks, median of 7; ms, "
                  "per round in brackets)", "", "| op | ms |", "| --- | ---: |"]
        for k, v in probe["ms"].items():
            per = ", ".join(f"{x:.1f}" for x in probe["ms_per_round"][k])
            lines.append(f"| {k} | {v:.1f} [{per}] |")
    profiled = [s for s in engines if "step_profile" in s]
    if profiled:
        lines += ["", "## Inside engine.step() (rank 0, one extra step per round under "
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
    if "z2-nvme" in by:
        sf = by["z2-nvme"]
        files = ", ".join(f"{k} {_mib(v)} MiB" for d in sf["swap_files"] for k, v in d.items())
        lines += ["", f"NVMe: swap files per rank {files}; "
                  f"I/O backend `{sf['offload_info'][0]['swap'].split(' (')[-1].rstrip(')')}`; "
                  f"files left after the processes exited: "
                  f"{sum(len(x or []) for x in sf['swap_files_left_after_exit'])}."]
    lines += findings(by, anchor, probe, args)
    lines += ["", "## Machine", "", "```", f"$ nproc\n{facts['nproc']}", "$ lscpu | head -20",
              facts["lscpu_head"], "$ free -g", facts["free_g"],
              f"$ findmnt -T {nf.get('path')} -o TARGET,SOURCE,FSTYPE", nf.get("findmnt", ""),
              "```", "",
              f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}.",
              "",
              f"Load: /proc/loadavg at start `{facts['loadavg_start']}`, at end "
              f"`{facts['loadavg_end']}`; 1-min load sampled every 5 s: "
              f"{facts.get('loadavg_samples_text', 'n/a')}. The machine has "
              f"{facts['nproc']} cores; a load above {facts['nproc']} means other processes "
              f"shared them during the run (the rounds and rotation spread that over all "
              f"configurations, the per-round medians show how much it moved).",
              "",
              f"Engine under test: `{facts['zero_root']}` at commit {facts['zero_commit']}"
              + ((" (with uncommitted changes under zero/ or csrc/)"
                  if facts["zero_tree_dirty"] else " (zero/ and csrc/ clean)")
                 if facts.get("zero_is_git_tree", True) else
                 (" -- a snapshot, not a git tree: `git archive <commit> "
                  f"{' '.join(facts.get('zero_root_packages') or ['zero'])} | tar -x -C "
                  f"{facts['zero_root']} && cp zero/_C*.so {facts['zero_root']}/zero/` "
                  "(the commit's Python packages plus the extension already built in the "
                  "checkout, copied, not rebuilt), so edits to the checkout during the run "
                  "could not reach it; the ranks imported "
                  f"{', '.join(f'`{m}`' for m in facts.get('modules_imported', []))}"))
              + f"; extension sha256 {facts['zero_extension_sha256']}…; checkout "
              + (f"{facts['checkout_commit_at_start']} at the start, "
                 if facts.get("checkout_commit_at_start") not in (None, facts["checkout_commit"])
                 else "")
              + f"{facts['checkout_commit']}" + (" at the end"
                 if facts.get("checkout_commit_at_start") not in (None, facts["checkout_commit"])
                 else "")
              + (" with uncommitted changes: `" + " ".join(
                  facts["checkout_dirty"].split()) [:300] + "`"
                 if facts["checkout_dirty"] else " (clean)") + ".", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.render_only:
        with open(args.render_only) as f:
            data = json.load(f)
        for k, v in data["args"].items():
            if k not in ("render_only", "out"):
                setattr(args, k, v)
        if data["machine"].get("loadavg_samples"):
            data["machine"]["loadavg_samples_text"] = _load_text(
                data["machine"]["loadavg_samples"], data["machine"]["nproc"])
        md = render_markdown(data["summary"], data["machine"], args, data["command"],
                             data["wall_s"], rendered_from=args.render_only)
        print(md)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "offload.md"), "w") as f:
                f.write(md)
        return 0
    configs = list(dict.fromkeys(c.strip() for c in args.configs.split(",") if c.strip()))
    unknown = [c for c in configs if c not in ALL]
    if unknown:
        sys.exit(f"unknown configs {unknown}; choose from {ALL}")
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    if os.environ.get("ZERO_COMMIT"):
        command = f"ZERO_COMMIT={shlex.quote(os.environ['ZERO_COMMIT'])} " + command
    if ZERO_ROOT != ROOT:
        command = f"ZERO_ROOT={shlex.quote(ZERO_ROOT)} " + command
    checkout_at_start = _sh(f"git -C {shlex.quote(ROOT)} rev-parse --short HEAD")
    nvme_root = tempfile.mkdtemp(prefix="zero_bench_offload_", dir=args.nvme_dir)
    nf = nvme_facts(nvme_root)
    if nf["fstype"] in ("tmpfs", "ramfs"):
        sys.exit(f"--nvme-dir {args.nvme_dir} is on {nf['fstype']}; pick a directory on a disk")
    args.nvme_fs = f"{nf['fstype']} on {nf['source']}"
    # a rank's shard of the flat parameter space, for the anchor (TinyGPT's padded Ψ / N)
    from zero.models.tiny_gpt import TinyGPT
    numel = sum(p.numel() for p in TinyGPT(_gpt(vars(args))).parameters())
    shard_numel = -(-numel // args.world_size)
    t0 = time.perf_counter()
    loadavg_start = open("/proc/loadavg").read().strip()
    sampler = LoadSampler()
    sampler.start()
    raw, by_config = [], {name: [] for name in configs}
    try:
        for rnd in range(args.rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for name in order:
                result = _launch(name, args, nvme_root, shard_numel, f"r{rnd}")
                result["round"] = rnd
                raw.append(result)
                by_config[name].append(result)
                if "error" in result:
                    print(f"[{rnd}:{name}] FAILED after {result['wall_s']:.1f}s:\n"
                          f"{result['error']}", flush=True)
                    continue
                one = summarize(name, [result])
                if name in (ANCHOR, PROBE):
                    print(f"[{rnd}:{name}] " + ", ".join(f"{k}: {v:.1f} ms"
                                                       for k, v in one["ms"].items()), flush=True)
                else:
                    m = one["by_location"][0]["measured"]
                    print(f"[{rnd}:{name}] {one['ms']['total']:.0f} ms (fwd "
                          f"{one['ms']['forward']:.0f}, bwd {one['ms']['backward']:.0f}, step "
                          f"{one['ms']['step']:.0f})  device/host/nvme {_mib(m['device'])}/"
                          f"{_mib(m['host'])}/{_mib(m['nvme'])} MiB  RSS peak "
                          f"{_pair(one['rss_peak_bytes'])}  ({result['wall_s']:.1f}s)",
                          flush=True)
    finally:
        sampler.stop()
        shutil.rmtree(nvme_root, ignore_errors=True)
    summaries = [summarize(name, by_config[name]) for name in configs]
    wall = time.perf_counter() - t0
    facts = machine_facts()
    facts["loadavg_start"] = loadavg_start
    facts["checkout_commit_at_start"] = checkout_at_start
    facts["modules_imported"] = sorted({m for res in raw for r in res.get("ranks", [])
                                        for m in (r.get("zero_module"), r.get("offload_module"))
                                        if m})
    facts["nvme"] = nf
    samples = sampler.samples
    facts["loadavg_samples"] = samples
    if samples:
        facts["loadavg_samples_text"] = _load_text(samples, facts["nproc"])
    md = render_markdown(summaries, facts, args, command, wall)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "offload.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "offload.json"), "w") as f:
            json.dump({"command": command, "args": vars(args), "machine": facts,
                       "wall_s": wall, "summary": summaries, "raw": raw}, f, indent=1)
        print(f"wrote {args.out}/offload.md and .json")
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
