"""Beyond the memory wall: a GPT whose model states do not fit in this machine's memory, trained
with ZeRO stage 3 and both parameters and optimizer state on NVMe (ZeRO-Infinity).

    python benchmarks/bench_beyond_memory.py --nvme-path /tmp/zero_nvme     # ~2B parameters
    python benchmarks/bench_beyond_memory.py --n-layer 2 --n-embd 256 --steps 2 \
        --nvme-path /tmp/zero_nvme --out /tmp/bench                         # smoke test

--ranks 1 (the default; results in beyond_memory.md/.json) or more (beyond_memory_<N>ranks),
each rank a fresh process with the machine's cores split between them; bf16 parameters, fp32
master weights and Adam state. The model is built under zero.Init with offload_param nvme, so
each parameter's shard is born on the disk (zero/init_spill.py), the engine writes
the parameter shards and the optimizer state into its swap files, and every step streams the
units in for forward and backward and the optimizer state through the CPU Adam chunk by chunk.
The same micro-batch every step, so a few steps show the loss fall.

Measured in the same run: the disk's own sequential bandwidth (O_DIRECT, a file of
--probe-bytes), then per step the bytes the process read from and wrote to storage
(/proc/self/io), the phases, and the offloaded step's split (OffloadTimings). The I/O floor of a
step is its bytes over the measured bandwidths: no step that moves those bytes can be faster.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.launch import spawn_ranks  # noqa: E402
from benchmarks.memory import rss_peak  # noqa: E402
from benchmarks.models import ADAMW, gpt_config, rank_batches  # noqa: E402
from benchmarks.report import header, machine_section, markdown_table, publish  # noqa: E402
from benchmarks.timing import engine_step  # noqa: E402

CHUNK = 64 << 20
TUNE_BUDGETS = ("7GiB", "10GiB", "20GiB")  # of this machine's RAM for all ranks


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nvme-path", required=True, help="folder for the swap files (a local disk)")
    p.add_argument("--ranks", type=int, default=1, help="data-parallel ranks (processes)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=32)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=2304)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--probe-bytes", type=int, default=4 << 30, help="disk bandwidth probe size")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="where beyond_memory[_<N>ranks].md/.json go ('' = print only)")
    args = p.parse_args(argv)
    args.world_size = args.ranks  # what benchmarks/launch.spawn_ranks reads
    args.threads = max(1, (os.cpu_count() or 1) // args.ranks)
    return args


def disk_bandwidth(folder: str, size: int) -> dict:
    """Sequential O_DIRECT write then read of `size` bytes in 64 MiB requests, bytes/s."""
    path = os.path.join(folder, "bandwidth_probe.bin")
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(1 << 20) * (CHUNK >> 20))
    out = {}
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
        start = time.perf_counter()
        for _ in range(size // CHUNK):
            os.write(fd, buffer)
        os.fsync(fd)
        out["write_bytes_per_s"] = size / (time.perf_counter() - start)
        os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        start = time.perf_counter()
        while os.readv(fd, [buffer]) > 0:
            pass
        out["read_bytes_per_s"] = size / (time.perf_counter() - start)
        os.close(fd)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return out


def storage_io() -> dict[str, int]:
    """Bytes this process has read from and written to storage (not the page cache)."""
    with open("/proc/self/io") as io:
        fields = dict(line.split(": ") for line in io.read().splitlines())
    return {"read": int(fields["read_bytes"]), "write": int(fields["write_bytes"])}


def engine_config(args) -> dict:
    nvme = {"device": "nvme", "nvme_path": args.nvme_path}
    return {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {**ADAMW, "lr": args.lr}},
            "zero_optimization": {"stage": 3, "offload_param": dict(nvme),
                                  "offload_optimizer": dict(nvme)}}


def estimator_inputs(args, world: int):
    """(shapes, setup, stage) of this run's model and config for the estimator and the tuner,
    before anything is built (the model on the meta device)."""
    from zero.models.tiny_gpt import TinyGPT
    from zero.reports import estimate as est

    shapes = est.shapes_from_module(est.build_on_meta(TinyGPT, gpt_config(vars(args))))
    setup, stage = est.setup_from_config(engine_config(args), world, cpu_only=True)
    return shapes, setup, stage


def predicted_bytes(args, world: int) -> dict[str, int]:
    """zero-mem estimate's per-rank bytes at each location for this run."""
    from zero.reports import estimate as est

    estimate = est.estimate(*estimator_inputs(args, world))
    return {where: estimate.bytes_at(where) for where in ("device", "host", "nvme")}


def tuner_choices(args, budgets=TUNE_BUDGETS) -> list[dict]:
    """What `zero-mem tune --cpu-only` recommends for this model and rank count at each
    machine budget (split evenly over the ranks: a rank's device and host RAM together), and
    whether it is this run's config."""
    from zero.reports import estimate as est
    from zero.reports.tuner import tune

    shapes, setup, _ = estimator_inputs(args, args.ranks)
    out = []
    for budget in budgets:
        chosen = tune(shapes, setup, est.parse_bytes(budget) // args.ranks,
                      nvme_path=args.nvme_path).chosen
        option = chosen.option if chosen else None
        out.append({"budget": budget, "recommended": chosen.describe() if chosen else None,
                    "is_this_run": bool(option and option.stage == 3
                                        and option.offload_optimizer == "nvme"
                                        and option.offload_param == "nvme")})
    return out


def measured_bytes(by_location: dict) -> dict[str, int]:
    """The registry's peak per location, host pinned and pageable together."""
    out = {"device": 0, "host": 0, "nvme": 0}
    for location, usage in by_location.items():
        out["host" if location.startswith("host") else location] += usage["peak"]
    return out


def run_rank(rank: int, world: int, _name: str, args) -> dict:
    """One rank: zero.Init (shards born on NVMe), the engine (swap files written), the steps."""
    import offload
    import zero
    from zero.init import full_numel
    from zero.models.tiny_gpt import TinyGPT

    zero.init_distributed()
    config = engine_config(args)
    gpt = gpt_config(vars(args))
    predicted = predicted_bytes(args, world)
    start = time.perf_counter()
    with zero.Init(config_dict_or_path=config):
        model = TinyGPT(gpt)
    params = sum(full_numel(p) for p in model.parameters())
    init_rss = rss_peak()
    engine, *_ = zero.initialize(model=model, config=config)
    build_s = time.perf_counter() - start
    tokens, targets = rank_batches(gpt, args.micro_batch, world, 0)[rank]
    steps = []
    for _ in range(args.steps):
        before_io, before_offload = storage_io(), offload.step_timings(engine.core)
        t0 = time.perf_counter()
        loss, phases = engine_step(engine, tokens, targets)
        elapsed = time.perf_counter() - t0
        after_io, after_offload = storage_io(), offload.step_timings(engine.core)
        steps.append({"loss": loss, "s": elapsed, **{f"{k}_s": v for k, v in phases.items()},
                      "read_bytes": after_io["read"] - before_io["read"],
                      "write_bytes": after_io["write"] - before_io["write"],
                      **{k: after_offload[k] - before_offload[k]
                         for k in ("grads_in_wait_s", "cpu_optimizer_s", "params_out_wait_s")}})
        print(f"[rank {rank} step] {steps[-1]}", flush=True)
    report = engine.memory_report()
    engine.destroy()
    return {"params": params, "build_s": build_s, "steps": steps, "peak_rss_bytes": rss_peak(),
            "init_peak_rss_bytes": init_rss, "model_state_bytes": 16 * params,
            "predicted_bytes": predicted, "measured_bytes": measured_bytes(report["by_location"])}


def train(args) -> dict:
    """Every rank's run, in fresh processes, combined: per step the slowest rank's times, the
    mean loss and the bytes all ranks moved; the largest rank's peak RSS."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_beyond_memory_") as tmp:
        result = spawn_ranks(run_rank, "beyond_memory", args, tmp)
    if "error" in result:
        raise RuntimeError(f"the run failed: {result['error']}")
    ranks = result["ranks"]
    steps = []
    for per_rank in zip(*(r["steps"] for r in ranks)):
        step = {k: max(s[k] for s in per_rank) for k in per_rank[0]}
        step["loss"] = statistics.fmean(s["loss"] for s in per_rank)
        for key in ("read_bytes", "write_bytes"):
            step[key] = sum(s[key] for s in per_rank)
        steps.append(step)
    left = [name for name in os.listdir(args.nvme_path) if name.startswith("zero")]
    return {"params": ranks[0]["params"], "build_s": max(r["build_s"] for r in ranks),
            "steps": steps, "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
            "init_peak_rss_bytes": max(r["init_peak_rss_bytes"] for r in ranks),
            "model_state_bytes": ranks[0]["model_state_bytes"],
            "predicted_bytes": ranks[0]["predicted_bytes"],
            "measured_bytes": {where: max(r["measured_bytes"][where] for r in ranks)
                               for where in ("device", "host", "nvme")},
            "swap_files_left": left, "ranks": ranks}


def summarize(run: dict, bandwidth: dict) -> dict:
    measured = run["steps"][1:] or run["steps"]  # the first step also fills the read-ahead
    read = statistics.median(s["read_bytes"] for s in measured)
    write = statistics.median(s["write_bytes"] for s in measured)
    floor = read / bandwidth["read_bytes_per_s"] + write / bandwidth["write_bytes_per_s"]
    step_s = statistics.median(s["s"] for s in measured)
    return {"params": run["params"], "model_state_bytes": run["model_state_bytes"],
            "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "peak_rss_bytes": run["peak_rss_bytes"], "ranks": len(run["ranks"]),
            "init_peak_rss_bytes": run["init_peak_rss_bytes"], "step_s": step_s, "io_floor_s": floor,
            "step_over_floor": step_s / floor if floor else None,
            "read_bytes_per_step": read, "write_bytes_per_step": write,
            "losses": [s["loss"] for s in run["steps"]], "build_s": run["build_s"],
            "disk": bandwidth, "swap_files_left": run["swap_files_left"],
            "predicted_bytes": run["predicted_bytes"], "measured_bytes": run["measured_bytes"],
            "tuner": run["tuner"]}


def render(summary: dict, run: dict, args, facts: dict, command: str, wall: float) -> str:
    gib = 1 << 30
    rows = [[i + 1, f"{s['loss']:.4f}", f"{s['s']:.1f}", f"{s['forward_s']:.1f}",
             f"{s['backward_s']:.1f}", f"{s['step_s']:.1f}", f"{s['cpu_optimizer_s']:.1f}",
             f"{(s['grads_in_wait_s'] + s['params_out_wait_s']):.1f}",
             f"{s['read_bytes'] / gib:.2f}", f"{s['write_bytes'] / gib:.2f}"]
            for i, s in enumerate(run["steps"])]
    lines = header("Beyond the memory wall: ZeRO-3 with parameters and optimizer on NVMe",
                   "bench_beyond_memory.py", facts["date"], wall, command)
    lines += [
        f"GPT with {summary['params'] / 1e9:.2f} B parameters ({args.n_layer} layers, width "
        f"{args.n_embd}, vocab {args.vocab}), bf16, micro-batch {args.micro_batch} x {args.block} "
        f"tokens, {args.ranks} rank(s) ({args.threads} torch thread(s) each; per step: the "
        f"slowest rank's times, the mean loss, all ranks' bytes). Model states (16 bytes per parameter): "
        f"{summary['model_state_bytes'] / gib:.1f} GiB; this machine's memory: "
        f"{summary['mem_total_bytes'] / gib:.1f} GiB.", "",
        markdown_table(["what", "value"], [
            ["peak RSS", f"{summary['peak_rss_bytes'] / gib:.2f} GiB "
                         f"({summary['peak_rss_bytes'] / summary['model_state_bytes']:.2f} of the model states)"],
            ["peak RSS after zero.Init (shards born on NVMe)",
             f"{summary['init_peak_rss_bytes'] / gib:.2f} GiB"],
            ["build (zero.Init + engine, swap files written)", f"{summary['build_s']:.0f} s"],
            ["step (median after the first)", f"{summary['step_s']:.1f} s"],
            ["disk, measured (O_DIRECT, sequential)",
             f"write {summary['disk']['write_bytes_per_s'] / gib:.2f} GiB/s, read "
             f"{summary['disk']['read_bytes_per_s'] / gib:.2f} GiB/s"],
            ["I/O floor of a step (its bytes / those bandwidths)", f"{summary['io_floor_s']:.1f} s"],
            ["step / I/O floor", f"{summary['step_over_floor']:.2f}"],
            ["swap files left after the run", str(len(summary["swap_files_left"]))]]), "",
        "Estimated before the run (`zero-mem estimate`'s row for this config) against the "
        "engine's accounting registry (peak per location):", "",
        markdown_table(["location", "estimated GiB", "measured GiB", "estimate / measured"],
                       [[where, f"{summary['predicted_bytes'][where] / gib:.3f}",
                         f"{summary['measured_bytes'][where] / gib:.3f}",
                         f"{summary['predicted_bytes'][where] / summary['measured_bytes'][where]:.3f}"
                         if summary["measured_bytes"][where] else "-"]
                        for where in ("device", "host", "nvme")]), "",
        "`zero-mem tune --cpu-only --budget <budget / ranks>` for this model and rank count "
        "(the budget is the machine's RAM for all ranks; a rank's share holds its device and "
        "host bytes together):", "",
        markdown_table(["machine budget", "recommended", "this run's configuration"],
                       [[c["budget"], c["recommended"] or "nothing fits",
                         "yes" if c["is_this_run"] else "no"] for c in summary["tuner"]]), "",
        markdown_table(["step", "loss", "s", "forward", "backward", "optimizer step", "CPU Adam",
                        "waiting for I/O in the step", "read GiB", "written GiB"], rows), "",
        f"Engine under test: `{ZERO_ROOT}` at commit {facts['zero_commit']}."]
    return "\n".join(lines + machine_section(facts))


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.nvme_path, exist_ok=True)
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    bandwidth = disk_bandwidth(args.nvme_path, args.probe_bytes)
    print(f"[disk] {bandwidth}", flush=True)
    choices = tuner_choices(args)
    print(f"[tuner] {choices}", flush=True)
    run = train(args)
    run["tuner"] = choices
    wall = time.perf_counter() - t0
    summary = summarize(run, bandwidth)
    facts = {**machine.host_facts(), "date": machine.utc_now(),
             "zero_commit": machine.git_commit(ZERO_ROOT)}
    name = "beyond_memory" if args.ranks == 1 else f"beyond_memory_{args.ranks}ranks"
    publish(args.out, name, render(summary, run, args, facts, command, wall),
            {**summary, "command": command, "args": vars(args), "machine": facts,
             "wall_s": wall, "raw": run})
    return 0


if __name__ == "__main__":
    sys.exit(main())
