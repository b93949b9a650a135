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
import threading
import time
import traceback
import weakref

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
ALL_CONFIGS = ["zero3-fp32", "zero3-noreuse-fp32", "zero3pf-fp32", "fsdp2-fp32",
               "zero3-bf16", "zero3-noreuse-bf16", "zero3pf-bf16", "fsdp2-bf16"]
ZERO_KINDS = ("zero3", "zero3-noreuse", "zero3pf")
# zero configurations that set stage3_max_reuse_distance to 0 (the others keep the default)
NO_REUSE_KINDS = ("zero3-noreuse", "zero3pf")


def _split(name):
    """'zero3-noreuse-fp32' -> ('zero3-noreuse', 'fp32')."""
    kind, precision = name.rsplit("-", 1)
    return kind, precision


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="measured steps per isolated run")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    p.add_argument("--interleaved-steps", type=int, default=10,
                   help="measured steps per configuration in the interleaved timing run "
                        "(0 skips it)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--persistence-threshold", type=int, default=1000,
                   help="zero stage3_param_persistence_threshold (elements)")
    p.add_argument("--prefetch-numel", type=int, default=0,
                   help="stage3_prefetch_bucket_size of the zero3pf configurations (elements; "
                        "0: one transformer block's parameter count). The zero3 and "
                        "zero3-noreuse configurations keep the engine default")
    p.add_argument("--bucket-numel", type=int, default=50_000_000,
                   help="zero reduce_bucket_size (at stage 3 a unit is the grain of reduction)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: cores // world_size, at least 1)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (both)")
    p.add_argument("--configs", default=",".join(ALL_CONFIGS),
                   help="comma-separated subset of " + ",".join(ALL_CONFIGS))
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
def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _local(t):
    """The local tensor of a DTensor (or the tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _unique_storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = _local(t).untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _logical_bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _adamw_params():
    return {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def _gpt_config(args):
    from zero.models.tiny_gpt import GPTConfig
    return GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.n_layer,
                     n_head=args.n_head, n_embd=args.n_embd)


def _param_counts(model) -> dict:
    """Ψ (distinct parameters), split into the blocks and the root unit."""
    block_ids = {id(p) for p in model.blocks.parameters()}
    params = list(model.parameters())  # distinct: the tied head appears once
    blocks = sum(p.numel() for p in params if id(p) in block_ids)
    total = sum(p.numel() for p in params)
    return {"numel": total, "blocks_numel": blocks, "root_numel": total - blocks,
            "block_numel": blocks // max(1, len(model.blocks))}


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
    import zero  # noqa: F401 -- every worker loads the same libraries, FSDP2's included
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    from zero.models.tiny_gpt import TinyGPT, synthetic_batches

    dist.init_process_group("gloo", rank=rank, world_size=world)
    rss_start, rss_peak_start = _rss_now(), _rss_peak()
    if name == "interleaved":
        out = _interleaved(rank, args)
        dist.destroy_process_group()
        return out
    kind, precision = _split(name)
    gpt = _gpt_config(args)
    torch.manual_seed(0)
    model = TinyGPT(gpt)
    out = {"config": name, "rank": rank, **_param_counts(model),
           "threads": torch.get_num_threads(), "zero_module": os.path.dirname(zero.__file__)}
    batches = synthetic_batches(gpt, args.micro_batch, args.warmup + args.steps + 1,
                                seed=1000 + rank)
    runner = (_zero(model, kind, precision, args, out) if kind in ZERO_KINDS
              else _fsdp2(model, precision, args, out))

    times, losses, grad_norms = [], [], []
    for i, (tokens, targets) in enumerate(batches[:args.warmup + args.steps]):
        if i == args.warmup:
            out["comm_at_warmup_end"] = runner["comm"]()
            if "schedule" in runner:
                out["schedule_at_warmup_end"] = runner["schedule"]()
            runner["reset_peaks"]()
        t0 = time.perf_counter()
        loss, phases = runner["step"](tokens, targets)
        elapsed = time.perf_counter() - t0
        losses.append(loss)
        grad_norms.append(runner["grad_norm"]())
        if i >= args.warmup:
            times.append({"total": elapsed, **phases})
    out["comm_at_end"] = runner["comm"]()
    out["grad_norms"] = grad_norms
    runner["finish"]()
    out["step_times"] = times
    out["losses"] = losses
    out["rss_start_bytes"] = rss_start
    out["rss_peak_at_start_bytes"] = rss_peak_start
    out["rss_end_bytes"] = _rss_now()
    out["rss_peak_bytes"] = _rss_peak()
    if not args.no_profile:
        out["profiled_step"] = _profiled_step(runner, *batches[-1])
        out["rss_peak_after_profiled_bytes"] = _rss_peak()
    dist.destroy_process_group()
    return out


class _SavedParamProbe:
    """Parameter memory the autograd graph still holds after forward although the framework
    has released it. A saved-tensors hook notes every tensor autograd saves whose storage is,
    at that moment, the storage of one of the module's parameters (a gathered/unsharded
    weight); after forward, the storages no module parameter uses any more are summed at
    their current size. FSDP2 frees an unsharded parameter by resizing its storage to 0 (so
    saved views cost nothing until it re-gathers into the same storage); an engine that only
    drops its own reference leaves the storage alive until backward frees the graph node."""

    def __init__(self, model):
        self.model = model
        self.storages = {}
        self.held_bytes = 0
        self.held_count = 0

    def _param_storages(self):
        ptrs = set()
        for module in self.model.modules():
            for param in module._parameters.values():
                if param is not None:
                    storage = _local(param).untyped_storage()
                    if storage.nbytes():
                        ptrs.add(storage.data_ptr())
        return ptrs

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() and ptr not in self.storages and ptr in self._param_storages():
            self.storages[ptr] = storage
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)

    def after_forward(self):
        live = self._param_storages()
        held = [st for ptr, st in self.storages.items() if ptr not in live and st.nbytes()]
        self.held_bytes = sum(st.nbytes() for st in held)
        self.held_count = len(held)
        self.storages = {}  # keep nothing alive past this step


def _profiled_step(runner, tokens, targets):
    """One more step under torch.profiler(profile_memory=True): the peak of the live bytes
    allocated during the step (the CPU allocator reports only allocations made while
    profiling, so the running total starts at 0), and the bytes sent in exactly this step."""
    from torch.profiler import ProfilerActivity, profile
    from torch._C._profiler import _EventType

    owned = runner["owned"]()
    comm0 = runner["comm"]()
    probe = _SavedParamProbe(runner["model"])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss, _ = runner["step"](tokens, targets, probe)
    comm1 = runner["comm"]()
    events = []

    def walk(nodes):
        for node in nodes:
            if node.typed[0] == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.total_allocated))
            walk(node.children)
    walk(prof.profiler.kineto_results.experimental_event_tree())
    events.sort()
    peak = max((total for _, total in events), default=0)
    end = events[-1][1] if events else 0
    return {"owned_at_start_bytes": owned, "transient_peak_bytes": peak,
            "live_at_end_bytes": end, "step_peak_bytes": owned + peak,
            "allocation_events": len(events), "loss": loss,
            "autograd_held_param_bytes": probe.held_bytes,
            "autograd_held_param_storages": probe.held_count,
            "comm_delta": {k: comm1[k] - comm0[k] for k in comm1}}


def _interleaved(rank, args):
    """Every configuration in this one pair of processes, stepping round-robin (config A step
    i, config B step i, ...; the order rotates every step): host noise on a shared VM then
    hits all configurations alike. No memory numbers come from here."""
    from zero.models.tiny_gpt import TinyGPT, synthetic_batches

    gpt = _gpt_config(args)
    steps = args.warmup + args.interleaved_steps
    batches = synthetic_batches(gpt, args.micro_batch, steps, seed=1000 + rank)
    runners = {}
    for name in args.config_list:
        kind, precision = _split(name)
        torch.manual_seed(0)
        model = TinyGPT(gpt)
        scratch = {}
        try:
            runners[name] = (_zero(model, kind, precision, args, scratch)
                             if kind in ZERO_KINDS
                             else _fsdp2(model, precision, args, scratch, sample=False))
        except Exception:  # noqa: BLE001 -- the isolated run reports the failure in full
            print(f"[interleaved] {name} could not be built, left out:\n"
                  f"{traceback.format_exc()}", flush=True)
    times = {name: [] for name in runners}
    failed = {}
    for i in range(steps):
        order = list(runners)
        order = order[i % len(order):] + order[:i % len(order)]
        for name in order:
            if name in failed:
                continue
            t0 = time.perf_counter()
            try:
                _, phases = runners[name]["step"](*batches[i])
            except Exception:  # noqa: BLE001
                failed[name] = traceback.format_exc()
                continue
            elapsed = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append({"total": elapsed, **phases})
    return {"rank": rank, "step_times": {k: v for k, v in times.items() if k not in failed},
            "failed": failed}


def _zero(model, kind, precision, args, out):
    import zero

    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": args.clip,
        "optimizer": {"type": "AdamW", "params": _adamw_params()},
        "zero_optimization": {"stage": 3,
                              "stage3_param_persistence_threshold": args.persistence_threshold,
                              "reduce_bucket_size": args.bucket_numel},
    }
    if kind in NO_REUSE_KINDS:
        cfg["zero_optimization"]["stage3_max_reuse_distance"] = 0
    if kind == "zero3pf":
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = (
            args.prefetch_numel or sum(p.numel() for p in model.blocks[0].parameters()))
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    out["engine_config"] = cfg
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    registry = engine._core.registry()
    zc = engine.config.zero_optimization
    out["stage3_settings"] = {k: int(getattr(zc, k)) for k in (
        "stage3_prefetch_bucket_size", "stage3_max_reuse_distance", "stage3_max_live_parameters",
        "stage3_max_inflight_gathers", "stage3_param_persistence_threshold")}
    # per step: the elements the gather schedule still has gathered when forward returns (the
    # units it keeps for their backward); read outside the timed region
    kept_after_forward = out.setdefault("gathered_after_forward_numel", [])

    def step(tokens, targets, probe=None):
        t0 = time.perf_counter()
        with probe.hooks() if probe else contextlib.nullcontext():
            loss = engine(tokens, targets)
        t_fwd = time.perf_counter()
        if probe:
            probe.after_forward()
        kept_after_forward.append(int(engine._core.schedule_stats()["gathered_numel"]))
        t1 = time.perf_counter()  # the bookkeeping above is in no phase
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        return float(loss.detach()), {"forward": t_fwd - t0, "backward": t2 - t1,
                                      "step": t3 - t2}

    def finish():
        report = engine.memory_report()
        out["report"] = report
        out["grad_norm_last"] = engine.last_step_result.get("grad_norm")
        out["prefetch_default"] = engine.config.zero_optimization.stage3_prefetch_bucket_size
        out["gathered_param_current_end"] = int(report["categories"].get(
            "gathered_param", {}).get("current", 0))
        out["units"] = len(engine._stage3.plan.modules)
        try:
            out["schedule_stats"] = dict(engine._core.schedule_stats())
        except Exception as exc:  # noqa: BLE001 -- an engine without a gather schedule
            out["schedule_stats"] = {"error": repr(exc)}

    def reset_peaks():
        """Peaks from here on are the steady state; the warm-up's (first step: the engine
        learns the unit order) are kept apart."""
        report = engine.memory_report()
        out["warmup_peaks"] = {"categories": {k: v["peak"] for k, v in
                                              report["categories"].items()},
                               "total": report["total"]["peak"]}
        registry.reset_peaks()

    def grad_norm():
        value = engine.last_step_result.get("grad_norm")
        return None if value is None else float(value)

    def schedule():
        stats = dict(engine._core.schedule_stats())
        return {k: v for k, v in stats.items() if k != "notice"}

    return {"step": step, "finish": finish, "model": engine.module, "grad_norm": grad_norm,
            "comm": lambda: dict(engine.memory_report()["comm"]),
            "owned": lambda: int(registry.total()["current"]),
            "reset_peaks": reset_peaks, "schedule": schedule}


class _FsdpTracker:
    """Counts FSDP2's collective bytes (paper convention) and samples its unsharded working
    set. FSDP2's hooks are patched at class level, so one tracker per process is active."""
    active = None
    installed = False

    def __init__(self, model, sample: bool):
        self.model = model
        self.sample_enabled = sample
        self.groups = None
        self.comm = {"all_gather_bytes": 0, "reduce_scatter_bytes": 0, "calls": 0}
        # flat all-gather outputs and reduce-scatter inputs, alive until FSDP2 drops them
        self.buffers = weakref.WeakSet()
        self.reset_peaks()

    def reset_peaks(self):
        self.unsharded_peak = 0
        self.unsharded_plus_comm_peak = 0
        self.ag_buffer_peak = 0
        self.rs_buffer_peak = 0
        self.samples = 0

    def _param_groups(self):
        if self.groups is None:
            from torch.distributed.fsdp import FSDPModule
            groups = []
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    groups += list(module._get_fsdp_state()._fsdp_param_groups)
            self.groups = groups
        return self.groups

    def unsharded_bytes(self) -> int:
        total = 0
        for group in self._param_groups():
            for fsdp_param in group.fsdp_params:
                for t in list(getattr(fsdp_param, "all_gather_outputs", [])) + \
                        list(getattr(fsdp_param, "_unsharded_inner_tensors", [])):
                    total += t.untyped_storage().nbytes()
        return total

    def buffer_bytes(self) -> int:
        seen, total = set(), 0
        for t in list(self.buffers):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    def sample(self):
        if not self.sample_enabled:
            return
        live = self.unsharded_bytes()
        self.samples += 1
        self.unsharded_peak = max(self.unsharded_peak, live)
        self.unsharded_plus_comm_peak = max(self.unsharded_plus_comm_peak,
                                            live + self.buffer_bytes())

    @classmethod
    def install(cls):
        if cls.installed:
            return
        cls.installed = True
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        ag_call, rs_call = coll.DefaultAllGather.__call__, coll.DefaultReduceScatter.__call__

        def all_gather(self, *a, **k):
            output_tensor = k["output_tensor"] if "output_tensor" in k else a[0]
            tracker = cls.active
            if tracker is not None:
                nbytes = output_tensor.numel() * output_tensor.element_size()
                tracker.comm["all_gather_bytes"] += nbytes
                tracker.comm["calls"] += 1
                tracker.ag_buffer_peak = max(tracker.ag_buffer_peak, nbytes)
                if tracker.sample_enabled:
                    tracker.buffers.add(output_tensor)
                    tracker.sample()
            return ag_call(self, *a, **k)

        def reduce_scatter(self, *a, **k):
            output_tensor = k["output_tensor"] if "output_tensor" in k else a[0]
            input_tensor = k["input_tensor"] if "input_tensor" in k else a[1]
            tracker = cls.active
            if tracker is not None:
                nbytes = input_tensor.numel() * input_tensor.element_size()
                buffers = nbytes + output_tensor.numel() * output_tensor.element_size()
                tracker.comm["reduce_scatter_bytes"] += nbytes
                tracker.comm["calls"] += 1
                tracker.rs_buffer_peak = max(tracker.rs_buffer_peak, buffers)
                if tracker.sample_enabled:
                    tracker.buffers.add(input_tensor)
                    tracker.sample()
            return rs_call(self, *a, **k)

        coll.DefaultAllGather.__call__ = all_gather
        coll.DefaultReduceScatter.__call__ = reduce_scatter

        wait_for_unshard, post_backward = (FSDPParamGroup.wait_for_unshard,
                                           FSDPParamGroup.post_backward)

        def wait_for_unshard_sampled(self, *a, **k):
            result = wait_for_unshard(self, *a, **k)
            if cls.active is not None:
                cls.active.sample()
            return result

        def post_backward_sampled(self, *a, **k):
            if cls.active is not None:
                cls.active.sample()
            try:
                return post_backward(self, *a, **k)
            finally:
                if cls.active is not None:
                    cls.active.sample()

        FSDPParamGroup.wait_for_unshard = wait_for_unshard_sampled
        FSDPParamGroup.post_backward = post_backward_sampled


def _fsdp2(model, precision, args, out, sample=True):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
              if precision == "bf16" else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    p = _adamw_params()
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]),
                            eps=p["eps"], weight_decay=p["weight_decay"])
    params = [q for q in model.parameters() if q.requires_grad]
    out["fsdp2_settings"] = {
        "fully_shard": "each of model.blocks, then the root (reshard_after_forward default: "
                       "True for blocks, the root keeps its parameters after forward)",
        "mp_policy": repr(policy), "mesh": "init_device_mesh('cpu', (world,))",
        "optimizer": "torch.optim.AdamW (defaults: foreach=None, fused=None)",
        "clip": "torch.nn.utils.clip_grad_norm_ on the DTensor parameters",
        "zero_grad": "optimizer.zero_grad() (set_to_none=True) after the step"}
    tracker = _FsdpTracker(model, sample)
    _FsdpTracker.install()
    _FsdpTracker.active = tracker  # one FSDP2 model per process is tracked (isolated runs)
    state = {}

    def state_tensors():
        return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]

    def measure_states():
        grads = [q.grad for q in params]
        sharded = {
            "param_bytes": _unique_storage_bytes(params),
            "grad_bytes": _unique_storage_bytes(grads),
            "optimizer_state_bytes": _unique_storage_bytes(state_tensors()),
            "param_logical_bytes": _logical_bytes(params),
            "grad_logical_bytes": _logical_bytes(grads),
            "optimizer_state_logical_bytes": _logical_bytes(state_tensors()),
        }
        sharded["model_state_bytes"] = (sharded["param_bytes"] + sharded["grad_bytes"]
                                        + sharded["optimizer_state_bytes"])
        if sharded["model_state_bytes"] >= state.get("model_state_bytes", 0):
            state.update(sharded)

    def step(tokens, targets, probe=None):
        previous, _FsdpTracker.active = _FsdpTracker.active, tracker
        try:
            t0 = time.perf_counter()
            with probe.hooks() if probe else contextlib.nullcontext():
                loss = model(tokens, targets)
            if probe:
                probe.after_forward()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            if args.clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
                state["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor")
                                           else norm)
            opt.step()
            if sample:  # params, grads and Adam state all exist here (the steady-state peak)
                measure_states()
            opt.zero_grad()
            t3 = time.perf_counter()
        finally:
            _FsdpTracker.active = previous
        return float(loss.detach()), {"forward": t1 - t0, "backward": t2 - t1, "step": t3 - t2}

    def finish():
        out.update({k: v for k, v in state.items() if k != "grad_norm"})
        out["unsharded_param_peak_bytes"] = tracker.unsharded_peak
        out["unsharded_plus_comm_peak_bytes"] = tracker.unsharded_plus_comm_peak
        out["all_gather_buffer_peak_bytes"] = tracker.ag_buffer_peak
        out["reduce_scatter_buffer_peak_bytes"] = tracker.rs_buffer_peak
        out["tracker_samples"] = tracker.samples
        out["fsdp_param_groups"] = [
            {"module": group._module_fqn or "<root>",
             "numel": sum(fp.sharded_size.numel() for fp in group.fsdp_params)}
            for group in tracker._param_groups()]

    def owned():  # at a step boundary (after zero_grad): sharded params + AdamW state
        return _unique_storage_bytes(params) + _unique_storage_bytes(
            [q.grad for q in params]) + _unique_storage_bytes(state_tensors())

    return {"step": step, "finish": finish, "model": model,
            "grad_norm": lambda: state.get("grad_norm"),
            "comm": lambda: dict(tracker.comm),
            "owned": owned, "reset_peaks": tracker.reset_peaks}


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


def _delta(start, end):
    return {k: end[k] - start.get(k, 0) for k in end}


def summarize(result, args):
    """The per-configuration numbers the tables show (every rank's raw data stays in the
    JSON)."""
    if "error" in result:
        return {"config": result["config"], "error": result["error"]}
    name, ranks = result["config"], result["ranks"]
    kind, precision = _split(name)
    b = 4 if precision == "fp32" else 2
    n = len(ranks[0]["step_times"])
    per_step = sorted(max(r["step_times"][i]["total"] for r in ranks) for i in range(n))
    phases = {ph: statistics.median(max(r["step_times"][i][ph] for r in ranks)
                                    for i in range(n)) * 1e3
              for ph in ("forward", "backward", "step")}
    world = args.world_size
    numel = ranks[0]["numel"]
    s = {
        "config": name, "kind": kind, "precision": precision, "param_bytes_b": b,
        "numel": numel, "root_numel": ranks[0]["root_numel"],
        "blocks_numel": ranks[0]["blocks_numel"],
        "step_ms_median": statistics.median(per_step) * 1e3,
        "step_ms_p10": per_step[len(per_step) // 10] * 1e3,
        "phase_ms_median": phases, "measured_steps": n,
        "rss_start_bytes": [r["rss_start_bytes"] for r in ranks],
        "rss_peak_bytes": [r["rss_peak_bytes"] for r in ranks],
        "losses_rank0": ranks[0]["losses"],
        "grad_norms_rank0": ranks[0].get("grad_norms"),
        "loss_first": ranks[0]["losses"][0], "loss_last": ranks[0]["losses"][-1],
        "paper_3psi_b_bytes": 3 * numel * b,
        "formula_16psi_over_n_bytes": 16 * numel // world,
    }
    deltas = [_delta(r["comm_at_warmup_end"], r["comm_at_end"]) for r in ranks]
    # every *_bytes counter but the total (zero counts control messages -- rank-agreement
    # fingerprints, the learned launch order -- apart from the payload, as control_bytes)
    s["comm_bytes_per_step_by_op"] = {k: v / n for k, v in deltas[0].items()
                                      if k.endswith("_bytes") and k != "total_bytes"}
    s["comm_bytes_per_step"] = sum(s["comm_bytes_per_step_by_op"].values())
    s["comm_calls_per_step"] = sum(v for k, v in deltas[0].items()
                                   if k == "calls" or k.endswith("_calls")) / n
    s["comm_control_calls_per_step"] = deltas[0].get("control_calls", 0) / n
    prof = [r.get("profiled_step") for r in ranks]
    if all(prof):
        s["profiled"] = {k: [p[k] for p in prof] for k in
                         ("owned_at_start_bytes", "transient_peak_bytes", "step_peak_bytes",
                          "live_at_end_bytes", "autograd_held_param_bytes")}
        one = {k: v for k, v in prof[0]["comm_delta"].items() if k not in ("calls",)}
        s["comm_one_step_rank0"] = one
    if kind in ZERO_KINDS:
        reports = [r["report"] for r in ranks]
        rep = reports[0]
        s["padded_numel"] = rep["numel"]
        s["persistent_numel"] = rep["persistent_numel"]
        s["model_state_bytes"] = [x["model_state_bytes"] for x in reports]
        s["model_state_expected_bytes"] = rep["model_state_expected_bytes"]
        s["model_state_formula"] = rep["model_state_formula"]
        s["categories"] = {k: {f: v.get(f) for f in ("current", "peak", "expected", "formula")}
                           for k, v in rep["categories"].items()}
        cat = lambda x, c, f: x["categories"].get(c, {}).get(f, 0)  # noqa: E731
        s["gathered_peak_bytes"] = [cat(x, "gathered_param", "peak") for x in reports]
        s["bucket_bytes"] = [cat(x, "bucket", "peak") for x in reports]
        s["working_set_bytes"] = [g + k for g, k in zip(s["gathered_peak_bytes"],
                                                        s["bucket_bytes"])]
        s["engine_total_peak_bytes"] = [x["total"]["peak"] for x in reports]
        s["bucket_current_end_bytes"] = [cat(x, "bucket", "current") for x in reports]
        warm = [r.get("warmup_peaks") or {} for r in ranks]
        s["warmup_peak_bytes"] = {
            "bucket": [w.get("categories", {}).get("bucket", 0) for w in warm],
            "gathered_param": [w.get("categories", {}).get("gathered_param", 0) for w in warm],
            "total": [w.get("total", 0) for w in warm]}
        psi3, psip = rep["numel"], rep["persistent_numel"]
        units = ranks[0]["units"]
        s["units"] = units
        s["prefetch_numel"] = ranks[0]["prefetch_default"]
        s["schedule_stats"] = ranks[0].get("schedule_stats")
        s["stage3_settings"] = ranks[0]["stage3_settings"]
        # the gather schedule over the measured steps (rank 0; the ranks agree by construction
        # -- every collective follows from the fingerprint-checked events)
        st0, st1 = ranks[0]["schedule_at_warmup_end"], ranks[0]["schedule_stats"]
        s["schedule_per_step"] = {k: (st1[k] - st0[k]) / n
                                  for k in ("gathers", "reuses", "prefetches")}
        s["max_inflight_seen"] = [r["schedule_stats"]["max_inflight_seen"] for r in ranks]
        s["peak_gathered_numel"] = [r["schedule_stats"]["peak_gathered_numel"] for r in ranks]
        s["gathered_numel_end"] = [r["schedule_stats"]["gathered_numel"] for r in ranks]
        s["gathered_param_current_end"] = [r["gathered_param_current_end"] for r in ranks]
        kept = ranks[0]["gathered_after_forward_numel"][args.warmup:args.warmup + n]
        s["kept_after_forward_numel"] = {"mean": sum(kept) / n, "min": min(kept),
                                         "max": max(kept)}
        # The mechanism: every unit is all-gathered once in forward (it is used once there and
        # released after, or kept for its backward), and again in backward unless it is still
        # gathered when forward returns. K = elements still gathered at the end of forward
        # (measured from the schedule, not from the byte counters), averaged per step.
        k_mean = sum(kept) / n
        s["comm_predicted"] = {
            f"all_gather (Ψ3·b forward + (Ψ3 − K)·b backward re-gathers, K = elements kept "
            f"gathered from forward to backward = {k_mean:,.0f}; + Ψp·b persistent params "
            f"after the step)":
                (2 * psi3 - k_mean) * b + psip * b,
            "reduce_scatter (Ψ3·b)": psi3 * b,
            "all_reduce (2·Ψp·b persistent grads + 2·8 B fp64 grad-norm scalar)":
                2 * psip * b + 16,
            f"schedule fingerprints ((2U+1) = {2 * units + 1} all-gathers of 3 int64 per rank)":
                (2 * units + 1) * 3 * 8 * world,
        }
        s["comm_source"] = "measured: engine counters (rank 0), differenced over measured steps"
    else:
        r0 = ranks[0]
        s["model_state_bytes"] = [r["model_state_bytes"] for r in ranks]
        s["model_state_expected_bytes"] = 16 * numel // world
        s["model_state_formula"] = "16Ψ/N (4 param + 4 grad + 8 AdamW, all sharded)"
        s["breakdown"] = {k: [r[k] for r in ranks] for k in (
            "param_bytes", "grad_bytes", "optimizer_state_bytes", "param_logical_bytes",
            "grad_logical_bytes", "optimizer_state_logical_bytes")}
        s["gathered_peak_bytes"] = [r["unsharded_param_peak_bytes"] for r in ranks]
        s["bucket_bytes"] = [0 for _ in ranks]  # FSDP2's comm buffers are transient
        s["comm_buffer_peak_bytes"] = {
            "all_gather_flat_output": [r["all_gather_buffer_peak_bytes"] for r in ranks],
            "reduce_scatter_in_plus_out": [r["reduce_scatter_buffer_peak_bytes"]
                                           for r in ranks]}
        s["working_set_bytes"] = [r["unsharded_plus_comm_peak_bytes"] for r in ranks]
        s["fsdp_param_groups"] = r0["fsdp_param_groups"]
        s["comm_predicted"] = {
            "all_gather (2·Ψblocks·b: blocks fwd+bwd; Ψroot·b: root once, kept after forward)":
                2 * s["blocks_numel"] * b + s["root_numel"] * b,
            "reduce_scatter (Ψ·b_reduce)": numel * b,
        }
        s["comm_source"] = ("measured: wrapped FSDP2 all-gather/reduce-scatter calls (rank 0); "
                            "clip_grad_norm_'s scalar all-reduce not counted")
    return s


def _step_stats(rank_times):
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
    summary = {name: _step_stats([r["step_times"][name] for r in ranks])
               for name in ranks[0]["step_times"] if all(r["step_times"].get(name)
                                                         for r in ranks)}
    for r in ranks:
        for name, err in r.get("failed", {}).items():
            summary[name] = {"error": err}
    # Paired ratios: configuration a over b within the same round (the rounds rotate the order,
    # so a and b ran seconds apart): a burst of load from other processes hits both, which
    # the ratio of the two medians does not cancel.
    timed = [n for n in ranks[0]["step_times"] if n in summary and "total" in summary[n]]
    pairs = []
    for a in timed:
        kind, precision = _split(a)
        if kind in ZERO_KINDS and f"fsdp2-{precision}" in timed:
            pairs.append((a, f"fsdp2-{precision}"))
        if kind == "zero3" and f"zero3-noreuse-{precision}" in timed:
            pairs.append((a, f"zero3-noreuse-{precision}"))
    paired = {}
    for a, b in pairs:
        n = min(len(r["step_times"][a]) for r in ranks)
        n = min(n, min(len(r["step_times"][b]) for r in ranks))
        ratios = sorted(max(r["step_times"][a][i]["total"] for r in ranks)
                        / max(r["step_times"][b][i]["total"] for r in ranks) for i in range(n))
        paired[f"{a}/{b}"] = {"median": statistics.median(ratios),
                              "p10": ratios[n // 10], "p90": ratios[n - 1 - n // 10],
                              "below_1": sum(x < 1 for x in ratios), "rounds": n}
    summary["paired"] = paired
    return summary


def machine_facts():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception as exc:  # noqa: BLE001
            return f"({exc})"
    return {"lscpu_head": sh("lscpu | head -20"), "nproc": sh("nproc"), "free_g": sh("free -g"),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "zero_root": ZERO_ROOT,
            "zero_commit": os.environ.get("ZERO_COMMIT")
                           or sh(f"git -C {shlex.quote(ZERO_ROOT)} rev-parse HEAD 2>/dev/null")
                           or "unknown",
            "loadavg_end": sh("cat /proc/loadavg"),
            "zero_tree_dirty": sh(f"git -C {shlex.quote(ZERO_ROOT)} status --porcelain "
                                  "-- zero csrc 2>/dev/null | head -c 2000"),
            "zero_extension_sha256": sh(f"sha256sum {shlex.quote(ZERO_ROOT)}/zero/_C*.so "
                                        "2>/dev/null | cut -c1-16"),
            "checkout_commit": sh(f"git -C {shlex.quote(ROOT)} rev-parse HEAD 2>/dev/null"),
            "checkout_dirty": sh(f"git -C {shlex.quote(ROOT)} status --porcelain 2>/dev/null "
                                 "| head -c 2000"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _mib(x):
    return f"{x / MIB:.2f}"


def _pair(values, fmt=_mib):
    values = values if isinstance(values, list) else [values]
    if len(set(values)) == 1:
        return fmt(values[0])
    return " / ".join(fmt(v) for v in values)


def _ratio(inter, a, b, key="total"):
    ia, ib = inter.get(a), inter.get(b)
    if isinstance(ia, dict) and key in ia and isinstance(ib, dict) and key in ib:
        return ia[key]["median"] / ib[key]["median"]
    return None


def findings(by, inter, args):
    """What this run's numbers say. Every number is computed from this run; the mechanisms
    named are the engines' designs (read from their sources), not measured separately."""
    out = ["", "## Reading the numbers", ""]
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        zs = [by[f"{k}-{precision}"] for k in ZERO_KINDS if f"{k}-{precision}" in by]
        if not zs:
            continue
        if f is None:
            out.append(f"* **{precision}**: no FSDP2 result to compare with (see Failures).")
            continue
        b = f["param_bytes_b"]
        # time
        parts = []
        for z in zs:
            r = _ratio(inter, z["config"], f["config"])
            if r is None:
                continue
            phases = ", ".join(
                f"{k} {inter[z['config']][k]['median']:.0f} vs "
                f"{inter[f['config']][k]['median']:.0f} ms" for k in ("forward", "backward", "step"))
            pr = inter.get("paired", {}).get(f"{z['config']}/{f['config']}")
            paired = ""
            if pr:
                r = pr["median"]
                paired = (f"paired per round {pr['median']:.2f}x, p10-p90 {pr['p10']:.2f}-"
                          f"{pr['p90']:.2f}, zero faster in {pr['below_1']} of {pr['rounds']} "
                          f"rounds; ")
            word = "within ±5% of"
            if pr and r < 0.95 and 3 * pr["below_1"] >= 2 * pr["rounds"]:
                word = "faster than"
            elif pr and r > 1.05 and 3 * (pr["rounds"] - pr["below_1"]) >= 2 * pr["rounds"]:
                word = "slower than"
            elif pr and (r < 0.95 or r > 1.05):
                word = "not clearly apart from"
            elif not pr:
                word = ("faster than" if r < 0.95 else "slower than" if r > 1.05
                        else "within ±5% of")
            parts.append(f"{z['config']} {_ratio(inter, z['config'], f['config']):.2f}x of "
                         f"medians ({paired}{word} FSDP2; {phases})")
        if parts:
            out.append(f"* **Step time, {precision}** (interleaved run, zero / FSDP2; the "
                       f"verdict follows the paired ratio: faster or slower when it is beyond "
                       f"±5% and at least 2/3 of the rounds agree): "
                       + "; ".join(parts) + f". Isolated medians: "
                       + ", ".join(f"{x['config']} {x['step_ms_median']:.0f} ms"
                                   for x in zs + [f]) + ".")
        # model states
        for z in zs[:1]:
            zm, fm = z["model_state_bytes"][0], f["model_state_bytes"][0]
            out.append(
                f"* **Model states, {precision}**: zero {_mib(zm)} MiB "
                f"({'exactly' if zm == z['model_state_expected_bytes'] else 'vs'} its formula "
                f"{z['model_state_formula']}), FSDP2 {_mib(fm)} MiB (16Ψ/N = "
                f"{_mib(f['model_state_expected_bytes'])} MiB). Same 16 bytes per parameter, "
                f"sharded, on both sides; zero's {(zm - fm) / 1024:+.1f} KiB are its "
                f"{z['persistent_numel']:,} persistent elements (parameters of ≤ "
                f"{args.persistence_threshold} elements: param and gradient kept whole on "
                f"every rank) and its alignment padding. In bf16 the split differs (zero: bf16 "
                f"param + bf16 grad + fp32 master + Adam; FSDP2: fp32 param + fp32 grad + Adam) "
                f"but the total is the same.")
        # working set
        whole = f["numel"] * b

        def blocks(g, x):  # the gathered bytes as "root + k blocks"
            return (g / b - x["root_numel"]) / max(1, x["blocks_numel"] / args.n_layer)
        ws = []
        for z in zs:
            g, st = z["gathered_peak_bytes"][0], z["stage3_settings"]
            ws.append(f"{z['config']} (prefetch {st['stage3_prefetch_bucket_size']:,} elements, "
                      f"reuse distance {st['stage3_max_reuse_distance']:,}, ≤ "
                      f"{st['stage3_max_inflight_gathers']} all-gathers in flight) gathers at "
                      f"most {_mib(g)} MiB = {g / whole:.2f} of the whole model at once (≈ root "
                      f"+ {blocks(g, z):.1f} blocks; "
                      f"{_mib(z['kept_after_forward_numel']['mean'] * b)} MiB still gathered "
                      f"when forward returns)")
        fg = f["gathered_peak_bytes"][0]
        ws.append(f"FSDP2 at most {_mib(fg)} MiB = {fg / whole:.2f} of it (≈ root + "
                  f"{blocks(fg, f):.1f} blocks; its root group stays unsharded from forward "
                  f"through backward, and its backward may prefetch the next block's "
                  f"all-gather)")
        note = []
        reuse_all = [z["config"] for z in zs
                     if z["kept_after_forward_numel"]["min"] >= z["padded_numel"]]
        if reuse_all:
            note.append(
                f" In {', '.join(reuse_all)} every unit's next use after its forward is its "
                f"own backward, within the default reuse distance, and the whole model is "
                f"below stage3_max_live_parameters, so no unit is released between forward and "
                f"backward: the whole model stays gathered from the end of forward until each "
                f"unit's backward ends (then it is released).")
        lean = [z for z in zs if z["kept_after_forward_numel"]["max"] == 0]
        if lean:
            note.append(
                f" Without reuse ({', '.join(z['config'] for z in lean)}) a unit is released "
                f"when its forward or its backward ends; the root unit is in use for the "
                f"whole forward (its module's forward encloses the blocks'), so the peak is the "
                f"root, the block computing and the prefetched blocks: at most "
                f"stage3_max_inflight_gathers all-gathers in flight and at most "
                f"stage3_prefetch_bucket_size elements ahead, whichever binds first.")
        default_pf = [z for z in zs if z["kind"] == "zero3-noreuse"]
        if default_pf and default_pf[0]["prefetch_numel"] >= f["numel"]:
            note.append(
                f" The default stage3_prefetch_bucket_size ({default_pf[0]['prefetch_numel']:,}"
                f" elements, DeepSpeed's default) is larger than this whole model "
                f"({f['numel']:,}), so in {default_pf[0]['config']} the in-flight bound sets "
                f"the prefetch depth (most seen: "
                f"{_pair(default_pf[0]['max_inflight_seen'], str)}); on 39a4e5b, before "
                f"that bound existed, the same default prefetch had the whole model gathered "
                f"or in flight at once.")
        out.append(f"* **Gathered parameters, {precision}**: " + "; ".join(ws) + ". zero's "
                   "gather schedule records the first step's unit order and later steps "
                   "prefetch the next units while the current one computes." + "".join(note))
        z0 = zs[0]
        held = [(x["config"], x["profiled"]["autograd_held_param_bytes"][0])
                for x in zs + [f] if x.get("profiled")]
        if held:
            zero_held = [(c, h) for c, h in held if not c.startswith("fsdp2")]
            out.append(
                f"* **Released parameters still held by autograd after forward, {precision}**: "
                + "; ".join(f"{c} {_mib(h)} MiB" for c, h in held) + ". " +
                ("zero's release after a unit's forward drops the engine's reference to the "
                 "gathered buffer (the registry counts it as freed), but autograd has saved "
                 "views of the gathered weights (e.g. for the matmuls' weight gradients), so "
                 "the buffer stays allocated until backward frees that graph node -- while "
                 "backward all-gathers the same unit again into a new buffer. The registry's "
                 "`gathered_param` peak therefore understates the real parameter working set "
                 "(up to every released unit of the forward, i.e. about the whole model, plus "
                 "the re-gathered ones); FSDP2 frees by resizing the storage to 0 and "
                 "re-gathers into the same storage, so its saved views cost nothing between "
                 "forward and backward."
                 if any(h > 0 for _, h in zero_held) else
                 "Neither side keeps released parameters alive through autograd."))
        steady, kept = z0["bucket_bytes"][0], z0["bucket_current_end_bytes"][0]
        slot = (1 + 1 / args.world_size) * z0["root_numel"] * b  # largest unit: full + 1/N
        warm = z0["warmup_peak_bytes"]["bucket"][0]
        text = (f"* **Buckets, {precision}**: after warm-up zero's reduce-scatter buckets peak at "
                f"{_mib(steady)} MiB per step and {_mib(kept)} MiB stay allocated between steps "
                f"(≈ {steady / slot:.1f} pool slots, each a full-unit input plus its 1/N output "
                f"sized for the *largest* unit -- here the root with the {args.vocab}x"
                f"{args.n_embd} tied embedding, {z0['root_numel']:,} elements; two slots with "
                f"overlap_comm, the stage-3 default).")
        if warm > 1.05 * steady:
            text += (f" During the warm-up steps the pool peaked at {_mib(warm)} MiB "
                     f"(≈ {warm / slot:.1f} slots); this engine learns the units' launch "
                     f"order from rank 0's first backward and agrees on it by broadcast, and its "
                     f"pool grows while that happens and shrinks back after the backward.")
        else:
            text += (f" The warm-up steps peaked at {_mib(warm)} MiB too: the first backward, "
                     f"which learns the units' launch order, no longer grows the pool (on "
                     f"39a4e5b it reached ≈ 6 slots there; the persistent small-parameter group "
                     f"now launches last).")
        text += (f" FSDP2 keeps no buckets: a group's reduce-scatter input exists only around "
                 f"that group's reduction (largest seen: "
                 f"{_mib(f['comm_buffer_peak_bytes']['reduce_scatter_in_plus_out'][0])} MiB "
                 f"input + output).")
        out.append(text)
        prof = [(x["config"], x.get("profiled")) for x in zs + [f]]
        if all(p for _, p in prof):
            out.append(
                f"* **Step peak, {precision}** (owned at the step's start + peak of the step's "
                f"own allocations): " + "; ".join(
                    f"{c} {_mib(p['step_peak_bytes'][0])} MiB ({_mib(p['owned_at_start_bytes'][0])}"
                    f" + {_mib(p['transient_peak_bytes'][0])})" for c, p in prof) +
                ". Activations are identical (same model, batch and dtype of compute). FSDP2's "
                "owned-at-start has no gradients (zero_grad sets them to None; its gradient "
                "shards are allocated in backward and show up in the transient part); zero's "
                "includes its gradient shard and its buckets.")
            fp_ = f["profiled"]
            for z in zs:
                zp_ = z["profiled"]
                gap = zp_["step_peak_bytes"][0] - fp_["step_peak_bytes"][0]
                owned_gap = zp_["owned_at_start_bytes"][0] - fp_["owned_at_start_bytes"][0]
                transient_gap = zp_["transient_peak_bytes"][0] - fp_["transient_peak_bytes"][0]
                out[-1] += (
                    f" {z['config']} peaks {_mib(gap)} MiB above FSDP2: {_mib(owned_gap)} MiB "
                    f"already at the step's start (its buckets, {_mib(z['bucket_bytes'][0])}, "
                    f"and its gradient shard, which FSDP2 drops at zero_grad and allocates "
                    f"again in backward) and {_mib(transient_gap)} MiB more in the step's own "
                    f"allocations, against {_mib(zp_['autograd_held_param_bytes'][0])} MiB of "
                    f"released parameters that autograd holds at the end of its forward.")
            uneven = [f"{c} {_pair(p['transient_peak_bytes'])}" for c, p in prof
                      if max(p["transient_peak_bytes"]) - min(p["transient_peak_bytes"]) > MIB]
            residue = [f"{c} {_pair(p['live_at_end_bytes'])}" for c, p in prof
                       if max(p["live_at_end_bytes"]) > MIB]
            out[-1] += (
                " The transient peak is good to about a unit, not to the byte. The profiler "
                "records allocations from threads other than the training thread too (with gloo, "
                "presumably its worker threads), so whether collective temporaries overlap the "
                "peak depends on thread timing"
                + (f" (here the ranks differ: {'; '.join(uneven)} MiB)" if uneven else "")
                + (f"; more than 1 MiB allocated during the step and not seen freed at its end: "
                   f"{'; '.join(residue)} MiB (still alive, or a free the profiler did not "
                   f"record, which leaves its running total high)" if residue else
                   "; no profiled step ended with more than 1 MiB it allocated left unfreed")
                + ".")
        out.append(f"* **RSS peak, {precision}**: " + "; ".join(
            f"{x['config']} {_pair(x['rss_peak_bytes'])} MiB" for x in zs + [f]) +
            f" (RSS at start ≈ {_mib(f['rss_start_bytes'][0])} MiB is the torch runtime). RSS "
            f"also holds whatever the allocator (glibc malloc) has not returned to the OS, so it "
            f"only roughly follows the peaks above.")
        parts = []
        for z in zs:
            pred = sum(z["comm_predicted"].values())
            parts.append(
                f"{z['config']} {_mib(z['comm_bytes_per_step'])} MiB = "
                f"{z['comm_bytes_per_step'] / z['paper_3psi_b_bytes']:.4f} x 3Ψ·b "
                f"({z['comm_bytes_per_step'] - z['paper_3psi_b_bytes']:+,.0f} bytes; "
                f"{z['schedule_per_step']['gathers']:.0f} unit all-gathers per step; measured "
                f"− predicted {z['comm_bytes_per_step'] - pred:+,.0f} bytes)")
        fc = f["comm_bytes_per_step"]
        parts.append(f"FSDP2 {_mib(fc)} MiB = {fc / f['paper_3psi_b_bytes']:.4f} x 3Ψ·b")
        calls = ", ".join(f"{z['config']} {z['comm_calls_per_step']:.0f} "
                          f"({z['comm_control_calls_per_step']:.0f} of them control)"
                          for z in zs)
        out.append(
            f"* **Bytes sent per step, {precision}** (b = {b}): " + "; ".join(parts) + ". "
            f"zero's counters match the mechanism's prediction (table above): forward "
            f"all-gathers every unit once (Ψ3·b, the root included), backward all-gathers again "
            f"only the units released after forward ((Ψ3 − K)·b; K, the elements kept "
            f"gathered from forward to backward, is read from the schedule, not from the byte "
            f"counters), one reduce-scatter (Ψ3·b), and for the persistent parameters stage "
            f"1's 3Ψp·b (gradient all-reduce 2Ψp·b + all-gather of the updated parameters "
            f"Ψp·b). With reuse 0 (K = 0) that is the paper's 3Ψ·b on the padded Ψ; with the "
            f"default reuse distance (K = Ψ3) it is 2Ψ·b + Ψp·b, i.e. one all-gather of the "
            f"model per step instead of two. The prediction also counts two things that are not "
            f"payload: the fp64 gradient-norm all-reduce (16 bytes) and the schedule's "
            f"fingerprint all-gathers (one per unit event, 2U+1 = {2 * z0['units'] + 1} per "
            f"step, 48 bytes each at N=2). They are tiny, but each one is a synchronising "
            f"collective. Calls per step: {calls}; FSDP2 {f['comm_calls_per_step']:.0f}. "
            f"FSDP2 keeps only its root group unsharded after forward (FSDP2's default for the "
            f"root), so it all-gathers the blocks twice and the root's {f['root_numel']:,} "
            f"elements once: between zero's two schedules.")
        nz = by.get(f"zero3-noreuse-{precision}")
        rz = by.get(f"zero3-{precision}")
        if nz and rz:
            g = lambda x: x["gathered_peak_bytes"][0]  # noqa: E731
            text = (
                f"* **What reuse costs and saves, {precision}** (zero3 vs zero3-noreuse: same "
                f"prefetch and in-flight bounds, reuse distance 1e9 vs 0): reuse keeps "
                f"{_mib(rz['kept_after_forward_numel']['mean'] * b)} MiB gathered from forward "
                f"into backward; gathered peak {_mib(g(rz))} vs {_mib(g(nz))} MiB "
                f"({_mib(g(rz) - g(nz))} MiB more)")
            if rz.get("profiled") and nz.get("profiled"):
                rp, np_ = rz["profiled"]["step_peak_bytes"][0], nz["profiled"]["step_peak_bytes"][0]
                text += f", step peak {_mib(rp)} vs {_mib(np_)} MiB ({_mib(rp - np_)} MiB more)"
            text += (f", RSS peak {_pair(rz['rss_peak_bytes'])} vs {_pair(nz['rss_peak_bytes'])}"
                     f" MiB. It saves "
                     f"{_mib(nz['comm_bytes_per_step'] - rz['comm_bytes_per_step'])} MiB of "
                     f"all-gather per step ({nz['schedule_per_step']['gathers']:.0f} → "
                     f"{rz['schedule_per_step']['gathers']:.0f} unit all-gathers; sent per step "
                     f"{nz['comm_bytes_per_step'] / nz['paper_3psi_b_bytes']:.3f} → "
                     f"{rz['comm_bytes_per_step'] / rz['paper_3psi_b_bytes']:.3f} x 3Ψ·b)")
            r = _ratio(inter, rz["config"], nz["config"])
            pr = inter.get("paired", {}).get(f"{rz['config']}/{nz['config']}")
            if r is not None:
                text += (f"; step time with reuse / without: {r:.2f}x of the interleaved "
                         f"medians ({inter[rz['config']]['total']['median']:.0f} vs "
                         f"{inter[nz['config']]['total']['median']:.0f} ms; backward "
                         f"{inter[rz['config']]['backward']['median']:.0f} vs "
                         f"{inter[nz['config']]['backward']['median']:.0f} ms)")
                if pr:
                    text += (f", {pr['median']:.2f}x paired per round (p10-p90 "
                             f"{pr['p10']:.2f}-{pr['p90']:.2f}; reuse faster in "
                             f"{pr['below_1']} of {pr['rounds']} rounds)")
            out.append(text + ".")
        checks = []
        for z in zs:
            st = z["stage3_settings"]
            inflight_ok = max(z["max_inflight_seen"]) <= st["stage3_max_inflight_gathers"]
            live_ok = max(z["peak_gathered_numel"]) <= st["stage3_max_live_parameters"]
            reg_eq = all(p * b == r for p, r in zip(z["peak_gathered_numel"],
                                                    z["gathered_peak_bytes"]))
            end_ok = (all(v == 0 for v in z["gathered_numel_end"])
                      and all(v == 0 for v in z["gathered_param_current_end"]))
            checks.append(
                f"{z['config']}: in flight ≤ {_pair(z['max_inflight_seen'], str)} (bound "
                f"{st['stage3_max_inflight_gathers']}, {'held' if inflight_ok else 'EXCEEDED'}), "
                f"peak gathered {max(z['peak_gathered_numel']):,} elements (live bound "
                f"{st['stage3_max_live_parameters']:,}, {'held' if live_ok else 'EXCEEDED'}; "
                f"registry peak {'=' if reg_eq else '≠'} elements × b), "
                f"{'nothing' if end_ok else 'SOMETHING'} gathered after the last step")
        out.append(f"* **Schedule bounds, {precision}**: " + "; ".join(checks) + ".")
    parity = []
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        for k in ZERO_KINDS:
            z = by.get(f"{k}-{precision}")
            if z and f:
                worst = max(abs(x - y) for x, y in zip(z["losses_rank0"], f["losses_rank0"]))
                parity.append(f"{z['config']} vs {f['config']} {worst:.1e}")
    drift = []
    for kind in ZERO_KINDS + ("fsdp2",):
        lo, hi = by.get(f"{kind}-fp32"), by.get(f"{kind}-bf16")
        if lo and hi:
            worst = max(abs(x - y) for x, y in zip(lo["losses_rank0"], hi["losses_rank0"]))
            drift.append(f"{kind} {worst:.1e}")
    gn_parts = []
    for precision in ("fp32", "bf16"):
        f = by.get(f"fsdp2-{precision}")
        z = next((by[f"{k}-{precision}"] for k in ZERO_KINDS if f"{k}-{precision}" in by), None)
        if f and z and f.get("grad_norms_rank0") and z.get("grad_norms_rank0"):
            pairs = [(a, c) for a, c in zip(z["grad_norms_rank0"][:3], f["grad_norms_rank0"][:3])
                     if a and c]
            if pairs:
                rel = max(abs(a - c) / c for a, c in pairs)
                gn_parts.append(f"{z['config']} vs {f['config']} {rel:.1e}")
    gn_text = ("Pre-clipping gradient norms of the first 3 steps, largest relative "
               "difference: " + ", ".join(gn_parts) + " (neither side mis-scales "
               "gradients). ") if gn_parts else ""
    if parity:
        n = len(next(iter(by.values()))["losses_rank0"])
        out.append(
            f"* **Parity** (largest rank-0 loss difference over the {n} steps of the isolated "
            f"runs, same data): " + ", ".join(parity) + ". bf16 vs fp32 of the same framework: "
            + ", ".join(drift) + ". fp32 agrees to float rounding. In bf16 the two recipes "
            "round in different places (zero keeps bf16 parameters and gradients and "
            "clips on them; FSDP2 keeps fp32 shards and casts to bf16 for the all-gather, "
            "casting the bf16-reduced gradient back to fp32), and at this loss level (≈ "
            "ln(vocab), the model has barely started to learn) per-step noise dominates, so "
            "the bf16 trajectories part after a few steps. " + gn_text + "Whether one bf16 "
            "recipe trains better cannot be read from "
            "these few steps (run e.g. `--steps 40 --warmup 0 --interleaved-steps 0 "
            "--no-profile --configs zero3pf-bf16,fsdp2-bf16,fsdp2-fp32` to follow the trend).")
    out.append(
        "* **Where the time goes (mechanisms from the sources, not separately measured)**: in "
        "the optimizer step zero's AdamW is a handful of ATen ops over each flat shard, while "
        "torch.optim.AdamW on CPU uses its per-parameter loop (foreach kernels are defaulted "
        "only on CUDA-like devices) over every DTensor parameter, each op going through "
        "DTensor dispatch. In forward/backward FSDP2 runs its Python hooks, DTensor wrapping "
        "and per-group copy-in/copy-out of flat all-gather and reduce-scatter buffers; zero "
        "copies each gradient into its unit's bucket, issues one fingerprint all-gather per "
        "unit event, and reduces the persistent parameters on a separate stage-1 path. On "
        "gloo every collective is a CPU-side copy plus a TCP round trip between the two "
        "processes, and the reduce-scatter is emulated, so the communication share of these "
        "times is not what a GPU interconnect would show.")
    return out


def render_markdown(summaries, interleaved, facts, args, command, wall_s):
    ok = [s for s in summaries if "error" not in s]
    by = {s["config"]: s for s in ok}
    numel = ok[0]["numel"] if ok else 0
    inter = (interleaved or {}).get("summary") or {}
    lines = [
        "# zero stage 3 vs PyTorch FSDP2 (world size 2, gloo, CPU)",
        "",
        f"Generated by `benchmarks/bench_fsdp2.py` on {facts['date']}; whole run {wall_s:.0f} s.",
        "",
        "```",
        command,
        "```",
        "",
        f"Model: TinyGPT(vocab={args.vocab}, block={args.block}, n_layer={args.n_layer}, "
        f"n_head={args.n_head}, n_embd={args.n_embd}), tied embeddings, Ψ = {numel:,} "
        f"parameters ({ok[0]['root_numel']:,} in the root unit -- embeddings, tied head, "
        f"final norm -- and {ok[0]['blocks_numel'] // max(1, args.n_layer):,} per block)."
        if ok else "",
        "",
        f"Micro-batch {args.micro_batch} x {args.block} tokens per rank, "
        f"gradient_accumulation_steps 1, AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, "
        f"wd 0.01), gradient clipping {args.clip}, {args.threads} torch thread(s) per rank. "
        f"zero: stage 3, stage3_param_persistence_threshold={args.persistence_threshold}, "
        f"reduce_bucket_size={args.bucket_numel:,}, overlap_comm default (true at stage 3); "
        f"`zero3` = the engine's other stage-3 defaults (stage3_prefetch_bucket_size 5e7, "
        f"stage3_max_reuse_distance 1e9, stage3_max_live_parameters 1e9, "
        f"stage3_max_inflight_gathers 2), `zero3-noreuse` = the same with "
        f"stage3_max_reuse_distance 0, `zero3pf` = stage3_max_reuse_distance 0 and "
        f"stage3_prefetch_bucket_size = one block "
        f"({args.prefetch_numel or (ok[0]['blocks_numel'] // max(1, args.n_layer) if ok else 0):,}"
        f" elements). "
        f"FSDP2: `fully_shard` on each block then on the root, default reshard_after_forward, "
        f"`torch.optim.AdamW` (default implementation), `clip_grad_norm_`, "
        f"`zero_grad()` after the step. Isolated runs: {args.warmup} warm-up + {args.steps} "
        f"measured steps (+1 profiled step) per configuration in fresh processes; interleaved "
        f"run: {args.warmup} warm-up + {args.interleaved_steps} measured steps per "
        f"configuration, round-robin in one pair of processes.",
        "",
        "**bf16** means: zero = DeepSpeed bf16 (bf16 params/grads, fp32 master + Adam state); "
        "FSDP2 = `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16)` (fp32 "
        "sharded params/grads/AdamW, bf16 all-gather, compute and reduce-scatter).",
        "",
        "## Summary (per rank; MiB; rank 0 / rank 1 where they differ)",
        "",
        "| config | step ms interleaved median (p10) | step ms isolated median (p10) | "
        "model states measured | model-state formula | gathered params peak | buckets "
        "(kept) | working set peak | released params still held by autograd after forward | "
        "step peak (profiler) | RSS peak | sent / step | sent / 3Ψ·b |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: |",
    ]
    for s in summaries:
        if "error" in s:
            first = s["error"].strip().splitlines()[-1][:300]
            lines.append(f"| {s['config']} | FAILED: {first} | | | | | | | | | | | |")
            continue
        it = inter.get(s["config"])
        cell = (f"{it['total']['median']:.0f} ({it['total']['p10']:.0f})"
                if isinstance(it, dict) and "total" in it else "-")
        prof = s.get("profiled")
        lines.append(
            f"| {s['config']} | {cell} | {s['step_ms_median']:.0f} ({s['step_ms_p10']:.0f}) | "
            f"{_pair(s['model_state_bytes'])} | {s['model_state_formula']} = "
            f"{_mib(s['model_state_expected_bytes'])} | {_pair(s['gathered_peak_bytes'])} | "
            f"{_pair(s['bucket_bytes'])} | {_pair(s['working_set_bytes'])} | "
            f"{_pair(prof['autograd_held_param_bytes']) if prof else '-'} | "
            f"{_pair(prof['step_peak_bytes']) if prof else '-'} | {_pair(s['rss_peak_bytes'])} | "
            f"{_mib(s['comm_bytes_per_step'])} | "
            f"{s['comm_bytes_per_step'] / s['paper_3psi_b_bytes']:.4f} |")
    lines += [
        "",
        "*Columns.* *model states*: zero = its accounting registry (param + gradient + "
        "fp32_master + optimizer_state) beside the engine's own formula on its padded Ψ "
        "(\"persistent\" terms: parameters ≤ the persistence threshold, kept whole); FSDP2 = "
        "distinct storages of the local shards of the DTensor params, grads and AdamW state "
        "after optimizer.step(), beside 16Ψ/N. *gathered params peak*: zero's registry "
        "`gathered_param` peak; FSDP2's unsharded parameter storages alive at once (sampled at "
        "its unshard / post-backward / reduce-scatter points). *buckets (kept)*: zero's "
        "reduce-scatter bucket pool, peak after warm-up (see the findings for what stays "
        "allocated between steps and the warm-up peak); FSDP2 keeps none. "
        "*working set peak*: zero = gathered peak + buckets (its registry's view); FSDP2 = "
        "peak of unsharded params + the flat all-gather outputs and reduce-scatter inputs "
        "still referenced (sampled). *released params still held by autograd*: parameter "
        "storages that autograd saved during forward and that no module parameter uses any "
        "more at the end of forward (i.e. the framework released them), summed at their size "
        "then (FSDP2 frees by resizing the storage to 0; see the findings). *step peak*: "
        "bytes owned at the start of one extra step + the peak of the live bytes allocated "
        "during it (torch.profiler CPU allocation events: activations, gathered params, grads, "
        "temporaries). *sent / step*: paper convention (all-gather and reduce-scatter of a "
        "B-byte full buffer = B, all-reduce = 2B); 3Ψ·b with the unpadded Ψ and b = bytes of "
        "the communicated dtype.",
        "",
        "## Step time by phase (ms, interleaved medians; slower rank per step)",
        "",
        "| config | total median | p10 | forward | backward | step (FSDP2: clip + AdamW + "
        "zero_grad) | / FSDP2, paired per round: median (p10-p90) | isolated fwd / bwd / step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | | |")
            continue
        it = inter.get(s["config"])
        iso = " / ".join(f"{s['phase_ms_median'][k]:.0f}" for k in ("forward", "backward", "step"))
        pr = inter.get("paired", {}).get(f"{s['config']}/fsdp2-{s['precision']}")
        pr_cell = (f"{pr['median']:.2f} ({pr['p10']:.2f}-{pr['p90']:.2f})" if pr else "-")
        if isinstance(it, dict) and "total" in it:
            lines.append(f"| {s['config']} | {it['total']['median']:.0f} | "
                         f"{it['total']['p10']:.0f} | {it['forward']['median']:.0f} | "
                         f"{it['backward']['median']:.0f} | {it['step']['median']:.0f} | "
                         f"{pr_cell} | {iso} |")
        else:
            err = (it or {}).get("error", "not run") if isinstance(it, dict) else "not run"
            lines.append(f"| {s['config']} | - ({str(err).strip().splitlines()[-1][:120]}) "
                         f"| | | | | | {iso} |")
    if interleaved and "error" in interleaved:
        lines += ["", f"Interleaved run FAILED: "
                  f"{interleaved['error'].strip().splitlines()[-1]}"]
    lines += [
        "",
        "## Bytes sent per step (MiB, rank 0, paper convention)",
        "",
        "| config | measured total | by op (measured) | predicted by the mechanism | "
        "3Ψ·b | measured − 3Ψ·b (bytes) | calls / step |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['config']} | FAILED | | | | | |")
            continue
        by_op = ", ".join(f"{k.replace('_bytes', '')} {_mib(v)}"
                          for k, v in s["comm_bytes_per_step_by_op"].items() if v)
        pred = "; ".join(f"{k}: {_mib(v)}" for k, v in s["comm_predicted"].items())
        lines.append(
            f"| {s['config']} | {_mib(s['comm_bytes_per_step'])} | {by_op} | {pred} "
            f"(sum {_mib(sum(s['comm_predicted'].values()))}) | "
            f"{_mib(s['paper_3psi_b_bytes'])} | "
            f"{s['comm_bytes_per_step'] - s['paper_3psi_b_bytes']:+,.0f} | "
            f"{s['comm_calls_per_step']:.0f} |")
    zs_ok = [s for s in ok if s["kind"] in ZERO_KINDS]
    if zs_ok:
        lines += [
            "",
            "## zero's gather schedule (rank 0 per measured step; bounds over the whole run)",
            "",
            "| config | prefetch bound (elements) | reuse distance | in-flight bound | "
            "live bound | unit all-gathers / step (2U − reuses) | reuses / step | "
            "prefetches / step | kept gathered at the end of forward (MiB) | most all-gathers "
            "in flight seen | peak gathered elements (× b, MiB) | registry gathered peak "
            "(MiB) | gathered at the end |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |",
        ]
        for z in zs_ok:
            st, ps, b = z["stage3_settings"], z["schedule_per_step"], z["param_bytes_b"]
            kept = z["kept_after_forward_numel"]
            kept_cell = (_mib(kept["mean"] * b) if kept["min"] == kept["max"] else
                         f"{_mib(kept['min'] * b)}..{_mib(kept['max'] * b)} "
                         f"(mean {_mib(kept['mean'] * b)})")
            lines.append(
                f"| {z['config']} | {st['stage3_prefetch_bucket_size']:,} | "
                f"{st['stage3_max_reuse_distance']:,} | {st['stage3_max_inflight_gathers']} | "
                f"{st['stage3_max_live_parameters']:,} | {ps['gathers']:.1f} "
                f"({2 * z['units'] - ps['reuses']:.1f}) | {ps['reuses']:.1f} | "
                f"{ps['prefetches']:.1f} | {kept_cell} | {_pair(z['max_inflight_seen'], str)} | "
                f"{_pair(z['peak_gathered_numel'], lambda v: f'{v:,}')} "
                f"({_pair([v * b for v in z['peak_gathered_numel']])}) | "
                f"{_pair(z['gathered_peak_bytes'])} | "
                f"{_pair(z['gathered_numel_end'], str)} elements, registry "
                f"{_pair(z['gathered_param_current_end'])} MiB |")
        lines += [
            "",
            f"U = {zs_ok[0]['units']} gather units (6 blocks + the root). *most all-gathers in "
            "flight seen*: the schedule's own counter, read right after each prefetch starts "
            "one. *peak gathered elements*: the schedule's counter since the engine was built "
            "(warm-up included); the registry peak is reset after warm-up. *kept gathered at "
            "the end of forward*: the schedule's gathered elements when forward returns "
            "(units it keeps for their backward under the reuse distance).",
        ]
    lines += [
        "",
        "## Memory detail (rank 0, MiB)",
        "",
    ]
    for s in ok:
        if s["kind"] in ZERO_KINDS:
            cats = []
            for cat in ("param", "gradient", "fp32_master", "optimizer_state",
                        "gathered_param", "bucket"):
                c = s["categories"].get(cat)
                if not c:
                    continue
                exp = (f", formula {_mib(c['expected'])} ({c['formula']})"
                       if c.get("expected") is not None else "")
                cats.append(f"{cat} {_mib(c['current'])} now / {_mib(c['peak'])} peak{exp}")
            lines.append(f"* **{s['config']}** (Ψ3 padded = {s['padded_numel']:,} partitioned, "
                         f"Ψp = {s['persistent_numel']:,} persistent): " + "; ".join(cats) +
                         f"; engine total peak {_pair(s['engine_total_peak_bytes'])}.")
        else:
            bd = s["breakdown"]
            cb = s["comm_buffer_peak_bytes"]
            lines.append(
                f"* **{s['config']}**: params {_pair(bd['param_bytes'])}, grads "
                f"{_pair(bd['grad_bytes'])}, AdamW state {_pair(bd['optimizer_state_bytes'])} "
                f"(storages; logical shard bytes {_pair(bd['param_logical_bytes'])} / "
                f"{_pair(bd['grad_logical_bytes'])} / "
                f"{_pair(bd['optimizer_state_logical_bytes'])}); largest flat all-gather "
                f"output {_pair(cb['all_gather_flat_output'])}, largest reduce-scatter input + "
                f"output {_pair(cb['reduce_scatter_in_plus_out'])}; parameter groups: "
                + ", ".join(f"{g['module']} ({g['numel']:,} local elements)"
                            for g in s["fsdp_param_groups"]) + ".")
        prof = s.get("profiled")
        if prof:
            lines.append(f"  profiled step: owned at start {_pair(prof['owned_at_start_bytes'])}"
                         f", transient peak {_pair(prof['transient_peak_bytes'])}, step peak "
                         f"{_pair(prof['step_peak_bytes'])}, live at the end "
                         f"{_pair(prof['live_at_end_bytes'])}; RSS start "
                         f"{_pair(s['rss_start_bytes'])}, RSS peak {_pair(s['rss_peak_bytes'])}.")
    lines += ["", "## Loss (rank 0, every step of the isolated run)", "",
              "| config | losses |", "| --- | --- |"]
    for s in ok:
        lines.append(f"| {s['config']} | " + " ".join(f"{x:.5f}" for x in s["losses_rank0"])
                     + " |")
    failed = [s for s in summaries if "error" in s]
    if failed:
        lines += ["", "## Failures", ""]
        for s in failed:
            lines += [f"**{s['config']}**:", "", "```", s["error"].strip()[-3000:], "```", ""]
    lines += findings(by, inter, args)
    lines += ["", "## Machine", "", "```", f"$ nproc\n{facts['nproc']}", "$ lscpu | head -20",
              facts["lscpu_head"], "$ free -g", facts["free_g"], "```", "",
              f"torch {facts['torch']}, Python {facts['python']}, {facts['platform']}. "
              f"/proc/loadavg at start: `{facts['loadavg_start']}`, at end: "
              f"`{facts['loadavg_end']}`; 1-minute load sampled every 5 s during the run: "
              f"{facts.get('loadavg_samples_text', 'not sampled')} (above 2 means other "
              f"processes shared the 2 cores; the interleaved timings are the ones to compare).",
              "",
              f"Engine under test: `{facts['zero_root']}` at commit {facts['zero_commit']}"
              + (" (with uncommitted changes under zero/ or csrc/)"
                 if facts["zero_tree_dirty"] else "")
              + (f", extension `zero/_C*.so` sha256 {facts['zero_extension_sha256']}…"
                 if facts.get("zero_extension_sha256") else "") + "."
              + (f" The checkout `{ROOT}` was at {facts['checkout_commit']}"
                 + (", with uncommitted changes: `"
                    + " ".join(facts["checkout_dirty"].split()) + "`"
                    if facts["checkout_dirty"] else ", clean") + "."
                 if facts["zero_root"] != ROOT else ""), ""]
    return "\n".join(lines)


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
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.world_size)
    configs = list(dict.fromkeys(c.strip() for c in args.configs.split(",") if c.strip()))
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        sys.exit(f"unknown configs {unknown}; choose from {ALL_CONFIGS}")
    args.config_list = configs
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    if os.environ.get("ZERO_COMMIT"):
        command = f"ZERO_COMMIT={shlex.quote(os.environ['ZERO_COMMIT'])} " + command
    if ZERO_ROOT != ROOT:
        command = f"ZERO_ROOT={shlex.quote(ZERO_ROOT)} " + command
    t0 = time.perf_counter()
    loadavg_start = open("/proc/loadavg").read().strip()
    load_samples, sampling = [], threading.Event()

    def sample_load():
        while not sampling.wait(5.0):
            with open("/proc/loadavg") as f:
                load_samples.append(float(f.read().split()[0]))
    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_fsdp2_") as tmp:
        interleaved = None
        if args.interleaved_steps > 0:
            interleaved = _launch("interleaved", args, tmp)
            interleaved["summary"] = summarize_interleaved(interleaved)
            print(f"[interleaved] {json.dumps(interleaved['summary'], default=str)[:2000]}",
                  flush=True)
        for name in configs:
            result = _launch(name, args, tmp)
            results.append(result)
            if "error" in result:
                print(f"[{name}] FAILED after {result['wall_s']:.1f}s:\n{result['error']}",
                      flush=True)
            else:
                one = summarize(result, args)
                print(f"[{name}] step {one['step_ms_median']:.0f} ms  model states "
                      f"{_pair(one['model_state_bytes'])} MiB  working set "
                      f"{_pair(one['working_set_bytes'])} MiB  RSS peak "
                      f"{_pair(one['rss_peak_bytes'])} MiB  sent/step "
                      f"{_mib(one['comm_bytes_per_step'])} MiB  loss {one['loss_last']:.4f}  "
                      f"({result['wall_s']:.1f}s)", flush=True)
        summaries = [summarize(r, args) for r in results]
    wall = time.perf_counter() - t0
    sampling.set()
    sampler.join()
    facts = machine_facts()
    facts["loadavg_start"] = loadavg_start
    facts["loadavg_samples"] = load_samples
    if load_samples:
        facts["loadavg_samples_text"] = (
            f"min {min(load_samples):.2f}, median {statistics.median(load_samples):.2f}, max "
            f"{max(load_samples):.2f} over {len(load_samples)} samples")
    md = render_markdown(summaries, interleaved, facts, args, command, wall)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fsdp2_vs_zero3.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "fsdp2_vs_zero3.json"), "w") as f:
            json.dump({"command": command, "args": vars(args), "machine": facts,
                       "wall_s": wall, "summary": summaries, "interleaved": interleaved,
                       "raw": results}, f, indent=1)
        print(f"wrote {args.out}/fsdp2_vs_zero3.md and .json")
    return 0 if all("error" not in s for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
