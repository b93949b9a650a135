"""ZeRO-Offload on one GPU, side by side in one run: zero with its optimizer (and parameters)
offloaded to pinned host memory against the same model without offload, and against PyTorch
FSDP2 with and without CPU offload. The zero2-offload arms keep the gradient shard in host
memory, or on the GPU (-devgrads: offload_optimizer.grads_on_device), each also with the
delayed update (-dpu).

    python benchmarks/bench_gpu_offload.py                  # GPT 1.3B, bf16: step-time split
    python benchmarks/bench_gpu_offload.py --largest        # the largest GPT that trains
    python benchmarks/bench_gpu_offload.py --model 350m --steps 3 --out /tmp/bench   # smoke

Every configuration runs in a fresh process (world size 1, NCCL), so its GPU peak and host
RSS are its own. Per optimizer step (micro-batch × gradient accumulation) the report gives
forward, backward and the optimizer step (CUDA-synchronised wall time, median of the measured
steps, 1 for FSDP2's CPU offload), the GPU's peak allocation and the process's peak RSS.

Where the offloaded step's time goes: the zero2-offload worker also times, alone and on the
same number of elements, the three pieces its step pipelines: the gradient copy to pinned
host memory (D2H), zero's CPU Adam, and the parameter copy back (H2D). `hidden` is the share
of their sum that the pipelined step did not add (1 - step / (D2H + Adam + H2D)); with the
delayed update (dpu) the CPU step runs behind the next forward and backward instead.

--largest: the largest GPT that trains without offload and with it, each configuration
chosen by zero's tuner for this GPU and this host's free memory (benchmarks/gpu_largest.py;
micro-batch 1, 2 steps after 1 warm-up), and the ratio of the two; --gpu-memory-gib caps the
GPU to ask the same of a smaller card. Failures (out of memory, time) are recorded, not hidden.

DeepSpeed's ZeRO-Offload is measured when `deepspeed` imports (the GPU machine this was
written for has no internet, so the report says when it did not).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import gpu_largest, models  # noqa: E402
from benchmarks.facts import machine_facts  # noqa: E402
from benchmarks.launch import free_port, rendezvous_env, run_worker  # noqa: E402
from benchmarks.memory import rss_peak  # noqa: E402
from benchmarks.report import gib, markdown_table, write_results  # noqa: E402
from zero.models.tiny_gpt import GPTConfig, TinyGPT  # noqa: E402

# name: (layers, heads, width); GPT-2 vocabulary padded to 50304, 1024 positions. The
# rungs from 4.2b up are for --largest's ladder (16.5b: twice the 8.3b that fits an H200
# without offload).
MODELS = {"350m": (24, 16, 1024), "1.3b": (24, 16, 2048), "2.7b": (32, 32, 2560),
          "4.2b": (20, 32, 4096), "5b": (24, 32, 4096), "5.8b": (28, 32, 4096),
          "6.7b": (32, 32, 4096), "8.3b": (40, 32, 4096), "9b": (44, 32, 4096),
          "10b": (48, 32, 4096),
          "11.5b": (56, 32, 4096), "13b": (40, 40, 5120), "14b": (44, 40, 5120),
          "15b": (47, 40, 5120), "16.5b": (52, 40, 5120)}
# Most telling first: a run cut short by its budget still compares offload with none, then
# the gradient shard kept on the device (offload_optimizer.grads_on_device, "devgrads": a
# backward without host copies) alone and with the delayed update (which hides the CPU step
# behind the next forward and backward), the delayed update alone and DeepSpeed's
# ZeRO-Offload; FSDP2's CPU offload (about 15 s a step on the H100) last.
CONFIGS = ("zero2", "zero2-offload", "zero2-offload-devgrads", "zero2-offload-dpu-devgrads",
           "zero2-offload-dpu", "deepspeed-offload", "zero3-offload", "zero3-offload-devgrads",
           "fsdp2", "fsdp2-offload")
# Configurations measured over one step after the warm-up, whatever --steps says: FSDP2's CPU
# offload takes about 15 s a step, and four would not fit a GPU call's budget.
ONE_STEP = ("fsdp2-offload",)
OFFLOADED = ("zero2-offload", "zero2-offload-devgrads", "zero2-offload-dpu-devgrads",
             "zero2-offload-dpu", "zero3-offload", "zero3-offload-devgrads", "deepspeed-offload")
LR = 1e-4


def gpt_config(model: str) -> GPTConfig:
    layers, heads, width = MODELS[model]
    return models.gpt_config(dict(vocab=50304, block=1024, n_layer=layers, n_head=heads,
                                  n_embd=width))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="1.3b", choices=sorted(MODELS))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--gas", type=int, default=4, help="gradient accumulation steps")
    parser.add_argument("--steps", type=int, default=3, help="measured optimizer steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per configuration")
    parser.add_argument("--budget", type=int, default=0,
                        help="seconds for the whole run (0: none); a configuration still "
                             "running when it is spent is stopped, those left are reported as "
                             "skipped")
    parser.add_argument("--largest", action="store_true")
    parser.add_argument("--sizes", default="2.7b,4.2b,5b,5.8b,6.7b,8.3b,9b,10b,11.5b,13b,14b,15b,16.5b",
                        help="--largest: the ladder of sizes the tuner is asked about")
    parser.add_argument("--gpu-memory-gib", type=float, default=0,
                        help="--largest: cap the GPU at this many GiB (the tuner's budget and "
                             "torch.cuda.set_per_process_memory_fraction); 0: the whole GPU")
    parser.add_argument("--reserve-gib", type=float, default=4,
                        help="--largest: GPU memory the tuner keeps back beyond the "
                             "activations (CUDA context, cuBLAS, allocator slack)")
    parser.add_argument("--host-reserve-gib", type=float, default=8,
                        help="--largest: host memory kept back from MemAvailable (the "
                             "process's own libraries, page cache)")
    parser.add_argument("--nvme-path",
                        help="--largest: a directory for swap files, which lets the tuner put "
                             "the optimizer or the parameters on NVMe (default: none)")
    parser.add_argument("--nvme-reserve-gib", type=float, default=4,
                        help="--largest: disk space kept free under --nvme-path")
    parser.add_argument("--out", default="benchmarks/results/gpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config-json", help=argparse.SUPPRESS)  # a zero worker's config
    parser.add_argument("--bf16-init", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---- one configuration, in its own process ---------------------------------------------------
def ds_config(name: str, args) -> dict:
    zero = {"stage": 3 if name.startswith("zero3") else 2, "overlap_comm": True,
            "contiguous_gradients": True}
    if "offload" in name:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if name.startswith("zero3") and "offload" in name:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if "-dpu" in name:
        zero["offload_optimizer"]["delayed_update"] = True
    if name.endswith("devgrads"):
        zero["offload_optimizer"]["grads_on_device"] = True
    return {"train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.gas, "gradient_clipping": 1.0,
            "bf16": {"enabled": True}, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.95],
                                                      "eps": 1e-8, "weight_decay": 0.1}},
            "zero_optimization": zero}


class StepTimer:
    """CUDA-synchronised wall time of each phase, summed over one optimizer step."""

    def __init__(self):
        self.phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}

    def __call__(self, phase, fn, *args):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*args)
        torch.cuda.synchronize()
        self.phases[phase] += time.perf_counter() - start
        return out


def batches(config: GPTConfig, args, count: int):
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.micro_batch, config.block_size)
    return [(torch.randint(0, config.vocab_size, shape, device="cuda", generator=generator),
             torch.randint(0, config.vocab_size, shape, device="cuda", generator=generator))
            for _ in range(count)]


def train_zero(name, model, args):
    import zero

    if args.config_json:
        with open(args.config_json) as handle:
            config = json.load(handle)
    else:
        config = ds_config(name, args)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine, engine_step(engine, batches(model.config, args, args.gas))


def engine_step(engine, data):
    """One optimizer step of a DeepSpeed-shaped engine (zero's or DeepSpeed's): forward,
    engine.backward and engine.step per micro-batch, each phase timed."""
    def one_step():
        timer = StepTimer()
        for tokens, targets in data:
            loss = timer("forward", engine, tokens, targets)
            timer("backward", engine.backward, loss)
            timer("step", engine.step)
        return timer.phases, loss.item()
    return one_step


def train_fsdp2(name, model, args):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)}
    if name.endswith("offload"):
        policy["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for block in model.blocks:
        fully_shard(block, **policy)
    fully_shard(model, **policy)
    hyper = dict(lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True, **hyper)
    data = batches(model.config, args, args.gas)

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def one_step():
        timer = StepTimer()
        for tokens, targets in data:
            loss = timer("forward", model, tokens, targets)
            timer("backward", (loss / args.gas).backward)
        timer("step", optimizer_step)
        return timer.phases, loss.item()
    return None, one_step


def train_deepspeed(name, model, args):
    import deepspeed  # noqa: F401 - ImportError is recorded as the reason

    config = ds_config("zero2-offload", args)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return engine, engine_step(engine, batches(model.config, args, args.gas))


def offload_components(numel: int) -> dict:
    """D2H of numel bf16 gradients into pinned memory, zero's CPU AdamW on numel fp32 elements
    (bf16 gradients in, bf16 parameters out), H2D of the bf16 parameters, each timed alone."""
    from zero import _C

    device_buf = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    host_grad = torch.empty(numel, dtype=torch.bfloat16, pin_memory=True)
    host_param = torch.empty(numel, dtype=torch.bfloat16, pin_memory=True)
    master, exp_avg, exp_avg_sq = (torch.zeros(numel) for _ in range(3))

    def timed(fn):
        best = float("inf")
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        return best

    d2h = timed(lambda: host_grad.copy_(device_buf, non_blocking=True))
    adam = timed(lambda: _C.cpu_adam_step(master, host_grad, exp_avg, exp_avg_sq, LR, 0.9, 0.95,
                                          1e-8, 0.1, True, True, 1, 1.0, out16=host_param,
                                          num_threads=torch.get_num_threads()))
    h2d = timed(lambda: device_buf.copy_(host_param, non_blocking=True))
    return {"d2h_s": d2h, "cpu_adam_s": adam, "h2d_s": h2d,
            "d2h_gb_s": numel * 2 / d2h / 1e9, "h2d_gb_s": numel * 2 / h2d / 1e9,
            "cpu_adam_params_per_s": numel / adam, "adam_threads": torch.get_num_threads()}


def offload_timings(engine) -> dict | None:
    """zero's own account so far (all groups): its offloaded steps (C++ OffloadTimings) and
    backward's copies into a host gradient shard (HostCopyTimings, as backward_*)."""
    core = getattr(engine, "core", None)
    if core is None or not hasattr(core, "group_host_copy_timings"):
        return None
    import offload

    copies = offload.backward_copy_timings(core)
    return {**offload.step_timings(core), **{f"backward_{k}": v for k, v in copies.items()}}


def _per_step(before, after, steps: int) -> dict | None:
    if not before or not after or after == before:
        return None
    return {field: (after[field] - before[field]) / steps for field in after}


def worker(args) -> dict:
    import torch.distributed as dist

    name = args.worker
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    if args.gpu_memory_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_memory_gib * 2**30 / total))
    config = gpt_config(args.model)
    with torch.device("cuda"):
        if args.bf16_init:
            torch.set_default_dtype(torch.bfloat16)
        model = TinyGPT(config)
        torch.set_default_dtype(torch.float32)
    numel = models.count_params(model)
    build = train_zero if name.startswith("zero") else \
        train_fsdp2 if name.startswith("fsdp2") else train_deepspeed
    engine, one_step = build(name, model, args)
    times, losses, before = [], [], None
    for index in range(args.warmup + args.steps):
        if index == args.warmup:
            before = offload_timings(engine)
        phases, loss = one_step()
        losses.append(loss)
        if index >= args.warmup:
            times.append(phases)
    inside = _per_step(before, offload_timings(engine), args.steps)
    result = {"config": name, "model": args.model, "params": numel, "losses": losses,
              "micro_batch": args.micro_batch, "gas": args.gas,
              "tokens_per_step": args.micro_batch * args.gas * config.block_size,
              "measured_steps": args.steps,
              "gpu_peak_bytes": torch.cuda.max_memory_allocated(),
              "rss_peak_bytes": rss_peak()}
    for phase in ("forward", "backward", "step"):
        result[f"{phase}_s"] = statistics.median(t[phase] for t in times)
    result["total_s"] = statistics.median(sum(t.values()) for t in times)
    if inside:
        result["offloaded_step"] = inside
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()
    del engine, model
    if name == "zero2-offload":
        torch.cuda.empty_cache()
        result["components"] = offload_components(numel)
    return result


# ---- the driver ----------------------------------------------------------------------------
def run_config(name: str, args, deadline: float = float("inf"), **overrides) -> dict:
    """Runs one configuration in a fresh process, for at most --timeout seconds and never past
    the run's deadline (its --budget); a failure comes back as its reason."""
    options = {**vars(args), **overrides}
    timeout, cut_by = config_timeout(args.timeout, args.budget, deadline, time.monotonic())
    command = [sys.executable, os.path.abspath(__file__), "--worker", name, "--model",
               options["model"], "--micro-batch", str(options["micro_batch"]), "--gas",
               str(options["gas"]), "--steps", str(options["steps"]), "--warmup",
               str(options["warmup"]), "--gpu-memory-gib", str(options["gpu_memory_gib"])]
    if options.get("config_json"):
        command += ["--config-json", options["config_json"]]
    if options.get("bf16_init"):
        command.append("--bf16-init")
    env = {**os.environ, **rendezvous_env(0, 1, free_port()), "LOCAL_WORLD_SIZE": "1",
           "PYTHONFAULTHANDLER": "1"}  # a crash in native code still names its frame
    print(f"[bench] {name} {options['model']} ...", flush=True)
    start = time.monotonic()
    try:
        result, proc = run_worker(command, "--result", env, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired:
        return {"config": name, "model": options["model"],
                "error": f"did not finish in {timeout:.0f} s ({cut_by})"}
    wall = time.monotonic() - start
    if proc.returncode != 0 and result is None:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
        print("\n".join(tail), flush=True)
        return {"config": name, "model": options["model"], "output_tail": tail,
                "error": f"exit code {proc.returncode}: " + _reason(tail)}
    if proc.returncode != 0:  # measured, then failed on the way out: say so
        result["teardown_exit_code"] = proc.returncode
    result["process_wall_s"] = wall
    print(f"[bench] {name}: {result['total_s']:.3f} s/step, GPU peak "
          f"{result['gpu_peak_bytes'] / 2**30:.1f} GiB", flush=True)
    return result


def config_timeout(timeout: float, budget: float, deadline: float, now: float) -> tuple:
    """(seconds one configuration may run, what limits it): its --timeout, or less when the
    run's --budget ends sooner, so that a budget is kept and the call running the benchmark is
    not cut off before the report is written."""
    if deadline - now < timeout:
        return max(1.0, deadline - now), f"cut at the end of the run's --budget of {budget} s"
    return float(timeout), "its --timeout"


def _reason(tail: list[str]) -> str:
    for line in reversed(tail):
        if "OutOfMemoryError" in line or "out of memory" in line.lower():
            return "out of memory: " + line.strip()[:200]
    for line in reversed(tail):
        if "Error" in line:
            return line.strip()[:240]
    return tail[-1][:240] if tail else "exited without output"


def write_report(kind: str, facts: dict, results: list[dict], args, extra=None) -> None:
    stem = "largest_model" if kind == "largest" else "gpu_offload"
    markdown = (render_largest(facts, results, extra) if kind == "largest"
                else render(facts, results))
    write_results(args.out, stem, markdown, {"facts": facts, "command": " ".join(sys.argv),
                                             "results": results, **(extra or {})})
    print(f"[bench] wrote {os.path.join(args.out, stem)}.md and .json", flush=True)


def _title(title: str, facts: dict) -> list[str]:
    return [f"# {title}", "", "`" + " ".join(["python"] + sys.argv) + "`", "",
            ", ".join(f"{key}: {value}" for key, value in facts.items()), ""]


def render(facts: dict, results: list[dict]) -> str:
    lines = _title("ZeRO-Offload on one GPU", facts)
    header = ["config", "model", "params", "tokens/step", "steps", "forward s", "backward s",
              "step s", "total s", "GPU peak GiB", "RSS peak GiB", "loss first→last"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["config"], r["model"], "", "", "", "", "", "", "", "", "",
                         "failed: " + r["error"].replace("|", "/")])
            continue
        rows.append([r["config"], r["model"], f"{r['params'] / 1e9:.2f}B", r["tokens_per_step"],
                     r.get("measured_steps", ""), f"{r['forward_s']:.3f}",
                     f"{r['backward_s']:.3f}", f"{r['step_s']:.3f}",
                     f"{r['total_s']:.3f}", gib(r["gpu_peak_bytes"]), gib(r["rss_peak_bytes"]),
                     f"{r['losses'][0]:.3f}→{r['losses'][-1]:.3f}"])
    lines += [markdown_table(header, rows), ""]
    lines += _offload_summary(results)
    return "\n".join(lines) + "\n"


def render_largest(facts: dict, results: list[dict], extra: dict) -> str:
    lines = _title("Largest GPT that trains on one GPU", facts)
    lines += [gpu_largest.budget_line(extra), "",
              markdown_table(gpu_largest.PLAN_HEADER, gpu_largest.plan_rows(extra["plans"])),
              "", markdown_table(gpu_largest.HEADER, gpu_largest.rows(results)), "",
              "- " + gpu_largest.verdict(results)]
    return "\n".join(lines) + "\n"


def _offload_summary(results: list[dict]) -> list[str]:
    by_name = {r["config"]: r for r in results if "error" not in r}
    lines = []
    base = by_name.get("zero2")
    for name in OFFLOADED:
        if base and name in by_name:
            added = by_name[name]["total_s"] / base["total_s"] - 1
            lines.append(f"- {name} adds {added:+.1%} to the step of zero2 without offload "
                         f"(goal: at most +10%).")
    for name in OFFLOADED:
        inside = by_name.get(name, {}).get("offloaded_step")
        if inside and inside["step_s"]:
            lines.append(f"- {name}'s optimizer step from the inside: waiting for gradients "
                         f"{inside['grads_in_wait_s']:.3f} s, CPU optimizer "
                         f"{inside['cpu_optimizer_s']:.3f} s, waiting for parameters "
                         f"{inside['params_out_wait_s']:.3f} s, of {inside['step_s']:.3f} s.")
        if inside and inside.get("backward_batches"):
            lines.append(f"- {name}'s backward copies into the host gradient shard, per step: "
                         f"{inside['backward_batches']:.0f} batches, "
                         f"{inside['backward_copy_s']:.3f} s on the copy stream, "
                         f"{inside['backward_wait_s']:.3f} s waited for by the engine thread "
                         f"(not hidden behind backward).")
    parts = by_name.get("zero2-offload", {}).get("components")
    if parts:
        serial = parts["d2h_s"] + parts["cpu_adam_s"] + parts["h2d_s"]
        step = by_name["zero2-offload"]["step_s"]
        lines.append(f"- zero2-offload's step pieces alone: D2H {parts['d2h_s']:.3f} s "
                     f"({parts['d2h_gb_s']:.1f} GB/s), CPU Adam {parts['cpu_adam_s']:.3f} s "
                     f"({parts['cpu_adam_params_per_s'] / 1e9:.2f} G params/s on "
                     f"{parts['adam_threads']} threads), H2D {parts['h2d_s']:.3f} s "
                     f"({parts['h2d_gb_s']:.1f} GB/s); sum {serial:.3f} s against the "
                     f"pipelined step's {step:.3f} s: hidden {1 - step / serial:.0%}.")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = worker(args)
        with open(args.result, "w") as file:
            json.dump(result, file)
        return 0
    if not torch.cuda.is_available():
        print("bench_gpu_offload: no CUDA GPU here; nothing to measure")
        return 0
    facts = machine_facts()
    deadline = time.monotonic() + args.budget if args.budget else float("inf")
    if args.largest:
        return largest(args, facts, deadline)
    results = []
    for name in args.configs.split(","):
        if time.monotonic() > deadline:
            results.append({"config": name, "model": args.model,
                            "error": f"skipped: the run's --budget of {args.budget} s was spent"})
        else:
            steps = {"steps": 1} if name in ONE_STEP else {}
            results.append(run_config(name, args, deadline, **steps))
        write_report("offload", facts, results, args)  # after each: a run cut short keeps its numbers
    return 0


def largest(args, facts: dict, deadline: float) -> int:
    """--largest: the tuner's plan for every size (benchmarks/gpu_largest.py), then each arm
    from its largest fitting size down; every run in its own process, micro-batch 1, 2 steps."""
    ladder = dict(micro_batch=1, gas=1, steps=2, warmup=1)
    base = ds_config("zero2", argparse.Namespace(**{**vars(args), **ladder}))
    gpu = (int(args.gpu_memory_gib * 2**30) if args.gpu_memory_gib
           else torch.cuda.get_device_properties(0).total_memory)
    host = gpu_largest.host_memory_available() - int(args.host_reserve_gib * 2**30)
    reserve = int(args.reserve_gib * 2**30)
    nvme = (max(0, gpu_largest.disk_free(args.nvme_path) - int(args.nvme_reserve_gib * 2**30))
            if args.nvme_path else None)
    plans = [gpu_largest.plan(size, gpt_config(size), base, gpu, host, reserve,
                              args.nvme_path, nvme)
             for size in args.sizes.split(",")]
    extra = {"gpu_budget_bytes": gpu, "gpu_capped": bool(args.gpu_memory_gib),
             "host_budget_bytes": host, "reserve_bytes": reserve,
             "nvme_path": args.nvme_path, "nvme_budget_bytes": nvme,
             "plans": [dataclasses.asdict(p) for p in plans]}
    results = []

    def run(arm: str, plan, config: dict) -> dict:
        if time.monotonic() > deadline:
            result = {"config": "zero", "model": plan.size,
                      "error": f"skipped: the run's --budget of {args.budget} s was spent"}
        else:
            path = gpu_largest.write_config(args.out, arm, plan.size, config)
            result = run_config("zero", args, deadline, model=plan.size, config_json=path,
                                bf16_init=True, **ladder)
        result.update(gpu_largest.describe_run(arm, plan))
        results.append(result)
        write_report("largest", facts, results, args, extra)
        return result

    gpu_largest.search(plans, run, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
