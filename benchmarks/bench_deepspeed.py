"""zero against the real DeepSpeed 0.19.8 on this CPU machine, side by side, in one invocation.

    scripts/deepspeed_cpu.sh                              # once: build/ds-venv with DeepSpeed
    python benchmarks/bench_deepspeed.py                  # the full run
    python benchmarks/bench_deepspeed.py --interleaved-steps 3 --warmup 1 --steps 2 \
        --n-layer 2 --n-embd 64 --vocab 512 --out /tmp/bench_ds       # smoke test

World size 2 on gloo (CPU). The ranks are started by `python -m torch.distributed.run` from
build/ds-venv's Python (the system torch, DeepSpeed 0.19.8 installed there, this checkout's zero
on PYTHONPATH), with DS_ACCELERATOR=cpu; DeepSpeed's init_distributed creates the gloo group
and zero's initialize reuses it. Both engines get the same TinyGPT (seed 0), the same data (a
stream per rank) and the same DeepSpeed-format JSON config dict (benchmarks/models.py
engine_config: AdamW from the "optimizer" block, gradient clipping, one micro-batch per step),
a fresh deep copy each: `zero.initialize(config=...)` and `deepspeed.initialize(config=...)`.
DeepSpeed picks its own AdamW implementation for CPU from that block (the CPU accelerator's
FusedAdam without offload, DeepSpeedCPUAdam with offload_optimizer); the report names it.

Two kinds of runs:

* timing (interleaved): ONE pair of ranks holds a zero engine and a DeepSpeed engine for every
  configuration and steps them round-robin (engine A step i, engine B step i, ..., the order
  rotated every round), so load from other processes hits every engine alike. Step time: wall
  time of forward + engine.backward + engine.step on a rank, the slower rank per step; median
  and p10 over the measured steps (after --warmup). Every step's loss is recorded (both ranks).
  --per-config runs one torch.distributed.run per configuration instead (its two engines still
  interleaved), for when holding everything in one process is too heavy. DeepSpeed's stage 3
  replaces torch.nn.functional.linear process-wide when built; every engine steps with the
  F.linear it would have alone (see _interleaved).
* memory (isolated): short runs (--steps steps; --memory-repeats of them, each rank's median
  reported) per configuration and engine, each alone in a
  fresh pair of ranks that imported both libraries and joined the process group, after a
  throwaway engine of the same kind and config on a 1-layer TinyGPT paid the one-time costs
  (DeepSpeed's first initialize imports ~110 MiB: torch._dynamo among others). Peak memory
  growth = the kernel's peak RSS (VmHWM, reset just before) minus the RSS just before the model
  and the engine are built, per rank; beside it the same for the anonymous RSS (RssAnon sampled
  every 2 ms: heap and tensors, not the pages of mapped files such as DeepSpeed's JIT-built
  ops). Torch's CPU allocator keeps no statistics, and DeepSpeed's CPU accelerator reports the
  process RSS as its "memory allocated", so RSS is the one measure both engines share; zero's
  own accounting (model-state bytes of its registry) is shown beside it. The losses of these
  runs, each engine alone in its process, are compared with the interleaved run's: equal means
  the two engines in one process did not disturb each other.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.cli import (add_comparison_args, add_model_args, add_run_args,  # noqa: E402
                            settle)
from benchmarks.launch import free_port, outcome, run_worker  # noqa: E402
from benchmarks.models import (count_params, engine_config, gpt_config,  # noqa: E402
                               rank_batches, seeded_model)
from benchmarks.report import (engine_under_test, header, last_line, machine_section,  # noqa: E402
                               markdown_table, mib, pair, publish)
from benchmarks.timing import engine_step, interleave_steps, step_stats  # noqa: E402

DS_VERSION = "0.19.8"
ENGINES = ("zero", "deepspeed")
ALL_CONFIGS = ["stage1-fp32", "stage2-fp32", "stage3-fp32",
               "stage1-bf16", "stage2-bf16", "stage3-bf16", "stage2-offload-bf16",
               "stage3-lora-bf16", "stage2-bf16master-bf16", "stage3-bf16master-bf16",
               "stage1-fp32accum-bf16", "stage2-fp32accum-bf16", "stage3-fp32accum-bf16",
               "stage1-muon-fp32", "stage2-muon-fp32", "stage3-muon-fp32"]
# "muon": DeepSpeed's Muon type (the matrices; Adam at adam_lr for the rest)
MUON = {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 1e-3, "weight_decay": 0.01}}
DEFAULT_PYTHON = os.path.join(ROOT, "build", "ds-venv", "bin", "python")
PHASES = ("forward", "backward", "step")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, steps=4, steps_help="training steps of each isolated memory run (0 skips "
                 "the memory runs)", warmup=5, interleaved_steps=30)
    add_model_args(p, micro_batch=4, vocab=4096, n_layer=4, n_embd=256)
    p.add_argument("--bucket-numel", type=int, default=500_000,
                   help="reduce_bucket_size (elements) of the shared config")
    add_comparison_args(p, ALL_CONFIGS)
    p.add_argument("--memory-repeats", type=int, default=3,
                   help="isolated memory runs per configuration and engine (the report shows "
                        "each rank's median; RSS moves by several MiB from run to run)")
    p.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                   help="the memory runs' glibc MALLOC_MMAP_THRESHOLD_: blocks of at least this "
                        "size are mmapped and go back to the kernel when freed, so RSS follows "
                        "the live bytes instead of what malloc keeps (default: glibc's own, "
                        "which raises the threshold as large blocks are freed)")
    p.add_argument("--per-config", action="store_true",
                   help="one torch.distributed.run per configuration for the timing run (its "
                        "zero and DeepSpeed engines still interleaved) instead of one for all")
    p.add_argument("--python", default=DEFAULT_PYTHON,
                   help="the interpreter that runs the ranks (scripts/deepspeed_cpu.sh makes it)")
    p.add_argument("--launch-timeout", type=float, default=3600,
                   help="seconds one torch.distributed.run may take before it is killed")
    p.add_argument("--collective-timeout", type=float, default=600,
                   help="gloo timeout (s): a rank left waiting in a collective fails after it")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="directory for deepspeed_vs_zero.md / .json ('' to write nothing)")
    # the ranks: this script again, under torch.distributed.run
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def shared_config(name: str, args) -> dict:
    """The one DeepSpeed-format config both engines get: stageN, fp32 or bf16, optionally the
    optimizer offloaded to the CPU (ZeRO-Offload) or, "bf16master", DeepSpeed's low-precision
    master (bf16_master_weights_and_grads and bf16_optimizer_states, as its bf16_full.json
    example), or "fp32accum", gradients accumulated in fp32 (data_types.grad_accum_dtype, as
    Megatron-DeepSpeed's bf16 configs; DeepSpeed's stage 1 then runs its BF16_Optimizer), or
    "muon", DeepSpeed's Muon type instead of AdamW (at stage 3 with reduce_scatter false,
    which DeepSpeed requires of it). ("lora" changes the model: config_model.)"""
    parts = name.split("-")
    zero_optimization = {"stage": int(parts[0][len("stage"):]),
                         "reduce_bucket_size": args.bucket_numel, "overlap_comm": True}
    if "offload" in parts:
        zero_optimization["offload_optimizer"] = {"device": "cpu"}
    config = engine_config(args.micro_batch, args.clip, zero_optimization,
                           bf16=parts[-1] == "bf16")
    if "bf16master" in parts:
        config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    if "fp32accum" in parts:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if "muon" in parts:
        config["optimizer"] = copy.deepcopy(MUON)
        if zero_optimization["stage"] == 3:
            zero_optimization["reduce_scatter"] = False
    return config


def config_model(name: str, gpt):
    """The model a configuration trains: the seeded TinyGPT, with "lora" frozen but for its
    LoRA adapters (the base model then partitioned at stage 3 without optimizer state)."""
    return seeded_model(gpt, lora="lora" in name.split("-"))


# ---- the ranks -------------------------------------------------------------------------------
def _qualname(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _build(engine_name: str, config: dict, model):
    """(engine, what it is) for one engine on a fresh copy of the shared config."""
    config = copy.deepcopy(config)
    if engine_name == "zero":
        import zero

        engine, optimizer, _, _ = zero.initialize(model=model, config=config)
        spec = optimizer.spec
        return engine, {"engine": _qualname(engine), "optimizer_wrapper": _qualname(optimizer),
                        "optimizer": f"zero's C++ {spec.kind} update on each rank's shard "
                                     f"(EngineCore.step), decoupled weight decay "
                                     f"{spec.decoupled_weight_decay}"}
    import deepspeed

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                   model_parameters=model.parameters())
    basic = getattr(engine, "basic_optimizer", None)
    info = {"engine": _qualname(engine), "optimizer_wrapper": _qualname(optimizer),
            "optimizer": _qualname(basic) if basic is not None else None,
            "zero_stage": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled()}
    if basic is not None and hasattr(basic, "adam_w_mode"):
        info["adam_w_mode"] = bool(basic.adam_w_mode)
    return engine, info


def _recording(step, losses: list):
    """step(tokens, targets) that also keeps every loss (warm-up steps included)."""
    def run(tokens, targets):
        loss, phases = step(tokens, targets)
        losses.append(loss)
        return loss, phases
    return run


def _agree_on_failures(failed: dict) -> None:
    """Every rank leaves out what failed on any rank (a rank stepping an engine the other
    rank dropped would wait in its collectives)."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(failed))
    for names in everyone:
        for name in names:
            failed.setdefault(name, "failed on another rank")


def _own_linear(step, linear):
    """step run with torch.nn.functional.linear set to `linear` (the function its engine found
    or installed), put back to the original afterwards."""
    import torch.nn.functional as F

    def run(tokens, targets):
        original, F.linear = F.linear, linear
        try:
            return step(tokens, targets)
        finally:
            F.linear = original
    return run


def _interleaved(rank, args) -> dict:
    """A zero and a DeepSpeed engine per configuration, all in this process, stepped
    round-robin; per engine ("stage2-bf16/zero") the step times and every loss.

    DeepSpeed's stage 3 (zero_optimization.memory_efficient_linear, default true, the only value
    zero accepts) replaces torch.nn.functional.linear for the whole process, for good, when its
    engine is built. Left alone, every engine stepped after that, zero's included, would run its
    forward through DeepSpeed's linear. So each engine steps with the F.linear it would have
    alone: the one in place before any engine (zero), or the one its own initialize left
    (DeepSpeed), swapped in around its step."""
    import torch.nn.functional as F

    original_linear = F.linear
    gpt = gpt_config(args)
    batches = rank_batches(gpt, args.micro_batch, args.warmup + args.interleaved_steps, rank)
    steps, losses, info, failed = {}, {}, {}, {}
    for config_name in args.config_list:
        config = shared_config(config_name, args)
        for engine_name in ENGINES:
            key = f"{config_name}/{engine_name}"
            try:
                engine, info[key] = _build(engine_name, config, config_model(config_name, gpt))
            except Exception:  # noqa: BLE001 -- the table shows the failure
                failed[key] = traceback.format_exc()
                print(f"[rank {rank}] {key} failed to build:\n{failed[key]}", flush=True)
                continue
            finally:
                linear, F.linear = F.linear, original_linear
            info[key]["replaced_F_linear"] = linear is not original_linear
            losses[key] = []
            step = _own_linear(lambda t, y, engine=engine: engine_step(engine, t, y), linear)
            steps[key] = _recording(step, losses[key])
    _agree_on_failures(failed)
    steps = {key: step for key, step in steps.items() if key not in failed}
    times = interleave_steps(steps, batches, args.warmup, failed)
    return {"rank": rank, "step_times": times, "losses": losses, "info": info, "errors": failed,
            "numel": count_params(seeded_model(gpt))}


def _destroy(engine) -> None:
    if hasattr(engine, "destroy"):
        engine.destroy()


def _throwaway(engine_name: str, config: dict, args, rank: int) -> None:
    """Builds and trains (2 steps) an engine of the same kind and config on a 1-layer TinyGPT
    of width 2 * n_head, then drops it: the one-time costs (lazy imports, JIT-built ops loaded,
    thread pools) are paid before the memory run's baseline."""
    gpt = gpt_config({**vars(args), "vocab": 64, "block": 16, "n_layer": 1,
                      "n_embd": 2 * args.n_head})
    engine, _ = _build(engine_name, config, seeded_model(gpt))
    for tokens, targets in rank_batches(gpt, args.micro_batch, 2, rank):
        engine_step(engine, tokens, targets)
    _destroy(engine)
    del engine
    gc.collect()


def _memory(rank, args) -> dict:
    """One engine alone: peak RSS growth over building it and training --steps steps, after a
    throwaway engine of the same kind paid the one-time costs; each phase's peak (the last
    step's forward, backward and step), what stays between steps and after the engine is gone."""
    from benchmarks.memory import AnonPeak, PhasePeaks, reset_peak_rss, rss_anon, rss_now

    config_name, engine_name = args.worker.split(":", 1)[1].split("/")
    gpt = gpt_config(args)
    batches = rank_batches(gpt, args.micro_batch, args.steps, rank)
    config = shared_config(config_name, args)
    out = {"rank": rank, "losses": [], "rss_at_start_bytes": rss_now(),
           "anon_at_start_bytes": rss_anon()}
    modules = set(sys.modules)
    try:
        _throwaway(engine_name, config, args, rank)
        out["one_time_anon_bytes"] = rss_anon() - out["anon_at_start_bytes"]
        # what the first engine imported (packages two levels deep): where one-time costs lie
        out["one_time_new_modules"] = sorted({".".join(m.split(".")[:2])
                                              for m in set(sys.modules) - modules})[:80]
        out.update(rss_before_bytes=rss_now(), anon_before_bytes=rss_anon(),
                   peak_reset=reset_peak_rss())
        phases = PhasePeaks(out["rss_before_bytes"])
        with AnonPeak() as anon:
            engine, out["info"] = _build(engine_name, config, config_model(config_name, gpt))
            phases.mark("build")
            for tokens, targets in batches:
                out["losses"].append(engine_step(engine, tokens, targets,
                                                 on_lap=phases.mark)[0])
    except Exception:  # noqa: BLE001 -- the table shows the failure
        out["error"] = traceback.format_exc()
        print(f"[rank {rank}] {args.worker} failed:\n{out['error']}", flush=True)
        return out
    out["rss_growth_bytes"] = phases.highest
    out["rss_peak_bytes"] = out["rss_before_bytes"] + phases.highest
    out["anon_peak_bytes"] = anon.peak
    out["anon_growth_bytes"] = out["anon_peak_bytes"] - out["anon_before_bytes"]
    out.update({f"{phase}_peak_bytes": p["peak"] for phase, p in phases.phases.items()})
    out["held_between_steps_bytes"] = phases.phases["step"]["end"]
    if engine_name == "zero":
        report = engine.memory_report()
        out["zero_accounting"] = {"model_state_bytes": report["model_state_bytes"],
                                  "model_state_expected_bytes":
                                      report["model_state_expected_bytes"],
                                  "registry_total": report["total"]}
    _destroy(engine)
    del engine
    gc.collect()
    out["left_after_destroy_bytes"] = rss_now() - out["rss_before_bytes"]
    return out


def _runtime_facts() -> dict:
    """What the ranks ran: DeepSpeed's version, file and accelerator, zero's file, torch."""
    import deepspeed
    import torch
    import zero
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    return {"deepspeed_version": deepspeed.__version__, "deepspeed_file": deepspeed.__file__,
            "deepspeed_accelerator": accelerator.device_name(),
            "deepspeed_accelerator_class": _qualname(accelerator),
            "deepspeed_comm_backend": accelerator.communication_backend_name(),
            "process_group_backend": str(torch.distributed.get_backend()),
            "zero_file": zero.__file__, "torch": torch.__version__, "torch_file": torch.__file__,
            "python": sys.executable, "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
            "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "unset")}


def worker_main(args) -> int:
    """One rank under torch.distributed.run; rank 0 writes every rank's result to --result."""
    import torch

    torch.set_num_threads(args.threads)
    import deepspeed
    import torch.distributed as dist

    deepspeed.utils.logger.setLevel(logging.WARNING)  # its config dump and per-10-step lines
    # torch 2.13 deprecates the collectives DeepSpeed calls (all_gather_into_tensor, ...): the
    # warning comes once per call otherwise
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*is deprecated\. Please use")
    deepspeed.init_distributed(dist_backend="gloo",
                               timeout=datetime.timedelta(seconds=args.collective_timeout))
    import zero  # noqa: F401 -- after DeepSpeed made the group: zero.initialize reuses it

    rank = dist.get_rank()
    try:
        out = _interleaved(rank, args) if args.worker == "interleaved" else _memory(rank, args)
    except Exception:  # noqa: BLE001 -- reported by rank 0 as this rank's error
        out = {"rank": rank, "error": traceback.format_exc()}
        print(f"[rank {rank}] {args.worker} failed:\n{out['error']}", flush=True)
    everyone = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(out, everyone, dst=0)
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"ranks": everyone, "runtime": _runtime_facts()}, f)
    dist.destroy_process_group()
    return 0


# ---- the parent: launching the ranks -----------------------------------------------------------
def _launch(name: str, args, extra: list[str], env_extra: dict | None = None) -> dict:
    """One torch.distributed.run of this script with --worker ... (extra) and env_extra in
    its environment; its ranks' results or why there are none."""
    command = [args.python, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(args.world_size), "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), os.path.abspath(__file__), *args.argv, *extra]
    path = [ZERO_ROOT, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(args.threads),
               PYTHONPATH=os.pathsep.join(dict.fromkeys(path)), **(env_extra or {}))
    print(f"[{name}] starting {args.world_size} ranks", flush=True)
    t0 = time.perf_counter()
    try:
        result, proc = run_worker(command, "--result", env, timeout=args.launch_timeout)
    except subprocess.TimeoutExpired:
        return outcome(name, t0,
                       error=f"torch.distributed.run killed after {args.launch_timeout:.0f} s")
    if result is None:
        return outcome(name, t0, error=f"torch.distributed.run exited {proc.returncode} without "
                                       "a result (its output is above)")
    errors = [r["error"] for r in result["ranks"] if "error" in r]
    done = outcome(name, t0, result["ranks"], errors[0] if errors else None)
    done["runtime"] = result["runtime"]
    print(f"[{name}] done in {done['wall_s']:.1f} s"
          + (f": FAILED {last_line(done['error'])}" if "error" in done else ""), flush=True)
    return done


def _timing_runs(args) -> list[dict]:
    if args.interleaved_steps <= 0:
        return []
    if not args.per_config:
        return [_launch("interleaved", args, ["--worker", "interleaved"])]
    return [_launch(f"interleaved {c}", args, ["--worker", "interleaved", "--configs", c])
            for c in args.config_list]


def _memory_runs(args) -> dict:
    """{key: [one launch per repeat]}; the repeats go round the configurations and engines,
    so drift in the machine's state reaches every engine alike."""
    runs = {}
    if args.steps <= 0:
        return runs
    env = {} if args.mmap_threshold is None else {
        "MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)}
    for repeat in range(args.memory_repeats):
        for config_name in args.config_list:
            for engine_name in ENGINES:
                key = f"{config_name}/{engine_name}"
                runs.setdefault(key, []).append(_launch(
                    f"memory {key} #{repeat + 1}", args, ["--worker", f"memory:{key}"], env))
    return runs


PHASE_FIELDS = ("build_peak_bytes", "forward_peak_bytes", "backward_peak_bytes", "step_peak_bytes",
                "held_between_steps_bytes", "left_after_destroy_bytes")
MEMORY_FIELDS = ("rss_at_start_bytes", "one_time_anon_bytes", "rss_before_bytes", "rss_peak_bytes",
                 "rss_growth_bytes", "anon_before_bytes", "anon_peak_bytes", "anon_growth_bytes",
                 *PHASE_FIELDS)


def _memory_summary(repeats: list[dict]) -> dict:
    """Each rank's median over the repeats, field by field, and every repeat's growth."""
    errors = [run["error"] for run in repeats if "error" in run]
    if errors:
        return {"memory_error": errors[0]}
    ranks = [run["ranks"] for run in repeats]
    memory = {k: [statistics.median(run[r][k] for run in ranks) for r in range(len(ranks[0]))]
              for k in MEMORY_FIELDS}
    memory["peak_reset"] = [all(run[r]["peak_reset"] for run in ranks)
                            for r in range(len(ranks[0]))]
    memory["rss_growth_repeats"] = [[rank["rss_growth_bytes"] for rank in run] for run in ranks]
    first = ranks[0]
    if "zero_accounting" in first[0]:
        memory["zero_accounting"] = [r["zero_accounting"] for r in first]
    return {"memory": memory, "memory_losses": [r["losses"] for r in first],
            "memory_info": first[0].get("info")}


# ---- numbers -----------------------------------------------------------------------------------
def _timing_for(key: str, timing: list[dict]):
    """(the ranks' results of the timing run that holds engine `key`, or None; its error)."""
    error = None
    for run in timing:
        ranks = run.get("ranks") or []
        if ranks and all("losses" in r for r in ranks) and any(
                key in r["losses"] or key in r["errors"] for r in ranks):
            return ranks, None
        error = run.get("error") or error
    return None, error


def _engine_summary(key: str, timing: list[dict], memory: dict) -> dict:
    s = {}
    ranks, run_error = _timing_for(key, timing)
    if ranks is None:
        if timing:  # --interleaved-steps 0 makes no timing runs: not a failure
            s["error"] = run_error or "not run"
    else:
        errors = [r["errors"][key] for r in ranks if key in r["errors"]]
        real = [e for e in errors if e != "failed on another rank"]
        if errors:
            s["error"] = (real or errors)[0]
        s["info"] = ranks[0]["info"].get(key)
        s["losses"] = [r["losses"].get(key, []) for r in ranks]
        times = [r["step_times"].get(key, []) for r in ranks]
        if not errors and all(times):
            stats = step_stats(times)
            s.update(median_ms=stats["total"]["median"], p10_ms=stats["total"]["p10"],
                     steps=stats["steps"],
                     phase_ms={k: stats[k]["median"] for k in PHASES})
    if key in memory:
        mem = _memory_summary(memory[key])
        info = mem.pop("memory_info", None)
        s.update(mem)
        s.setdefault("info", info)
    return s


def _max_diff(a: list[list[float]], b: list[list[float]]):
    """Largest |a - b| over the ranks and the steps both have (None when none)."""
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return max(diffs) if diffs else None


def summarize(args, timing: list[dict], memory: dict) -> list[dict]:
    rows = []
    for config_name in args.config_list:
        engines = {e: _engine_summary(f"{config_name}/{e}", timing, memory) for e in ENGINES}
        z, d = engines["zero"], engines["deepspeed"]
        row = {"config": config_name, "shared_config": shared_config(config_name, args),
               "engines": engines}
        if "median_ms" in z and "median_ms" in d:
            row["ratio_median"] = z["median_ms"] / d["median_ms"]
            row["ratio_p10"] = z["p10_ms"] / d["p10_ms"]
        if z.get("losses") and d.get("losses"):
            row["loss_max_abs_diff"] = _max_diff(z["losses"], d["losses"])
        # each engine alone (memory run) against the same engine interleaved
        row["alone_vs_interleaved_max_abs_diff"] = {
            e: _max_diff(s["memory_losses"], s["losses"])
            for e, s in engines.items() if s.get("memory_losses") and s.get("losses")}
        rows.append(row)
    return rows


# ---- the report ---------------------------------------------------------------------------------
def _failed(text: str) -> str:
    """A failure in a table cell: its last line, cut short."""
    return f"failed: `{last_line(text, 120).strip().replace('|', '/')}`"


def _ms(s: dict) -> str:
    if "error" in s:
        return _failed(s["error"])
    return f"{s['median_ms']:.1f} ({s['p10_ms']:.1f})" if "median_ms" in s else "-"


def _growth(s: dict, key: str) -> str:
    if "memory_error" in s:
        return _failed(s["memory_error"])
    if "memory" not in s:
        return "-"
    return pair(s["memory"][key], fmt=lambda x: mib(x, 1), merge_equal=False)


def _failures(s: dict, engine: str) -> list[str]:
    return [f"{engine} ({what}): `{last_line(s[key], 160).strip().replace('|', '/')}`"
            for key, what in (("error", "timing"), ("memory_error", "memory")) if key in s]


def _sci(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _loss_table(summary: list[dict], args) -> str:
    """Rank 0's loss at up to 12 steps, zero / DeepSpeed per configuration."""
    total = args.warmup + args.interleaved_steps
    picks = sorted(set([0, total - 1] + list(range(0, total, max(1, total // 10)))))
    header_row = ["step"] + [row["config"] for row in summary]
    rows = []
    for i in picks:
        cells = [str(i)]
        for row in summary:
            z, d = (row["engines"][e].get("losses") or [[]] for e in ENGINES)
            fmt = [f"{l[0][i]:.4f}" if l and len(l[0]) > i else "-" for l in (z, d)]
            cells.append(" / ".join(fmt))
        rows.append(cells)
    return markdown_table(header_row, rows)


def _phase_section(summary) -> list[str]:
    """Where each engine's peak is: the peak of each phase and what stays, rank 0 / rank 1."""
    rows = [[row["config"], e, *(_growth(row["engines"][e], k) for k in PHASE_FIELDS)]
            for row in summary for e in ENGINES if "memory" in row["engines"][e]]
    return ["## Where the peak is (rank 0 / rank 1, MiB over RSS before)", "",
            "The same runs, each rank's median: the peak RSS within each phase (VmHWM reset as "
            "the phase begins; forward, backward and step of the last step), the RSS after the "
            "last step (what an engine holds between steps) and after the engine was destroyed "
            "and collected (what stays in the process: torch's kernel caches, the allocator's "
            "pools).", "",
            markdown_table(["configuration", "engine", "build", "forward", "backward", "step",
                            "held between steps", "left after destroy"], rows), ""]


def _method_section(facts, args) -> list[str]:
    numel = f"{facts['numel']:,}" if facts.get("numel") else "?"
    memory_text = ("skipped (--steps 0)." if args.steps <= 0 else
                   f"each engine alone in a fresh pair of ranks (both libraries imported, the "
                   f"process group up), {args.memory_repeats} such runs per engine and "
                   f"configuration taken in turns, each rank's median shown; {args.steps} "
                   f"training steps after a throwaway engine of "
                   f"the same kind and config on a 1-layer TinyGPT paid the one-time costs; peak "
                   f"RSS growth = the kernel's peak resident set (VmHWM, reset at the baseline) "
                   f"minus the RSS just before the model and engine were built, per rank "
                   f"(rank 0 / rank 1). Torch's CPU allocator keeps no statistics and DeepSpeed's "
                   f"CPU accelerator reports the process RSS as its memory, so RSS is the measure "
                   f"both share; details below."
                   + ("" if args.mmap_threshold is None else
                      f" The memory runs ran with MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}: "
                      f"glibc mmaps every block of at least that size and gives it back to the "
                      f"kernel when it is freed, so the RSS follows the live bytes rather than "
                      f"what malloc keeps for reuse."))
    layout = ("all configurations' engines in ONE pair of ranks (one torch.distributed.run), "
              "stepping round-robin" if not args.per_config else
              "one torch.distributed.run per configuration, its zero and DeepSpeed engines "
              "stepping round-robin")
    return [
        f"TinyGPT (vocab {args.vocab}, block {args.block}, {args.n_layer} layers, {args.n_head} "
        f"heads, width {args.n_embd}; Ψ = {numel} parameters), micro-batch "
        f"{args.micro_batch} per rank, world size {args.world_size} on gloo, {args.threads} torch "
        f"thread(s) per rank. Both engines get the same weights (seed 0), the same data and the "
        f"same DeepSpeed JSON config (AdamW lr {1e-3}, gradient clipping {args.clip}, "
        f"reduce_bucket_size {args.bucket_numel}, overlap_comm; bf16 rows: \"bf16\": "
        f"{{\"enabled\": true}}; offload: \"offload_optimizer\": {{\"device\": \"cpu\"}}; "
        "bf16master: \"bf16_master_weights_and_grads\" and \"bf16_optimizer_states\" true in "
        "the bf16 block, as DeepSpeed's bf16_full.json example; fp32accum: \"data_types\": "
        "{\"grad_accum_dtype\": \"fp32\"}; muon: \"optimizer\": " + json.dumps(MUON) +
        " (at stage 3 with \"reduce_scatter\": false, as DeepSpeed requires of Muon); "
        "lora: the same model frozen but for rank-8 LoRA adapters on every block's Linear "
        "layers, zero.models.lora, as PEFT adds them).",
        "",
        f"Timing: {layout}; {args.interleaved_steps} measured steps per engine after "
        f"{args.warmup} warm-up steps. Step = forward + engine.backward + engine.step, the "
        "slower rank per step; median (p10) in ms. zero/DS < 1: zero is faster.",
        "",
        f"Memory: {memory_text}",
        "",
    ]


def _summary_table(summary) -> list[str]:
    rows = []
    for row in summary:
        z, d = row["engines"]["zero"], row["engines"]["deepspeed"]
        ratio = f"{row['ratio_median']:.2f}" if "ratio_median" in row else "-"
        rows.append([row["config"], _ms(z), _ms(d), ratio, _sci(row.get("loss_max_abs_diff")),
                     _growth(z, "rss_growth_bytes"), _growth(d, "rss_growth_bytes")])
    return [markdown_table(
        ["configuration", "zero ms median (p10)", "DeepSpeed ms median (p10)", "zero/DS",
         "max abs loss diff", "zero peak RSS growth (MiB)", "DeepSpeed peak RSS growth (MiB)"],
        rows), ""]


def _memory_row(config: str, engine: str, one: dict) -> list[str]:
    m = one.get("memory")
    acct = "-"
    if m and "zero_accounting" in m:
        acct = pair([a["model_state_bytes"] for a in m["zero_accounting"]],
                    fmt=lambda x: mib(x, 1), merge_equal=False)
    cells = ([_growth(one, k) for k in ("rss_before_bytes", "one_time_anon_bytes",
                                         "rss_growth_bytes", "anon_growth_bytes")]
             if m else [_growth(one, ""), "-", "-", "-"])
    runs = ("; ".join(pair(run, fmt=lambda x: mib(x, 1), merge_equal=False)
                      for run in m["rss_growth_repeats"]) if m else "-")
    return [config, engine, *cells, runs, acct]


def _memory_section(summary) -> list[str]:
    rows = [_memory_row(row["config"], e, row["engines"][e]) for row in summary for e in ENGINES]
    return ["## Memory per rank (rank 0 / rank 1, MiB)", "",
            "Each rank's median over the runs. RSS before: the resident set just before "
            "the model and the engine were built (the throwaway engine already dropped). "
            "One-time: anonymous RSS the throwaway engine left behind (imports, ops, "
            "pools). Peak RSS growth: VmHWM (reset at the baseline) minus RSS before; "
            "every run's beside it. Peak anon growth: the highest RssAnon sample minus "
            "RssAnon before. zero accounting: the model-state bytes of zero's own "
            "registry after the last step (DeepSpeed keeps no such account on CPU).", "",
            markdown_table(["configuration", "engine", "RSS before", "one-time anon",
                            "peak RSS growth", "peak anon growth",
                            "peak RSS growth, each run", "zero accounting (model states)"],
                           rows), ""] + _phase_section(summary)


def _failures_section(summary) -> list[str]:
    failures = [f"* {row['config']}: {text}" for row in summary
                for e in ENGINES for text in _failures(row["engines"][e], e)]
    lines = ["## Failures", ""] + (failures or ["None: every configuration ran on both engines."])
    if failures:
        lines += ["", "The full tracebacks are in the JSON (summary[].engines.*.error / "
                  "memory_error)."]
    return lines


def _phase_ms_section(summary) -> list[str]:
    rows = []
    for row in summary:
        cells = [row["config"]]
        for e in ENGINES:
            ph = row["engines"][e].get("phase_ms")
            cells.append(" / ".join(f"{ph[k]:.1f}" for k in PHASES) if ph else "-")
        rows.append(cells)
    return ["", "## Phases (median ms, slower rank): forward / backward / step", "",
            markdown_table(["configuration", "zero", "DeepSpeed"], rows), ""]


def _losses_section(summary, args) -> list[str]:
    alone = [[row["config"]] + [_sci(row["alone_vs_interleaved_max_abs_diff"].get(e))
                                for e in ENGINES] for row in summary]
    return ["## Losses", "",
            "Rank 0's loss, zero / DeepSpeed, at some of the steps (warm-up included; every "
            "step of both ranks is in the JSON). max |Δloss|: over every step and both "
            "ranks. Alone vs interleaved: the memory run's losses (the engine alone in its "
            "process) against the same engine's in the timing run, over the steps both have.",
            "", _loss_table(summary, args), "",
            markdown_table(["configuration", "zero alone vs interleaved",
                            "DeepSpeed alone vs interleaved"], alone), ""]


def _engines_section(summary) -> list[str]:
    rows = []
    for row in summary:
        for e in ENGINES:
            info = row["engines"][e].get("info") or {}
            replaced = info.get("replaced_F_linear")
            rows.append([row["config"], e, f"`{info.get('optimizer', '-')}`",
                         f"`{info.get('optimizer_wrapper', '-')}`",
                         "-" if replaced is None else "yes" if replaced else "no"])
    return ["## What each engine ran", "",
            "Both engines read AdamW from the config's \"optimizer\" block. DeepSpeed on its "
            "CPU accelerator picks FusedAdam (the CPU accelerator's compiled fused_adam op) "
            "without offload and DeepSpeedCPUAdam (the compiled cpu_adam op) with "
            "offload_optimizer; zero runs its own C++ AdamW on each rank's shard.", "",
            "DeepSpeed's stage 3 replaces `torch.nn.functional.linear` for the whole process "
            "when its engine is built (zero_optimization.memory_efficient_linear, default true; "
            "zero accepts only that value and replaces nothing). In the timing run every "
            "engine steps with the `F.linear` it would have alone (swapped in around its "
            "step), so zero's engines never run through DeepSpeed's linear; the alone vs "
            "interleaved losses above check it.", "",
            markdown_table(["configuration", "engine", "optimizer (AdamW)", "wrapper",
                            "replaced F.linear"], rows), ""]


def _runtime_section(facts) -> list[str]:
    rt = facts.get("runtime", {})
    return [f"DeepSpeed {rt.get('deepspeed_version', '?')} from `{rt.get('deepspeed_file', '?')}`"
            f", accelerator `{rt.get('deepspeed_accelerator', '?')}` "
            f"(`{rt.get('deepspeed_accelerator_class', '?')}`), communication backend "
            f"`{rt.get('deepspeed_comm_backend', '?')}`, process group "
            f"`{rt.get('process_group_backend', '?')}`; torch {rt.get('torch', '?')} "
            f"(`{rt.get('torch_file', '?')}`); ranks' Python `{rt.get('python', '?')}`, "
            f"OMP_NUM_THREADS={rt.get('OMP_NUM_THREADS', '?')}.", "",
            engine_under_test(facts) + f" (imported from `{rt.get('zero_file', '?')}`).",
            "", f"Load average: {facts.get('load', '?')}."] + machine_section(facts)


def render_markdown(summary, facts, args, command, wall) -> str:
    version = facts.get("runtime", {}).get("deepspeed_version", DS_VERSION)
    lines = header(f"zero vs DeepSpeed {version} on CPU", "bench_deepspeed.py", facts["date"],
                   wall, command)
    lines += _method_section(facts, args) + _summary_table(summary)
    if args.steps > 0:
        lines += _memory_section(summary)
    lines += (_failures_section(summary) + _phase_ms_section(summary)
              + _losses_section(summary, args) + _engines_section(summary)
              + _runtime_section(facts))
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = settle(parse_args(argv), ALL_CONFIGS)
    if args.worker:
        return worker_main(args)
    args.argv = list(argv)
    if not os.path.exists(args.python):
        sys.exit(f"{args.python} is missing: run scripts/deepspeed_cpu.sh first (it makes "
                 "build/ds-venv with DeepSpeed 0.19.8), or pass --python")
    command = command_line(name_commit=False)
    t0 = time.perf_counter()
    sampler = machine.LoadSampler()
    sampler.start()
    timing = _timing_runs(args)
    memory = _memory_runs(args)
    sampler.stop()
    wall = time.perf_counter() - t0
    summary = summarize(args, timing, memory)
    runtimes = [r["runtime"] for r in timing + list(memory.values()) if "runtime" in r]
    numel = next((r["ranks"][0]["numel"] for r in timing
                  if r.get("ranks") and "numel" in r["ranks"][0]), None)
    facts = {**machine.host_facts(), "date": machine.utc_now(), "zero_root": ZERO_ROOT,
             "zero_commit": machine.git_commit(ZERO_ROOT),
             "zero_tree_dirty": machine.tree_dirty(ZERO_ROOT),
             "runtime": runtimes[0] if runtimes else {}, "numel": numel,
             "load": machine.load_range(sampler.samples) if sampler.samples else "?"}
    md = render_markdown(summary, facts, args, command, wall)
    record_args = {k: v for k, v in vars(args).items() if k not in ("worker", "result")}
    publish(args.out, "deepspeed_vs_zero", md, {
        "command": command, "args": record_args, "machine": facts, "wall_s": wall,
        "summary": summary, "timing_runs": timing, "memory_runs": memory})
    ok = all("error" not in row["engines"][e] and "memory_error" not in row["engines"][e]
             for row in summary for e in ENGINES)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
