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
import contextlib
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.cli import (add_comparison_args, add_model_args, add_run_args,  # noqa: E402
                            settle)
from benchmarks.ddp_report import render_markdown, summarize, summarize_interleaved  # noqa: E402
from benchmarks.launch import spawn_interleaved, spawn_ranks  # noqa: E402
from benchmarks.memory import (MIB, optimizer_state_tensors, rss_now, rss_peak,  # noqa: E402
                               unique_storage_bytes)
from benchmarks.models import (count_params, engine_config, gpt_config,  # noqa: E402
                               rank_batches, seeded_model, torch_adamw)
from benchmarks.report import mib, pair, publish  # noqa: E402
from benchmarks.timing import (PhaseClock, collective_median, engine_step,  # noqa: E402
                               interleave_steps, measure_steps, rotated)

ALL_CONFIGS = ["ddp-fp32", "zero0-fp32", "zero1-fp32", "zero2-fp32",
               "ddp-bf16", "zero0-bf16", "zero1-bf16", "zero2-bf16"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, steps=20, steps_help="measured steps per configuration", warmup=5,
                 interleaved_steps=30)
    p.add_argument("--repeats", type=int, default=2,
                   help="run every configuration this many times (fresh processes each, order "
                        "rotated per round) and pool the measured steps")
    add_model_args(p, micro_batch=4, vocab=4096, n_layer=4, n_embd=256)
    p.add_argument("--bucket-numel", type=int, default=500_000,
                   help="zero reduce_bucket_size (elements); DDP bucket_cap_mb is the same "
                        "number of fp32 elements, so both cut the model into the same buckets")
    add_comparison_args(p, ALL_CONFIGS)
    p.add_argument("--no-probe", action="store_true", help="skip the gloo collective probe")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="directory for ddp_vs_zero.md / .json ('' to write nothing)")
    return p.parse_args(argv)


# ---- worker side ---------------------------------------------------------------------------
def _run_config(rank, world, name, args):
    import zero  # noqa: F401 -- every worker loads the same libraries, DDP ones included

    dist.init_process_group("gloo", rank=rank, world_size=world)
    rss_start, rss_peak_start = rss_now(), rss_peak()
    if name in ("probe", "interleaved"):
        out = _probe(args) if name == "probe" else _interleaved(rank, args)
        dist.destroy_process_group()
        return out
    gpt = gpt_config(args)
    model = seeded_model(gpt)
    batches = rank_batches(gpt, args.micro_batch, args.warmup + args.steps, rank)
    out = {"config": name, "rank": rank, "numel": count_params(model),
           "threads": torch.get_num_threads(), "zero_module": os.path.dirname(zero.__file__)}
    runner = _runner(name, model, args, out)

    def at_warmup_end():
        out["comm_at_warmup_end"] = runner["comm"]()
    out["losses"], out["step_times"] = measure_steps(runner["step"], batches, args.warmup,
                                                     at_warmup_end)
    runner["finish"]()
    out["rss_start_bytes"] = rss_start
    out["rss_peak_at_start_bytes"] = rss_peak_start
    out["rss_end_bytes"] = rss_now()
    out["rss_peak_bytes"] = rss_peak()
    dist.destroy_process_group()
    return out


def _runner(name, model, args, out):
    """The configuration's step(tokens, targets) -> (loss, phases), finish() (final numbers
    into out) and comm() (zero's byte counters; None for DDP)."""
    kind, precision = name.split("-")
    if kind == "ddp":
        return _ddp(model, precision, args, out)
    return _zero(model, int(kind[-1]), precision, args, out)


def _interleaved(rank, args):
    """Every configuration in this one pair of processes, stepping round-robin (config A step
    i, config B step i, ...): host noise on a shared VM then hits all configurations alike,
    so their ratios are far steadier than runs made one after another. No memory numbers
    come from here (the process holds all models at once)."""
    gpt = gpt_config(args)
    steps = args.warmup + args.interleaved_steps
    batches = rank_batches(gpt, args.micro_batch, steps, rank)
    runners = {name: _runner(name, seeded_model(gpt), args, {})["step"]
               for name in args.config_list}
    return {"rank": rank, "step_times": interleave_steps(runners, batches, args.warmup)}


def _zero(model, stage, precision, args, out):
    import zero
    from zero.boundary import as_dict

    cfg = engine_config(args.micro_batch, args.clip,
                        {"stage": stage, "reduce_bucket_size": args.bucket_numel,
                         "overlap_comm": True}, bf16=precision == "bf16")
    out["engine_config"] = cfg
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    out["comm_at_init"] = as_dict(engine.core.comm_stats())

    def finish():
        report = engine.memory_report()
        out["report"] = report
        out["comm_at_end"] = dict(report["comm"])
        out["grad_norm_last"] = engine.get_global_grad_norm().item()
    return {"step": lambda tokens, targets: engine_step(engine, tokens, targets),
            "finish": finish, "comm": lambda: as_dict(engine.core.comm_stats())}


def _ddp(model, precision, args, out):
    from torch.nn.parallel import DistributedDataParallel as DDP

    bucket_mb = args.bucket_numel * 4 / MIB
    ddp = DDP(model, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    opt = torch_adamw(ddp.parameters())
    out["ddp_settings"] = {"bucket_cap_mb": bucket_mb, "gradient_as_bucket_view": True,
                           "autocast": "cpu/bfloat16" if precision == "bf16" else None,
                           "optimizer": "torch.optim.AdamW (defaults: foreach=None, fused=None)"}
    params = [q for q in ddp.parameters() if q.requires_grad]
    state = {"model_state_bytes": 0}

    def measure_states():  # where params, grads and Adam state all exist (the steady-state peak)
        grads, adam = [q.grad for q in params], optimizer_state_tensors(opt)
        state["model_state_bytes"] = max(state["model_state_bytes"],
                                         unique_storage_bytes(params + grads + adam))
        state["param_bytes"] = unique_storage_bytes(params)
        state["grad_bytes"] = unique_storage_bytes(grads)
        state["optimizer_state_bytes"] = unique_storage_bytes(adam)

    def step(tokens, targets):
        clock = PhaseClock()
        with (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
              else contextlib.nullcontext()):
            loss = ddp(tokens, targets)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        measure_states()
        opt.zero_grad(set_to_none=False)
        clock.lap("step")
        return float(loss.detach()), clock.laps

    return {"step": step, "finish": lambda: out.update(state), "comm": lambda: None}


def _probe(args):
    """Times gloo's primitives on a Ψ-sized buffer: what the engines' collectives cost here."""
    world = dist.get_world_size()
    numel = count_params(seeded_model(gpt_config(args)))
    numel -= numel % world
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
            out["timings_ms"][f"{op} {str(dtype).split('.')[-1]}"] = collective_median(fn) * 1e3
    return out


# ---- parent side ---------------------------------------------------------------------------
def ddp_facts(loadavg_start: str) -> dict:
    return {**machine.host_facts("lscpu | head"), "zero_root": ZERO_ROOT,
            "zero_commit": machine.git_commit(ZERO_ROOT), "loadavg_end": machine.loadavg(),
            "zero_tree_dirty": machine.tree_dirty(ZERO_ROOT), "date": machine.utc_now(),
            "loadavg_start": loadavg_start}


def _isolated_runs(args, tmp):
    """Every configuration alone in fresh processes, args.repeats rounds, the order rotated
    per round so slow drift on a shared host spreads evenly."""
    results, by_config = [], {name: [] for name in args.config_list}
    for rep in range(args.repeats):
        for name in rotated(args.config_list, rep):
            result = spawn_ranks(_run_config, name, args, tmp)
            result["repeat"] = rep
            results.append(result)
            by_config[name].append(result)
            _print_run(f"{rep}:{name}", result, args)
    return results, [summarize(by_config[name], args) for name in args.config_list]


def _print_run(tag, result, args):
    if "error" in result:
        print(f"[{tag}] FAILED after {result['wall_s']:.1f}s:\n{result['error']}", flush=True)
        return
    one = summarize([result], args)
    print(f"[{tag}] step {one['step_ms_median']:.1f} ms  model state "
          f"{pair(one['model_state_bytes'], merge_equal=False)} MiB (formula "
          f"{mib(one['model_state_expected_bytes'])})  RSS peak "
          f"{pair(one['rss_peak_bytes'], merge_equal=False)} MiB  sent/step "
          f"{mib(one['comm_bytes_per_step'])} MiB  loss {one['loss_last']:.4f}  "
          f"({result['wall_s']:.1f}s)", flush=True)


def main(argv=None):
    args = settle(parse_args(argv), ALL_CONFIGS)
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    loadavg_start = machine.loadavg()
    with tempfile.TemporaryDirectory(prefix="bench_ddp_") as tmp:
        probe = None
        if not args.no_probe:
            probe = spawn_ranks(_run_config, "probe", args, tmp)
            print(f"[probe] {json.dumps(probe.get('ranks', [{}])[0].get('timings_ms', probe))}",
                  flush=True)
        interleaved = spawn_interleaved(_run_config, args, tmp, summarize_interleaved)
        results, summaries = _isolated_runs(args, tmp)
    wall = time.perf_counter() - t0
    facts = ddp_facts(loadavg_start)
    md = render_markdown(summaries, probe, interleaved, facts, args, command, wall)
    publish(args.out, "ddp_vs_zero", md, {
        "command": command, "args": vars(args), "machine": facts, "wall_s": wall,
        "summary": summaries, "probe": probe, "interleaved": interleaved, "raw": results})
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
