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
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.cli import add_model_args, chosen_configs  # noqa: E402
from benchmarks.launch import outcome  # noqa: E402
from benchmarks.memory import rss_now, rss_peak  # noqa: E402
from benchmarks.models import (ADAMW, count_params, engine_config, gpt_config,  # noqa: E402
                               rank_batches, seeded_model, torch_adamw)
from benchmarks.offload_report import (ANCHOR, PROBE, load_text, render_markdown,  # noqa: E402
                                       summarize)
from benchmarks.report import mib, pair, publish  # noqa: E402
from benchmarks.timing import (collective_median, engine_step, measure_steps,  # noqa: E402
                               median_time, rotated)

_TESTS = os.path.join(ROOT, "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

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
    add_model_args(p, micro_batch=2, vocab=8192, n_layer=6, n_embd=512)
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
def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _io() -> dict:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f)}
    except OSError:
        return {}


def offload_config(name, a, nvme_path=None):
    stage, extra = CONFIGS[name]
    zero_cfg = {"stage": stage, "reduce_bucket_size": a["bucket_numel"], "overlap_comm": True}
    for key, value in extra.items():
        value = dict(value)
        if "nvme_path" in value:
            value["nvme_path"] = nvme_path
        zero_cfg[key] = value
    return engine_config(a["micro_batch"], a["clip"], zero_cfg, bf16=True)


def _run_config(rank, world, name, a, nvme_path):
    import zero
    from zero.boundary import as_dict

    torch.set_num_threads(a["threads"])
    rss_start = rss_now()
    gpt = gpt_config(a)
    model = seeded_model(gpt)
    numel = count_params(model)
    cfg = offload_config(name, a, nvme_path)
    t0 = time.perf_counter()
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    init_s = time.perf_counter() - t0
    batches = rank_batches(gpt, a["micro_batch"], a["warmup"] + a["steps"], rank)
    start = {}
    losses, times = measure_steps(
        lambda tokens, targets: engine_step(engine, tokens, targets, sync=True), batches,
        a["warmup"],
        at_warmup_end=lambda: start.update(cpu=_cpu_s(), io=_io(), wall=time.perf_counter()))
    cpu1, io1, wall1 = _cpu_s(), _io(), time.perf_counter()
    n = max(len(times), 1)
    rss_peak_measured = rss_peak()  # before the profiler
    report = engine.memory_report()
    report.pop("comm", None)
    step_profile = _profiled_step(engine, batches[-1])
    info = [as_dict(engine.core.group_offload_info(g)) for g in range(engine.core.group_count)]
    swap_files = _swap_files(nvme_path)
    if CONFIGS[name][1].get("offload_optimizer", {}).get("delayed_update"):
        engine.apply_delayed_update()
    out = {
        "config": name, "rank": rank, "numel": numel, "threads": torch.get_num_threads(),
        "engine_config": cfg, "init_s": init_s, "step_times": times, "losses": losses,
        "cpu_s_per_step": (cpu1 - start["cpu"]) / n,
        "wall_s_measured": wall1 - start["wall"],
        "io_per_step": {k: (io1.get(k, 0) - start["io"].get(k, 0)) / n
                        for k in ("read_bytes", "write_bytes")} if start["io"] else {},
        "report": report, "offload_info": info, "swap_files": swap_files,
        "step_profile": step_profile,
        "rss_start_bytes": rss_start, "rss_end_bytes": rss_now(),
        "rss_peak_bytes": rss_peak_measured, "rss_peak_after_profiled_step_bytes": rss_peak(),
        "zero_module": os.path.dirname(zero.__file__),
        "offload_module": getattr(sys.modules.get("offload"), "__file__", None),
    }
    del engine
    return out


def _profiled_step(engine, batch):
    """One extra step whose engine.step() runs under torch.profiler (not in the times): which
    ATen / c10d ops the step spends its main-thread CPU time in."""
    import torch.distributed as dist

    engine.backward(engine(*batch))
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.step()
        profiled_wall = time.perf_counter() - t0
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"wall_ms": profiled_wall * 1e3,
            "self_cpu_ms_total": sum(e.self_cpu_time_total for e in events) / 1e3,
            "top": [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "calls": e.count} for e in events[:8]]}


def _swap_files(nvme_path):
    """This process's swap files under nvme_path and their sizes."""
    if not nvme_path:
        return {}
    return {entry: os.path.getsize(os.path.join(nvme_path, entry))
            for entry in os.listdir(nvme_path) if entry.startswith(f"zero-swap-{os.getpid()}-")}


def _run_anchor(rank, world, a, shard_numel):
    """One process, one thread: what an AdamW step on these sizes costs on this CPU."""
    import zero  # noqa: F401
    import zero._C as C

    torch.set_num_threads(a["threads"])
    model = seeded_model(gpt_config(a))
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    steps = a["anchor_steps"]
    out = {"config": ANCHOR, "numel": count_params(model), "shard_numel": shard_numel,
           "threads": torch.get_num_threads(), "seconds": {}}
    seconds = out["seconds"]
    seconds["torch AdamW(fused=True), model params, Ψ fp32"] = \
        median_time(torch_adamw(params, fused=True).step, steps)
    del model, params
    flat = _flat_param(shard_numel)
    seconds["torch AdamW(fused=True), one flat Ψ/N fp32 tensor"] = \
        median_time(torch_adamw([flat], fused=True).step, steps)
    p = flat.detach().clone()
    g16 = (torch.randn(shard_numel) * 1e-3).bfloat16()
    m, v = torch.zeros(shard_numel), torch.zeros(shard_numel)
    o16 = torch.empty(shard_numel, dtype=torch.bfloat16)
    state = {"step": 0}

    def zero_adam():
        state["step"] += 1
        C.cpu_adam_step(p, g16, m, v, ADAMW["lr"], *ADAMW["betas"], ADAMW["eps"],
                        ADAMW["weight_decay"], True, True, state["step"], 1.0, o16, "auto",
                        a["threads"])
    seconds["zero._C.cpu_adam_step, Ψ/N, bf16 grads + bf16 copy"] = median_time(zero_adam, steps)
    seconds["torch AdamW(foreach=False), one flat Ψ/N fp32 tensor (op by op)"] = median_time(
        torch_adamw([_flat_param(shard_numel)], foreach=False).step, max(3, steps // 2), warm=1)
    src = torch.randn(shard_numel).bfloat16()
    dst = torch.empty_like(src)
    seconds["memcpy Ψ/N bf16 (one staging copy)"] = median_time(lambda: dst.copy_(src), steps)
    out["rss_peak_bytes"] = rss_peak()
    return out


def _flat_param(numel):
    flat = torch.zeros(numel, requires_grad=True)
    flat.grad = torch.randn(numel) * 1e-3
    return flat


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
    return {"config": PROBE, "seconds": {name: collective_median(fn) for name, fn in ops.items()}}


# ---- parent side ---------------------------------------------------------------------------
def _launch(name, args, nvme_root, shard_numel, tag):
    """One run of a configuration in fresh processes (tests/distributed_harness.py: forkserver
    with torch preloaded); an NVMe configuration gets its own swap directory, removed after."""
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
            if any(block.get("device") == "nvme" for block in CONFIGS[name][1].values()):
                nvme_path = os.path.join(nvme_root, f"{name}-{tag}")
                os.makedirs(nvme_path, exist_ok=True)
            ranks = run_distributed(_run_config, args.world_size, args=(name, a, nvme_path),
                                    timeout=args.timeout)
    except Exception:  # noqa: BLE001 -- keep going; the table shows the failure
        return outcome(name, t0, error=traceback.format_exc())
    finally:
        if nvme_path:
            left = os.listdir(nvme_path)
            shutil.rmtree(nvme_path, ignore_errors=True)
    result = outcome(name, t0, ranks)
    if nvme_path:
        result["swap_files_left_after_exit"] = left
    return result


def nvme_facts(nvme_root):
    facts = {"path": nvme_root,
             "findmnt": machine.sh(f"findmnt -T {shlex.quote(nvme_root)} -o TARGET,SOURCE,FSTYPE"),
             "fstype": machine.filesystem_type(nvme_root),
             "source": machine.sh(f"findmnt -n -T {shlex.quote(nvme_root)} -o SOURCE")}
    dev = os.path.basename(facts["source"])
    facts["rotational"] = machine.sh(f"cat /sys/block/{dev}/queue/rotational 2>/dev/null")
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


def offload_facts():
    return {**machine.host_facts(),
            "cpu_model": machine.sh("lscpu | sed -n 's/^Model name: *//p'"),
            "zero_root": ZERO_ROOT, "zero_commit": machine.git_commit(ZERO_ROOT, short=True),
            "zero_root_packages": sorted(
                d for d in os.listdir(ZERO_ROOT)
                if os.path.exists(os.path.join(ZERO_ROOT, d, "__init__.py"))),
            "zero_is_git_tree": machine.sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse "
                                           "--show-toplevel 2>/dev/null") == ZERO_ROOT,
            "zero_tree_dirty": machine.tree_dirty(ZERO_ROOT),
            "zero_extension_sha256": machine.extension_sha256(ZERO_ROOT),
            **machine.checkout_facts(ROOT, short=True),
            "loadavg_end": machine.loadavg(), "date": machine.utc_now()}


def _run_rounds(args, configs, nvme_root, shard_numel):
    """args.rounds rounds of every configuration in fresh processes, the order rotated each
    round. Returns every run and, per configuration, its summary over the rounds."""
    raw, by_config = [], {name: [] for name in configs}
    for rnd in range(args.rounds):
        for name in rotated(configs, rnd):
            result = _launch(name, args, nvme_root, shard_numel, f"r{rnd}")
            result["round"] = rnd
            raw.append(result)
            by_config[name].append(result)
            _print_run(f"{rnd}:{name}", result)
    return raw, [summarize(name, by_config[name]) for name in configs]


def _print_run(tag, result):
    if "error" in result:
        print(f"[{tag}] FAILED after {result['wall_s']:.1f}s:\n{result['error']}", flush=True)
        return
    one = summarize(result["config"], [result])
    if result["config"] in (ANCHOR, PROBE):
        print(f"[{tag}] " + ", ".join(f"{k}: {v:.1f} ms" for k, v in one["ms"].items()),
              flush=True)
        return
    m = one["by_location"][0]["measured"]
    print(f"[{tag}] {one['ms']['total']:.0f} ms (fwd {one['ms']['forward']:.0f}, bwd "
          f"{one['ms']['backward']:.0f}, step {one['ms']['step']:.0f})  device/host/nvme "
          f"{mib(m['device'], 1)}/{mib(m['host'], 1)}/{mib(m['nvme'], 1)} MiB  RSS peak "
          f"{pair(one['rss_peak_bytes'], lambda x: mib(x, 1))}  ({result['wall_s']:.1f}s)",
          flush=True)


def render_only(args):
    """The report of an earlier run, rebuilt from its JSON (nothing is measured)."""
    with open(args.render_only) as f:
        data = json.load(f)
    for k, v in data["args"].items():
        if k not in ("render_only", "out"):
            setattr(args, k, v)
    if data["machine"].get("loadavg_samples"):
        data["machine"]["loadavg_samples_text"] = load_text(
            data["machine"]["loadavg_samples"], data["machine"]["nproc"])
    md = render_markdown(data["summary"], data["machine"], args, data["command"],
                         data["wall_s"], rendered_from=args.render_only)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "offload.md"), "w") as f:
            f.write(md)
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.render_only:
        return render_only(args)
    configs = chosen_configs(args.configs, ALL)
    command = command_line()
    checkout_at_start = machine.checkout_facts(ROOT, short=True)["checkout_commit"]
    nvme_root = tempfile.mkdtemp(prefix="zero_bench_offload_", dir=args.nvme_dir)
    nf = nvme_facts(nvme_root)
    if nf["fstype"] in machine.MEMORY_FILESYSTEMS:
        sys.exit(f"--nvme-dir {args.nvme_dir} is on {nf['fstype']}; pick a directory on a disk")
    args.nvme_fs = f"{nf['fstype']} on {nf['source']}"
    # a rank's shard of the flat parameter space, for the anchor (TinyGPT's padded Ψ / N)
    shard_numel = -(-count_params(seeded_model(gpt_config(args))) // args.world_size)
    t0 = time.perf_counter()
    loadavg_start = machine.loadavg()
    sampler = machine.LoadSampler()
    sampler.start()
    try:
        raw, summaries = _run_rounds(args, configs, nvme_root, shard_numel)
    finally:
        sampler.stop()
        shutil.rmtree(nvme_root, ignore_errors=True)
    wall = time.perf_counter() - t0
    facts = {**offload_facts(), "loadavg_start": loadavg_start,
             "checkout_commit_at_start": checkout_at_start,
             "modules_imported": sorted({m for res in raw for r in res.get("ranks", [])
                                         for m in (r.get("zero_module"), r.get("offload_module"))
                                         if m}),
             "nvme": nf, "loadavg_samples": sampler.samples}
    if sampler.samples:
        facts["loadavg_samples_text"] = load_text(sampler.samples, facts["nproc"])
    md = render_markdown(summaries, facts, args, command, wall)
    publish(args.out, "offload", md, {"command": command, "args": vars(args), "machine": facts,
                                      "wall_s": wall, "summary": summaries, "raw": raw})
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
