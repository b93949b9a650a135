"""The pipeline bubble and activation memory of zero.pipe's schedules (CPU, one run).

    python benchmarks/bench_pipeline.py            # writes benchmarks/results/pipeline.{md,json}
    python benchmarks/bench_pipeline.py --micro-batches 1 4 --out ''   # smoke test

A TinyGPT cut into --stages pipeline stages (one rank each, data-parallel size 1, ZeRO-1,
fp32; partition_method "type:Block" so the blocks split evenly) trains batches of m
micro-batches for several m, with the 1F1B and the GPipe schedule. Per stage:

* busy: the time in its forward and backward passes; pipeline time: the time of the whole
  schedule up to (not including) the tied-gradient sum, the ZeRO reduction and the step,
  so it includes the waits on the neighbours' activations and gradients;
* measured bubble = 1 - busy / pipeline time, the mean over the stages, beside the ideal
  (p - 1) / (m + p - 1) of a pipeline with equal stages and free communication;
* peak activations: the most bytes autograd held for backward at once on the stage (the
  saved tensors of all micro-batches whose backward had not run; zero/saved_activations.py),
  measured in one extra batch per configuration.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.under_test import ROOT, ZERO_ROOT, command_line  # noqa: E402  (first: which zero)
from benchmarks import facts as machine  # noqa: E402
from benchmarks.launch import spawn_ranks  # noqa: E402
from benchmarks.models import ADAMW, gpt_config, rank_batches  # noqa: E402
from benchmarks.report import header, machine_section, markdown_table, publish  # noqa: E402

PIPE_PHASES = ("_load", "_recv_activation", "_forward", "_send_activation", "_recv_grad",
               "_backward", "_send_grad")


def timed(engine, clock: dict) -> None:
    """Wraps the engine's instruction handlers so each adds its seconds to clock[name]."""
    for name in PIPE_PHASES + ("_reduce_tied", "_reduce", "_step"):
        handler = getattr(engine, name)

        def wrapper(mb, batch, handler=handler, name=name):
            start = time.perf_counter()
            handler(mb, batch)
            clock[name] = clock.get(name, 0.0) + time.perf_counter() - start
        setattr(engine, name, wrapper)


def one_config(gpt, args, schedule: str, micro_batches: int) -> dict:
    import torch
    import zero
    from zero.models.pipe_gpt import cross_entropy, pipe_layers
    from zero.pipe import PipelineModule

    module = PipelineModule(layers=pipe_layers(gpt), num_stages=args.stages, loss_fn=cross_entropy,
                            partition_method="type:Block", seed_layers=True)
    config = {"train_micro_batch_size_per_gpu": args.micro_batch,
              "gradient_accumulation_steps": micro_batches,
              "optimizer": {"type": "AdamW", "params": dict(ADAMW)},
              "zero_optimization": {"stage": 1}, "pipeline": {"schedule": schedule}}
    engine, _, _, _ = zero.initialize(model=module, config=config)
    data = rank_batches(gpt, args.micro_batch, micro_batches, 0)
    clock: dict = {}
    timed(engine, clock)
    rounds = []
    for repeat in range(args.warmup + args.repeats):
        clock.clear()
        torch.distributed.barrier()
        engine.train_batch(iter(data))
        if repeat >= args.warmup:
            pipe = sum(clock.get(name, 0.0) for name in PIPE_PHASES)
            busy = clock.get("_forward", 0.0) + clock.get("_backward", 0.0)
            rounds.append({"pipeline_s": pipe, "busy_s": busy,
                           "step_s": pipe + clock["_reduce_tied"] + clock["_reduce"] +
                           clock["_step"]})
    engine.measure_activations = True
    engine.train_batch(iter(data))
    engine.destroy()
    middle = sorted(rounds, key=lambda r: r["pipeline_s"])[len(rounds) // 2]
    return {**middle, "peak_activation_bytes": engine.peak_activation_bytes}


def run_rank(rank, world, name, args):
    import zero

    zero.init_distributed()  # as a DeepSpeed script does before building a PipelineModule
    gpt = gpt_config(args)
    results = {}
    for schedule in ("1f1b", "gpipe"):
        for m in args.micro_batches:
            results[f"{schedule}/{m}"] = one_config(gpt, args, schedule, m)
    return {"rank": rank, "results": results}


def summarize(outcome: dict, args) -> list[dict]:
    p = args.stages
    rows = []
    for schedule in ("1f1b", "gpipe"):
        for m in args.micro_batches:
            per_stage = [r["results"][f"{schedule}/{m}"] for r in outcome["ranks"]]
            bubble = statistics.mean(1 - s["busy_s"] / s["pipeline_s"] for s in per_stage)
            rows.append({"schedule": schedule, "micro_batches": m,
                         "ideal_bubble": (p - 1) / (m + p - 1), "measured_bubble": bubble,
                         "pipeline_s": max(s["pipeline_s"] for s in per_stage),
                         "step_s": max(s["step_s"] for s in per_stage),
                         "busy_s": [s["busy_s"] for s in per_stage],
                         "peak_activation_bytes": [s["peak_activation_bytes"]
                                                   for s in per_stage]})
    return rows


def markdown(rows, args, facts, wall_s) -> str:
    lines = header("Pipeline bubble and activation memory: 1F1B vs GPipe", "bench_pipeline.py",
                   facts["date"], wall_s, command_line())
    lines += [f"TinyGPT vocab {args.vocab}, block {args.block}, {args.n_layer} blocks, "
              f"{args.n_head} heads, width {args.n_embd}; micro-batch {args.micro_batch}; "
              f"{args.stages} stages on {args.stages} ranks (data-parallel size 1), ZeRO-1, "
              f"fp32, gloo point-to-point on one machine, {args.threads} torch thread(s) per "
              f"rank; median of {args.repeats} batches after {args.warmup} warm-up. The "
              "module docstring of the script defines every column.", "",
              f"1-minute load average during the run: {facts['load_during_run']} on "
              f"{facts['nproc']} cores (above the core count, other processes shared them "
              "and the busy times include that sharing).", ""]
    table = []
    for row in rows:
        mib = "/".join(f"{b / 2**20:.1f}" for b in row["peak_activation_bytes"])
        table.append([row["schedule"], row["micro_batches"], f"{row['ideal_bubble']:.3f}",
                      f"{row['measured_bubble']:.3f}", f"{row['pipeline_s'] * 1000:.0f}",
                      f"{row['pipeline_s'] * 1000 / row['micro_batches']:.1f}",
                      f"{row['step_s'] * 1000:.0f}", mib])
    lines += [markdown_table(["schedule", "m", "ideal bubble (p-1)/(m+p-1)", "measured bubble",
                              "pipeline ms", "ms per micro-batch", "step ms",
                              "peak activations MiB, stage 0/1/..."], table), ""]
    lines += machine_section(facts)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args()
    args.world_size = args.stages
    t0 = time.perf_counter()
    facts = {**machine.host_facts(), **machine.checkout_facts(ROOT), "date": machine.utc_now(),
             "zero_root": ZERO_ROOT, "zero_commit": machine.git_commit(ZERO_ROOT)}
    load = machine.LoadSampler(every=2.0)
    load.start()
    with tempfile.TemporaryDirectory() as tmp:
        outcome = spawn_ranks(run_rank, "pipeline", args, tmp)
    load.stop()
    facts["load_during_run"] = machine.load_range(load.samples)
    if "error" in outcome:
        raise SystemExit(f"bench_pipeline: {outcome['error']}")
    rows = summarize(outcome, args)
    wall_s = time.perf_counter() - t0
    record = {"command": command_line(), "facts": facts, "args": vars(args), "rows": rows,
              "wall_s": wall_s}
    publish(args.out, "pipeline", markdown(rows, args, facts, wall_s), record)


if __name__ == "__main__":
    main()
