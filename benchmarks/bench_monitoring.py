"""What watching a run costs: zero's step time with each monitor block on, against all off.

    python benchmarks/bench_monitoring.py                      # the full run (~2 minutes)
    python benchmarks/bench_monitoring.py --interleaved-steps 5 --warmup 2 \
        --configs off,tensorboard --out /tmp/bench             # smoke test

World size 2 on gloo (CPU), ZeRO stage 2, the TinyGPT of bench_ddp.py. One pair of processes
holds one engine per configuration and steps them round-robin (config A step i, config B step
i, ...), so load from other processes hits every configuration alike. steps_per_print stays
at its default (null): the monitors write every optimizer step (lr, loss, timers, payload
bytes, every rank's memory: one small all-gather), wall_clock_breakdown prints its line every
step. wandb runs offline (WANDB_MODE=offline), comet with "online": false; both write under a
temporary folder. The FLOPs profiler profiles one step (profile_step 1), as configured by
default, so its cost is that step's and not the median's.

Overhead = median step time with the block on / median with every block off - 1.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchmarks.under_test  # noqa: E402,F401  (first: which zero)
from benchmarks import interleaved  # noqa: E402
from benchmarks.cli import settle  # noqa: E402
from benchmarks.models import engine_config, gpt_config, rank_batches, seeded_model  # noqa: E402
from benchmarks.report import header, markdown_table  # noqa: E402
from benchmarks.timing import engine_step, interleave_steps, step_stats  # noqa: E402


def monitor_blocks(out: str) -> dict[str, dict]:
    """Each configuration's config blocks on top of the plain engine config."""
    def folder(job):
        return {"enabled": True, "output_path": out, "job_name": job}
    blocks = {
        "off": {},
        "tensorboard": {"tensorboard": folder("tb")},
        "csv_monitor": {"csv_monitor": folder("csv")},
        "wandb": {"wandb": {"enabled": True, "project": "bench"}},
        "comet": {"comet": {"enabled": True, "online": False, "project": "bench"}},
        "wall_clock_breakdown": {"wall_clock_breakdown": True},
        "comms_logger": {"comms_logger": {"enabled": True}},
        "flops_profiler": {"flops_profiler": {"enabled": True, "output_file": os.path.join(out, "flops.txt")}},
    }
    blocks["all"] = {key: value for config in blocks.values() for key, value in config.items()}
    return blocks


ALL_CONFIGS = list(monitor_blocks(""))


def parse_args(argv=None):
    return interleaved.parser(__doc__, "monitoring", ALL_CONFIGS, warmup=5,
                              steps=60).parse_args(argv)


def _interleaved(rank, world, name, args):
    """Every configuration's engine in this process, stepped round-robin."""
    import zero

    out = args.monitor_dir  # the same on every rank: the ranks check they share one config
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=out,
                      COMET_OFFLINE_DIRECTORY=out)
    gpt = gpt_config(args)
    steps = {}
    for config_name in args.config_list:
        config = engine_config(args.micro_batch, args.clip,
                               {"stage": 2, "reduce_bucket_size": 5e5, "overlap_comm": True})
        config.update(monitor_blocks(os.path.join(out, config_name))[config_name])
        engine, *_ = zero.initialize(model=seeded_model(gpt), config=config)
        steps[config_name] = lambda tokens, targets, engine=engine: engine_step(engine, tokens, targets)
    batches = rank_batches(gpt, args.micro_batch, args.warmup + args.interleaved_steps, rank)
    return {"rank": rank, "step_times": interleave_steps(steps, batches, args.warmup)}


def summarize(result: dict, configs: list[str]) -> dict:
    stats = {name: step_stats([rank["step_times"][name] for rank in result["ranks"]])
             for name in configs}
    off = stats.get("off", {}).get("total")
    return {name: {"median_ms": s["total"]["median"], "p10_ms": s["total"]["p10"],
                   "steps": s["steps"],
                   "overhead": None if off is None else s["total"]["median"] / off["median"] - 1,
                   "overhead_p10": None if off is None else s["total"]["p10"] / off["p10"] - 1}
            for name, s in stats.items()}


def render(summary: dict, args, facts: dict, command: str, wall: float) -> str:
    def vs_off(name, value):
        return "-" if value is None or name == "off" else f"{100 * value:+.1f}%"
    rows = [[name, f"{s['median_ms']:.1f}", f"{s['p10_ms']:.1f}", vs_off(name, s["overhead"]),
             vs_off(name, s["overhead_p10"])] for name, s in summary.items()]
    lines = header("Monitoring overhead: zero stage 2 with each monitor block on",
                   "bench_monitoring.py", facts["date"], wall, command)
    lines += [f"TinyGPT (vocab {args.vocab}, {args.n_layer} layers, width {args.n_embd}), micro-batch "
              f"{args.micro_batch} x {args.block} tokens per rank, world size {args.world_size} (gloo), "
              f"{args.threads} torch threads per rank; {args.interleaved_steps} measured steps per "
              f"configuration after {args.warmup} warm-up steps, all configurations stepping "
              "round-robin in one pair of processes; steps_per_print at its default (null).", "",
              markdown_table(["configuration", "median step (ms)", "p10 (ms)", "median vs off",
                              "p10 vs off"], rows), "",
              "The p10 (the fast end of each configuration's steps) is the steadier comparison "
              "when other processes share the cores: load lengthens some steps of every "
              "configuration but rarely its fastest."]
    lines += interleaved.footer(facts)
    return "\n".join(lines)


def _monitor_dir(args, tmp):
    args.monitor_dir = tmp  # the same on every rank: the ranks check they share one config


def main(argv=None):
    args = settle(parse_args(argv), ALL_CONFIGS)
    return interleaved.run("monitoring", _interleaved, args, summarize, render,
                           prepare=_monitor_dir)


if __name__ == "__main__":
    sys.exit(main())
