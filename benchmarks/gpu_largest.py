"""The largest GPT that trains on one GPU, without offload and with it, found with zero's own
tuner (`zero-mem tune`, zero/reports/tuner.py) as a user would find it.

For every size on the ladder the tuner is asked twice, on the model built on the meta device
(nothing allocated): once with offload forbidden, once allowed, against this machine's GPU
memory (or --gpu-memory-gib) and host memory (MemAvailable), keeping back the model's own
activations for one micro-batch (zero/reports/activations.py) plus --reserve-gib for the CUDA
context, cuBLAS workspaces and the allocator's slack. Then, each arm from the largest size its
tuner says fits, downwards until a size trains:

    no offload   the tuner's configuration without offload; then the next size up with the
                 plain zero2 configuration, to show where it stops (its failure is the point)
    offload      the tuner's configuration with offload (part of the optimizer, the whole
                 optimizer and, when it must, parameters in host memory; with --nvme-path
                 also on NVMe), only sizes above the no-offload arm's largest

The report gives, per run, the tuner's estimate of device and host bytes beside the measured
GPU peak and host RSS peak, and the ratio of the two arms' largest sizes (the issue's goal:
offload trains a model at least 2x larger than fits without it). Models are built in bf16 on
the GPU (the engine makes the fp32 master from them), so building costs no fp32 copy."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import torch

from benchmarks import facts
from zero.models.tiny_gpt import TinyGPT
from zero.reports import estimate as est
from zero.reports import tuner
from zero.reports.activations import SampleInput, estimate_activations

GiB = 2**30


@dataclasses.dataclass
class Plan:
    """What the tuner says of one size: the configuration per arm, or why none fits."""
    size: str
    params: int
    activation_bytes: int
    configs: dict            # arm -> DeepSpeed config dict, or None
    estimates: dict          # arm -> the chosen candidate's to_dict(), or None
    tuned: dict              # arm -> the chosen candidate in words, or None
    why_not: dict            # arm -> the tuner's reason when nothing fits


def host_memory_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def disk_free(path: str) -> int:
    """Free bytes for swap files under `path`, which is made here if missing (the engine
    makes no nvme_path). A path in memory (tmpfs, ramfs) is refused: its files would take
    the host memory the tuner gives the offload."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise SystemExit(f"--nvme-path {path}: cannot make it ({error}); name a writable "
                         "directory on a disk") from None
    kind = facts.filesystem_type(path)
    if kind in facts.MEMORY_FILESYSTEMS:
        raise SystemExit(f"--nvme-path {path} is on {kind}, which is memory: name a directory "
                         "on a disk (e.g. under /var/tmp)")
    return shutil.disk_usage(path).free


def plan(size: str, gpt, base_config: dict, gpu_bytes: int, host_bytes: int,
         reserve_bytes: int, nvme_path: str | None = None, nvme_bytes: int | None = None
         ) -> Plan:
    """The tuner's choice for one size, without and with offload (NVMe too with a path:
    swap files under nvme_path, at most nvme_bytes)."""
    model = est.build_on_meta(TinyGPT, gpt)
    shapes = est.shapes_from_module(model)
    setup, _ = est.setup_from_config(base_config, world_size=1)
    sample = SampleInput.parse(f"{base_config['train_micro_batch_size_per_gpu']}x"
                               f"{gpt.block_size}:int64")
    activations = estimate_activations(lambda: TinyGPT(gpt), [sample], torch.bfloat16)
    configs, estimates, tuned, why_not = {}, {}, {}, {}
    for arm, offload in (("no offload", False), ("offload", True)):
        rec = tuner.tune(shapes, setup, gpu_bytes, host_budget=host_bytes,
                         reserve=activations + reserve_bytes, offload=offload,
                         nvme_path=nvme_path, nvme_budget=nvme_bytes)
        if rec.chosen is None:
            closest = min(rec.tried, key=lambda c: c.total, default=None)
            why_not[arm] = closest.verdict if closest else "; ".join(rec.notes)
            configs[arm] = estimates[arm] = tuned[arm] = None
            continue
        configs[arm], _ = tuner.recommended_config(rec, setup, base_config,
                                                   micro_batch=sample.shape[0])
        estimates[arm] = rec.chosen.to_dict()
        tuned[arm] = rec.chosen.describe()
    return Plan(size, sum(p.numel() for p in model.parameters()), activations, configs,
                estimates, tuned, why_not)


def search(plans: list[Plan], run, fallback_config: dict) -> list[dict]:
    """Runs each arm from its largest fitting size down until one trains (run(arm, plan,
    config) -> result dict, "error" in it when it did not train); unless a size above the
    no-offload arm's largest already failed with the tuner's configuration, that arm then
    goes up the ladder with fallback_config until a size fails."""
    results = []

    def first_that_trains(arm, candidates):
        for p in sorted(candidates, key=lambda p: p.params, reverse=True):
            results.append(run(arm, p, p.configs[arm]))
            if "error" not in results[-1]:
                return p
        return None

    largest = first_that_trains("no offload", [p for p in plans if p.configs["no offload"]])
    above = [p for p in plans if largest is None or p.params > largest.params]
    if any("error" in r and r["params"] > (largest.params if largest else 0) for r in results):
        above = []  # the failure above the largest is already on record
    for p in sorted(above, key=lambda p: p.params):
        results.append(run("no offload (past the tuner)", p, fallback_config))
        if "error" in results[-1]:
            break
    floor = max((r["params"] for r in results if "error" not in r), default=0)
    first_that_trains("offload", [p for p in plans if p.configs["offload"] and
                                  p.params > floor])
    return results


def verdict(results: list[dict]) -> str:
    """The two arms' largest sizes and their ratio, in one line."""
    def largest(prefix):
        trained = [r for r in results if r["arm"].startswith(prefix) and "error" not in r]
        return max(trained, key=lambda r: r["params"], default=None)

    without, with_ = largest("no offload"), largest("offload")
    if without is None or with_ is None:
        return (f"largest without offload: {_name(without)}; with offload: {_name(with_)}; "
                "no ratio (an arm trained nothing)")
    ratio = with_["params"] / without["params"]
    return (f"largest without offload: {_name(without)}; with offload: {_name(with_)} "
            f"({with_['tuned']}): {ratio:.2f}x larger (goal: at least 2x)")


def _name(result: dict | None) -> str:
    return "none" if result is None else f"{result['model']} ({result['params'] / 1e9:.2f} B)"


def describe_run(arm: str, plan: Plan) -> dict:
    """What a run's row shows beside its measurements: its arm, size and the tuner's word."""
    tuned_arm = arm.split(" (")[0]
    tuned = plan.tuned.get(arm) or (f"zero2 as configured; the tuner: "
                                    f"{plan.why_not.get(tuned_arm, '-')}")
    return {"arm": arm, "params": plan.params, "tuned": tuned,
            "estimate": plan.estimates.get(arm)}


def budget_line(extra: dict) -> str:
    capped = " (capped with --gpu-memory-gib)" if extra["gpu_capped"] else ""
    nvme = (f"; NVMe {_gib(extra['nvme_budget_bytes'])} GiB under {extra['nvme_path']} (free "
            f"space less --nvme-reserve-gib)" if extra.get("nvme_path") else "; no NVMe")
    return (f"Budgets given to the tuner: GPU {_gib(extra['gpu_budget_bytes'])} GiB{capped}, "
            f"of which one micro-batch's activations + {_gib(extra['reserve_bytes'])} GiB are "
            f"kept back; host {_gib(extra['host_budget_bytes'])} GiB (MemAvailable less "
            f"--host-reserve-gib){nvme}. Each arm runs from the largest size its tuner fits, "
            f"downwards until one trains.")


PLAN_HEADER = ["size", "params", "activations GiB", "tuner, no offload", "tuner, offload"]


def plan_rows(plans: list[dict]) -> list[list]:
    """The tuner's answer per size (plans as dataclasses.asdict(Plan))."""
    def answer(p, arm):
        if p["tuned"][arm]:
            e = p["estimates"][arm]
            return (f"{p['tuned'][arm]} (device {_gib(e['device_bytes'])}, host "
                    f"{_gib(e['host_bytes'])} GiB)")
        return "none fits: " + p["why_not"][arm]
    return [[p["size"], f"{p['params'] / 1e9:.2f}B", _gib(p["activation_bytes"]),
             answer(p, "no offload"), answer(p, "offload")] for p in plans]


def rows(results: list[dict]) -> list[list]:
    """The report's table: each run's tuner estimate beside what it measured."""
    table = []
    for r in results:
        estimate = r.get("estimate") or {}
        cells = [r["arm"], r["model"], f"{r['params'] / 1e9:.2f}B", r.get("tuned", "-"),
                 _gib(estimate.get("device_bytes")), _gib(estimate.get("host_bytes"))]
        if "error" in r:
            table.append(cells + ["", "", "", "failed: " + r["error"].replace("|", "/")])
        else:
            table.append(cells + [_gib(r["gpu_peak_bytes"]), _gib(r["rss_peak_bytes"]),
                                  f"{r['total_s']:.2f}",
                                  f"{r['losses'][0]:.3f}→{r['losses'][-1]:.3f}"])
    return table


HEADER = ["arm", "model", "params", "configuration (tuner)", "estimated device GiB",
          "estimated host GiB", "GPU peak GiB", "host RSS peak GiB", "step s",
          "loss first→last"]


def _gib(value) -> str:
    return "-" if value is None else f"{value / GiB:.1f}"


def write_config(out_dir: str, arm: str, size: str, config: dict) -> str:
    """The configuration a run trains with, kept beside the results."""
    os.makedirs(out_dir, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in arm).strip("-")
    path = os.path.join(out_dir, f"largest-{size}-{slug}.json")
    with open(path, "w") as handle:
        json.dump(config, handle, indent=2)
    return path
