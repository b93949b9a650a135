"""zero (ZeRO stage 3) against PyTorch FSDP2 (`fully_shard`), side by side, in one invocation.

    python benchmarks/bench_fsdp2.py                   # the full run (a few minutes on 2 cores)
    python benchmarks/bench_fsdp2.py --steps 3 --warmup 1 --interleaved-steps 3 \
        --configs zero3-fp32,fsdp2-fp32 --out /tmp/bench   # smoke test

World size 2 on gloo (CPU). Both sides train the same TinyGPT (same seed, same data, same
micro-batch per rank) with AdamW and gradient clipping. FSDP2 is applied the usual way:
`fully_shard` on every transformer block, then on the root (embeddings, the tied head and
the final norm form the root's parameter group) -- the same units zero's stage 3 gathers
(every ModuleList child is one unit, the rest is the root unit).

zero runs three times per precision:

* `zero3`: the engine's stage-3 defaults (DeepSpeed's): stage3_prefetch_bucket_size 5e7
  elements (larger than this model), stage3_max_reuse_distance 1e9 (a unit whose next use in
  the recorded order comes within that many elements of other units stays gathered, so every
  unit stays gathered from its forward to its backward), stage3_max_live_parameters 1e9,
  stage3_max_inflight_gathers 2.
* `zero3-noreuse`: the same with stage3_max_reuse_distance 0 (every unit is released after its
  forward and all-gathered again for its backward: the ZeRO paper's 3Ψ schedule).
* `zero3pf`: reuse distance 0 and the prefetch bounded to one transformer block's parameter
  count (--prefetch-numel): the memory-lean setting.

Two kinds of run:

* isolated: each configuration alone in a fresh pair of processes (torch.multiprocessing
  spawn), so a process's peak RSS belongs to that configuration. Memory, bytes sent, the
  loss trajectory and the isolated step times come from these. After the measured steps one
  more step runs under torch.profiler(profile_memory=True) to measure the transient peak.
* interleaved: one pair of processes holds every configuration and steps them round-robin,
  so load from other processes on a shared host hits all of them alike. The step-time
  comparison comes from here (no memory numbers: the processes hold every model at once).

What is measured (also written into the report):

* step time: forward + backward + optimizer step (FSDP2: + clip_grad_norm_ + zero_grad) of
  one training step; per step the slower rank, median (and p10) over the measured steps.
* model states per rank. zero: its accounting registry (param + gradient + fp32_master +
  optimizer_state), beside the engine's own formula (16Ψ/N for the partitioned parameters
  plus stage-1 terms for the persistent small ones). FSDP2: the distinct storages behind the
  local shards of the DTensor parameters, their gradients and the AdamW state (exp_avg,
  exp_avg_sq, step), measured right after optimizer.step() (before zero_grad), beside 16Ψ/N.
* working set. zero: the registry's `gathered_param` peak (units gathered at once) and its
  reduce-scatter buckets (allocated up front and kept). FSDP2: the peak bytes of unsharded
  parameters alive at once (sum of the allocated storages of every FSDPParam's all-gather
  outputs, sampled after every unshard, before every post-backward and at every
  reduce-scatter), and its largest transient communication buffers (the flat all-gather
  output; the reduce-scatter input + output).
* step peak (both, same method): the bytes the engine/optimizer own at the start of the
  profiled step (zero: registry total; FSDP2: the local shards of params + grads + AdamW
  state) plus the peak of live bytes allocated *during* that step, from torch.profiler's
  CPU allocation events (activations, gathered parameters, gradients, buffers,
  temporaries), on every thread the profiler records (the training thread and others -- with
  gloo, presumably its worker threads -- so collective temporaries count when they overlap
  the peak). The
  running total only drops for frees the profiler records: a buffer whose free it misses keeps
  the total high for the rest of the process. The report shows each profiled step's "live at
  the end" (allocated during the step, not seen freed) so that drift is visible; it was 0 when
  nothing was missed.
* RSS: ru_maxrss per rank (torch runtime + everything above + allocator caching), taken
  before the profiled step. "RSS start" is after import + process-group init.
* bytes sent per step, paper convention (all-gather / reduce-scatter of a B-byte full buffer
  = B, all-reduce of B bytes = 2B). zero: its own counters (engine.memory_report()["comm"])
  differenced over the measured steps. FSDP2: the same convention, counted by wrapping the
  all-gather / reduce-scatter calls of its process-group collectives; the scalar all-reduce(s)
  of clip_grad_norm_ over DTensors go through functional collectives and are not counted.
  Both are compared with the ZeRO paper's 3Ψ·b. gloo has no native reduce-scatter (it is
  emulated, costing like an all-reduce), so wall-clock communication cost on gloo says
  little about a real interconnect: count bytes instead.

Precision: fp32 = fp32 everything on both sides. bf16: zero = DeepSpeed bf16 (bf16 params
and grads, fp32 master + Adam state); FSDP2 = MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=bf16) (fp32 sharded params, grads and AdamW state; bf16 all-gather, compute and
reduce-scatter). If FSDP2's mixed precision fails on CPU/gloo the report says so.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.cli import (add_comparison_args, add_model_args, add_run_args,  # noqa: E402
                            chosen_configs, threads_per_rank)
from benchmarks.fsdp2_probes import FsdpTracker, profiled_step  # noqa: E402
from benchmarks.fsdp2_report import render_markdown  # noqa: E402
from benchmarks.fsdp2_summary import (ALL_CONFIGS, NO_REUSE_KINDS, ZERO_KINDS,  # noqa: E402
                                      split_name, summarize, summarize_interleaved)
from benchmarks.launch import spawn_interleaved, spawn_ranks  # noqa: E402
from benchmarks.memory import (logical_bytes, optimizer_state_tensors, rss_now,  # noqa: E402
                               rss_peak, unique_storage_bytes)
from benchmarks.models import (engine_config, gpt_config, rank_batches,  # noqa: E402
                               seeded_model, torch_adamw)
from benchmarks.report import mib, pair, publish  # noqa: E402
from benchmarks.timing import PhaseClock, interleave_steps, measure_steps  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, steps=10, steps_help="measured steps per isolated run", warmup=3,
                 interleaved_steps=10)
    add_model_args(p, micro_batch=4, vocab=8192, n_layer=6, n_embd=384)
    p.add_argument("--persistence-threshold", type=int, default=1000,
                   help="zero stage3_param_persistence_threshold (elements)")
    p.add_argument("--prefetch-numel", type=int, default=0,
                   help="stage3_prefetch_bucket_size of the zero3pf configurations (elements; "
                        "0: one transformer block's parameter count). The zero3 and "
                        "zero3-noreuse configurations keep the engine default")
    p.add_argument("--bucket-numel", type=int, default=50_000_000,
                   help="zero reduce_bucket_size (at stage 3 a unit is the grain of reduction)")
    add_comparison_args(p, ALL_CONFIGS)
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profiled step (no step-peak numbers)")
    p.add_argument("--render-only", default="", metavar="JSON",
                   help="measure nothing: rebuild the report from the raw data of an earlier "
                        "run's fsdp2_vs_zero3.json (its command, machine facts and args) with "
                        "this script's current tables and findings, and write it to --out")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="directory for fsdp2_vs_zero3.md / .json ('' to write nothing)")
    return p.parse_args(argv)


# ---- worker side ---------------------------------------------------------------------------
def _param_counts(model) -> dict:
    """Ψ (distinct parameters), split into the blocks and the root unit."""
    block_ids = {id(p) for p in model.blocks.parameters()}
    params = list(model.parameters())  # distinct: the tied head appears once
    blocks = sum(p.numel() for p in params if id(p) in block_ids)
    total = sum(p.numel() for p in params)
    return {"numel": total, "blocks_numel": blocks, "root_numel": total - blocks,
            "block_numel": blocks // max(1, len(model.blocks))}


def _run_config(rank, world, name, args):
    import zero  # noqa: F401 -- every worker loads the same libraries, FSDP2's included
    from torch.distributed.fsdp import fully_shard  # noqa: F401

    dist.init_process_group("gloo", rank=rank, world_size=world)
    rss_start, rss_peak_start = rss_now(), rss_peak()
    if name == "interleaved":
        out = _interleaved(rank, args)
        dist.destroy_process_group()
        return out
    gpt = gpt_config(args)
    model = seeded_model(gpt)
    out = {"config": name, "rank": rank, **_param_counts(model),
           "threads": torch.get_num_threads(), "zero_module": os.path.dirname(zero.__file__)}
    batches = rank_batches(gpt, args.micro_batch, args.warmup + args.steps + 1, rank)
    runner = _runner(name, model, args, out)
    grad_norms = []

    def at_warmup_end():
        out["comm_at_warmup_end"] = runner["comm"]()
        if "schedule" in runner:
            out["schedule_at_warmup_end"] = runner["schedule"]()
        runner["reset_peaks"]()
    out["losses"], out["step_times"] = measure_steps(
        runner["step"], batches[:args.warmup + args.steps], args.warmup, at_warmup_end,
        after_step=lambda: grad_norms.append(runner["grad_norm"]()))
    out["comm_at_end"] = runner["comm"]()
    out["grad_norms"] = grad_norms
    runner["finish"]()
    out["rss_start_bytes"] = rss_start
    out["rss_peak_at_start_bytes"] = rss_peak_start
    out["rss_end_bytes"] = rss_now()
    out["rss_peak_bytes"] = rss_peak()
    if not args.no_profile:
        out["profiled_step"] = profiled_step(runner, *batches[-1])
        out["rss_peak_after_profiled_bytes"] = rss_peak()
    dist.destroy_process_group()
    return out


def _runner(name, model, args, out, sample=True):
    """The configuration's step(tokens, targets, probe=None) -> (loss, phases), finish(),
    comm() (bytes sent so far), owned() (bytes it owns at a step boundary), grad_norm(),
    reset_peaks() and the model it trains (zero: also schedule())."""
    kind, precision = split_name(name)
    if kind in ZERO_KINDS:
        return _zero(model, kind, precision, args, out)
    return _fsdp2(model, precision, args, out, sample=sample)


def _interleaved(rank, args):
    """Every configuration in this one pair of processes, stepping round-robin (config A step
    i, config B step i, ...; the order rotates every step): host noise on a shared VM then
    hits all configurations alike. No memory numbers come from here."""
    gpt = gpt_config(args)
    steps = args.warmup + args.interleaved_steps
    batches = rank_batches(gpt, args.micro_batch, steps, rank)
    runners = {}
    for name in args.config_list:
        model = seeded_model(gpt)
        try:
            runners[name] = _runner(name, model, args, {}, sample=False)["step"]
        except Exception:  # noqa: BLE001 -- the isolated run reports the failure in full
            print(f"[interleaved] {name} could not be built, left out:\n"
                  f"{traceback.format_exc()}", flush=True)
    failed = {}
    times = interleave_steps(runners, batches, args.warmup, failed)
    return {"rank": rank, "step_times": {k: v for k, v in times.items() if k not in failed},
            "failed": failed}


def _zero_stage3(model, kind, precision, args) -> dict:
    """zero's config: stage 3 with the engine defaults (zero3), reuse distance 0 (noreuse),
    and reuse 0 with the prefetch bounded to one block (zero3pf)."""
    zero_optimization = {"stage": 3,
                         "stage3_param_persistence_threshold": args.persistence_threshold,
                         "reduce_bucket_size": args.bucket_numel}
    if kind in NO_REUSE_KINDS:
        zero_optimization["stage3_max_reuse_distance"] = 0
    if kind == "zero3pf":
        zero_optimization["stage3_prefetch_bucket_size"] = (
            args.prefetch_numel or sum(p.numel() for p in model.blocks[0].parameters()))
    return engine_config(args.micro_batch, args.clip, zero_optimization,
                         bf16=precision == "bf16")


def _zero(model, kind, precision, args, out):
    import zero
    from zero.boundary import as_dict

    cfg = _zero_stage3(model, kind, precision, args)
    out["engine_config"] = cfg
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    registry = engine.core.registry()
    zc = engine.config.zero_optimization
    out["stage3_settings"] = {k: int(getattr(zc, k)) for k in (
        "stage3_prefetch_bucket_size", "stage3_max_reuse_distance", "stage3_max_live_parameters",
        "stage3_max_inflight_gathers", "stage3_param_persistence_threshold")}
    # per step: the elements the gather schedule still has gathered when forward returns (the
    # units it keeps for their backward); read outside the timed region
    kept_after_forward = out.setdefault("gathered_after_forward_numel", [])

    def step(tokens, targets, probe=None):
        clock = PhaseClock()
        with probe.hooks() if probe else contextlib.nullcontext():
            loss = engine(tokens, targets)
        clock.lap("forward")
        if probe:
            probe.after_forward()
        kept_after_forward.append(engine.core.schedule_stats().gathered_numel)
        clock.skip()  # the bookkeeping above is in no phase
        engine.backward(loss)
        clock.lap("backward")
        engine.step()
        clock.lap("step")
        return float(loss.detach()), clock.laps

    def reset_peaks():
        """Peaks from here on are the steady state; the warm-up's (first step: the engine
        learns the unit order) are kept apart."""
        report = engine.memory_report()
        out["warmup_peaks"] = {"categories": {k: v["peak"] for k, v in
                                              report["categories"].items()},
                               "total": report["total"]["peak"]}
        registry.reset_peaks()

    def grad_norm():
        return engine.get_global_grad_norm().item()

    def schedule():
        stats = as_dict(engine.core.schedule_stats())
        return {k: v for k, v in stats.items() if k != "notice"}

    return {"step": step, "finish": lambda: _zero_finish(engine, out), "model": engine.module,
            "grad_norm": grad_norm, "comm": lambda: dict(engine.memory_report()["comm"]),
            "owned": lambda: registry.total().current,
            "reset_peaks": reset_peaks, "schedule": schedule}


def _zero_finish(engine, out):
    from zero.boundary import as_dict

    report = engine.memory_report()
    out["report"] = report
    out["grad_norm_last"] = engine.get_global_grad_norm().item()
    out["prefetch_default"] = engine.config.zero_optimization.stage3_prefetch_bucket_size
    out["gathered_param_current_end"] = int(report["categories"].get(
        "gathered_param", {}).get("current", 0))
    out["units"] = len(engine.stage3_hooks.plan.modules)
    try:
        out["schedule_stats"] = as_dict(engine.core.schedule_stats())
    except Exception as exc:  # noqa: BLE001 -- an engine without a gather schedule
        out["schedule_stats"] = {"error": repr(exc)}


FSDP2_SETTINGS = {
    "fully_shard": "each of model.blocks, then the root (reshard_after_forward default: "
                   "True for blocks, the root keeps its parameters after forward)",
    "mesh": "init_device_mesh('cpu', (world,))",
    "optimizer": "torch.optim.AdamW (defaults: foreach=None, fused=None)",
    "clip": "torch.nn.utils.clip_grad_norm_ on the DTensor parameters",
    "zero_grad": "optimizer.zero_grad() (set_to_none=True) after the step"}


def _fsdp2(model, precision, args, out, sample=True):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
              if precision == "bf16" else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch_adamw(model.parameters())
    params = [q for q in model.parameters() if q.requires_grad]
    out["fsdp2_settings"] = {**FSDP2_SETTINGS, "mp_policy": repr(policy)}
    tracker = FsdpTracker(model, sample)
    FsdpTracker.install()
    FsdpTracker.active = tracker  # one FSDP2 model per process is tracked (isolated runs)
    state = {}

    def step(tokens, targets, probe=None):
        previous, FsdpTracker.active = FsdpTracker.active, tracker
        try:
            clock = PhaseClock()
            with probe.hooks() if probe else contextlib.nullcontext():
                loss = model(tokens, targets)
            if probe:
                probe.after_forward()
            clock.lap("forward")
            loss.backward()
            clock.lap("backward")
            if args.clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
                state["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor")
                                           else norm)
            opt.step()
            if sample:  # params, grads and Adam state all exist here (the steady-state peak)
                _keep_largest(state, _shard_bytes(params, opt))
            opt.zero_grad()
            clock.lap("step")
        finally:
            FsdpTracker.active = previous
        return float(loss.detach()), clock.laps

    def finish():
        out.update({k: v for k, v in state.items() if k != "grad_norm"})
        out.update(_tracker_numbers(tracker))

    def owned():  # at a step boundary (after zero_grad): sharded params + AdamW state
        return unique_storage_bytes(params) + unique_storage_bytes(
            [q.grad for q in params]) + unique_storage_bytes(optimizer_state_tensors(opt))

    return {"step": step, "finish": finish, "model": model,
            "grad_norm": lambda: state.get("grad_norm"),
            "comm": lambda: dict(tracker.comm),
            "owned": owned, "reset_peaks": tracker.reset_peaks}


def _shard_bytes(params, opt) -> dict:
    """The local shards' storages (and logical bytes) of params, grads and AdamW state."""
    grads, adam = [q.grad for q in params], optimizer_state_tensors(opt)
    sharded = {
        "param_bytes": unique_storage_bytes(params),
        "grad_bytes": unique_storage_bytes(grads),
        "optimizer_state_bytes": unique_storage_bytes(adam),
        "param_logical_bytes": logical_bytes(params),
        "grad_logical_bytes": logical_bytes(grads),
        "optimizer_state_logical_bytes": logical_bytes(adam),
    }
    sharded["model_state_bytes"] = (sharded["param_bytes"] + sharded["grad_bytes"]
                                    + sharded["optimizer_state_bytes"])
    return sharded


def _keep_largest(state, sharded):
    if sharded["model_state_bytes"] >= state.get("model_state_bytes", 0):
        state.update(sharded)


def _tracker_numbers(tracker) -> dict:
    return {"unsharded_param_peak_bytes": tracker.unsharded_peak,
            "unsharded_plus_comm_peak_bytes": tracker.unsharded_plus_comm_peak,
            "all_gather_buffer_peak_bytes": tracker.ag_buffer_peak,
            "reduce_scatter_buffer_peak_bytes": tracker.rs_buffer_peak,
            "tracker_samples": tracker.samples,
            "fsdp_param_groups": [
                {"module": group._module_fqn or "<root>",
                 "numel": sum(fp.sharded_size.numel() for fp in group.fsdp_params)}
                for group in tracker.param_groups()]}


# ---- parent side ---------------------------------------------------------------------------
def fsdp2_facts(loadavg_start: str, load_samples: list[float]) -> dict:
    facts = {**machine.host_facts(), "zero_root": ZERO_ROOT,
             "zero_commit": machine.git_commit(ZERO_ROOT), "loadavg_end": machine.loadavg(),
             "zero_tree_dirty": machine.tree_dirty(ZERO_ROOT),
             "zero_extension_sha256": machine.extension_sha256(ZERO_ROOT),
             **machine.checkout_facts(ROOT), "date": machine.utc_now(),
             "loadavg_start": loadavg_start, "loadavg_samples": load_samples}
    if load_samples:
        facts["loadavg_samples_text"] = machine.load_range(load_samples)
    return facts


def _isolated_run(name, args, tmp):
    result = spawn_ranks(_run_config, name, args, tmp)
    if "error" in result:
        print(f"[{name}] FAILED after {result['wall_s']:.1f}s:\n{result['error']}", flush=True)
        return result
    one = summarize(result, args)
    print(f"[{name}] step {one['step_ms_median']:.0f} ms  model states "
          f"{pair(one['model_state_bytes'])} MiB  working set "
          f"{pair(one['working_set_bytes'])} MiB  RSS peak "
          f"{pair(one['rss_peak_bytes'])} MiB  sent/step "
          f"{mib(one['comm_bytes_per_step'])} MiB  loss {one['loss_last']:.4f}  "
          f"({result['wall_s']:.1f}s)", flush=True)
    return result


def render_only(path, out_dir):
    """The report of an earlier run, rebuilt from its JSON (nothing is measured)."""
    with open(path) as f:
        saved = json.load(f)
    args = argparse.Namespace(**saved["args"])
    interleaved = saved.get("interleaved")
    if interleaved is not None and "error" not in interleaved:
        interleaved["summary"] = summarize_interleaved(interleaved)
    summaries = [summarize(r, args) for r in saved["raw"]]
    md = render_markdown(summaries, interleaved, saved["machine"], args, saved["command"],
                         saved["wall_s"])
    md = md.replace("\n```\n\nModel:", "\n```\n\n(Report rebuilt from that run's JSON by "
                    "`python benchmarks/bench_fsdp2.py --render-only "
                    f"{os.path.relpath(os.path.abspath(path), ROOT)}`; the numbers are the "
                    "run's.)\n\nModel:", 1)
    print(md)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "fsdp2_vs_zero3.md"), "w") as f:
            f.write(md)
        if os.path.abspath(os.path.join(out_dir, "fsdp2_vs_zero3.json")) != os.path.abspath(path):
            with open(os.path.join(out_dir, "fsdp2_vs_zero3.json"), "w") as f:
                json.dump({**saved, "summary": summaries, "interleaved": interleaved}, f,
                          indent=1)
        print(f"wrote {out_dir}/fsdp2_vs_zero3.md")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.render_only:
        return render_only(args.render_only, args.out)
    args.threads = threads_per_rank(args)
    configs = chosen_configs(args.configs, ALL_CONFIGS)
    args.config_list = configs
    command = command_line()
    t0 = time.perf_counter()
    loadavg_start = machine.loadavg()
    sampler = machine.LoadSampler()
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="bench_fsdp2_") as tmp:
        interleaved = spawn_interleaved(_run_config, args, tmp, summarize_interleaved)
        results = [_isolated_run(name, args, tmp) for name in configs]
        summaries = [summarize(r, args) for r in results]
    wall = time.perf_counter() - t0
    sampler.stop()
    facts = fsdp2_facts(loadavg_start, sampler.samples)
    md = render_markdown(summaries, interleaved, facts, args, command, wall)
    publish(args.out, "fsdp2_vs_zero3", md, {
        "command": command, "args": vars(args), "machine": facts, "wall_s": wall,
        "summary": summaries, "interleaved": interleaved, "raw": results})
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
