"""The command-line flags the benchmarks share, each benchmark with its own defaults, and how
they are read (the configurations chosen, the threads per rank)."""
from __future__ import annotations

import argparse
import os
import sys


def add_run_args(parser, steps: int, steps_help: str, warmup: int, interleaved_steps: int):
    """World size, measured and warm-up steps, and the interleaved timing run's steps."""
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--warmup", type=int, default=warmup, help="unmeasured steps first")
    parser.add_argument("--interleaved-steps", type=int, default=interleaved_steps,
                        help="measured steps per configuration in the interleaved timing run "
                             "(0 skips it)")


def add_model_args(parser, micro_batch: int, vocab: int, n_layer: int, n_embd: int) -> None:
    """The micro-batch per rank and TinyGPT's sizes, with this benchmark's defaults (block
    128 and 8 heads everywhere)."""
    parser.add_argument("--micro-batch", type=int, default=micro_batch)
    parser.add_argument("--vocab", type=int, default=vocab)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=n_layer)
    parser.add_argument("--n-head", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=n_embd)


def add_comparison_args(parser, all_configs: list[str]) -> None:
    """Torch threads per rank, gradient clipping (both sides) and the configurations to run."""
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (0: cores // world_size, at least 1)")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient clipping (both)")
    parser.add_argument("--configs", default=",".join(all_configs),
                        help="comma-separated subset of " + ",".join(all_configs))


def add_beside_deepspeed_args(parser, n_head: int, out_dir: str) -> None:
    """zero beside the real DeepSpeed in one invocation on 2 ranks (bench_ulysses, bench_moe):
    the engines, TinyGPT's sizes, measured and warm-up steps, torch threads per rank and the
    results' folder; read back with beside_deepspeed()."""
    parser.add_argument("--engines", default="zero,deepspeed")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=n_head)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--out", default=out_dir)


def moe_beside_deepspeed(doc: str, out_dir: str, argv=None):
    """The flags of an MoE benchmark beside DeepSpeed (bench_moe, bench_autoep): experts per
    layer, sequence length and micro-batch, then add_beside_deepspeed_args'; parsed."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    add_beside_deepspeed_args(parser, n_head=4, out_dir=out_dir)
    return beside_deepspeed(parser.parse_args(argv))


def beside_deepspeed(args):
    """add_beside_deepspeed_args' settings completed: 2 ranks and the engines as a list."""
    args.world_size = 2
    args.engine_list = args.engines.split(",")
    return args


def threads_per_rank(args) -> int:
    """--threads, or (0) the cores shared out over the ranks, at least 1."""
    return args.threads if args.threads > 0 else max(1, (os.cpu_count() or 1) // args.world_size)


def chosen_configs(configs: str, known: list[str]) -> list[str]:
    """--configs as a list without repeats; exits naming any unknown one."""
    chosen = list(dict.fromkeys(c.strip() for c in configs.split(",") if c.strip()))
    unknown = [c for c in chosen if c not in known]
    if unknown:
        sys.exit(f"unknown configs {unknown}; choose from {known}")
    return chosen


def settle(args, known: list[str]):
    """The derived settings every comparison reads: threads per rank and the chosen configs."""
    args.threads = threads_per_rank(args)
    args.config_list = chosen_configs(args.configs, known)
    return args
