"""Stage-3 layouts for scale-out: bytes and step time per layout (plain, qwZ, qgZ, hpZ, ZeRO++'s
three together, MiCS).

    python benchmarks/bench_zeropp.py                       # the full run (~3 minutes)
    python benchmarks/bench_zeropp.py --interleaved-steps 3 --warmup 1 \
        --configs plain-fp32,hpz-fp32 --out /tmp/bench      # smoke test

World size 4 on gloo (CPU), laid out as 2 "nodes" of 2 ranks (LOCAL_WORLD_SIZE=2, so hpZ's
secondary groups and MiCS's shard groups are ranks {0,1} and {2,3}, MiCS's replicate groups
{0,2} and {1,3}). ZeRO stage 3, the TinyGPT of bench_ddp.py,
stage3_param_persistence_threshold 0 and stage3_max_reuse_distance 0 in every layout (every
unit is gathered for its forward and again for its backward: what hpZ is for). One set of 4
processes holds one engine per configuration and steps them round-robin, so load hits every
configuration alike. Bytes: the last measured step's, rank 0, the ZeRO paper's convention (an
all-gather or reduce-scatter of a B-byte buffer moves B, an all-reduce 2B); "cross-node" =
collectives over all 4 ranks and MiCS's replicate groups, "in-node" = hpZ's secondary groups
and MiCS's shard groups.
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

PER_NODE = 2
LAYOUTS = {
    "plain": {},
    "qwz": {"zero_quantized_weights": True},
    "qgz": {"zero_quantized_gradients": True},
    "hpz": {"zero_hpz_partition_size": PER_NODE},
    "all": {"zero_quantized_weights": True, "zero_quantized_gradients": True,
            "zero_hpz_partition_size": PER_NODE},
    "mics": {"mics_shard_size": PER_NODE},
}
ALL_CONFIGS = [f"{layout}-{dtype}" for dtype in ("fp32", "bf16") for layout in LAYOUTS]
STAT_KEYS = ("all_gather_bytes", "reduce_scatter_bytes", "all_reduce_bytes")


def parse_args(argv=None):
    p = interleaved.parser(__doc__, "zeropp", ALL_CONFIGS, warmup=3, steps=20)
    p.set_defaults(world_size=4)
    return p.parse_args(argv)


def _interleaved(rank, world, name, args):
    """Every configuration's engine in this process, stepped round-robin."""
    import zero

    os.environ["LOCAL_WORLD_SIZE"] = str(PER_NODE)
    gpt = gpt_config(args)
    steps, last = {}, {}
    for config_name in args.config_list:
        layout, dtype = config_name.split("-")
        config = engine_config(args.micro_batch, args.clip, {
            "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
            **LAYOUTS[layout]}, bf16=dtype == "bf16")
        engine, *_ = zero.initialize(model=seeded_model(gpt), config=config)

        def step(tokens, targets, engine=engine, name=config_name):
            engine.core.reset_comm_stats()
            loss, phases = engine_step(engine, tokens, targets)
            core = engine.core
            last[name] = {"loss": loss,
                          "cross": _summed(core.comm_stats(), core.mics_replicate_comm_stats()),
                          "in_node": _summed(core.secondary_comm_stats(),
                                             core.mics_shard_comm_stats())}
            return loss, phases
        steps[config_name] = step
    batches = rank_batches(gpt, args.micro_batch, args.warmup + args.interleaved_steps, rank)
    return {"rank": rank, "step_times": interleave_steps(steps, batches, args.warmup),
            "last": last}


def _summed(*stats) -> dict:
    return {key: sum(getattr(s, key) for s in stats) for key in STAT_KEYS}


def summarize(result: dict, configs: list[str]) -> dict:
    rank0 = result["ranks"][0]["last"]
    summary = {}
    for name in configs:
        s = step_stats([rank["step_times"][name] for rank in result["ranks"]])
        last = rank0[name]
        summary[name] = {"median_ms": s["total"]["median"], "p10_ms": s["total"]["p10"],
                         "steps": s["steps"], "last_loss": last["loss"],
                         **{f"cross_{k}": last["cross"][k] for k in STAT_KEYS},
                         **{f"in_node_{k}": last["in_node"][k] for k in STAT_KEYS}}
    return summary


def render(summary: dict, args, facts: dict, command: str, wall: float) -> str:
    def kib(value):
        return f"{value / 1024:.1f}"

    rows = []
    for name, s in summary.items():
        base = summary.get(f"plain-{name.split('-')[1]}")
        cross = sum(s[f"cross_{k}"] for k in STAT_KEYS)
        vs = "-" if base is None else f"{cross / sum(base[f'cross_{k}'] for k in STAT_KEYS):.3f}"
        speed = "-" if base is None else f"{s['median_ms'] / base['median_ms']:.2f}"
        rows.append([name, f"{s['median_ms']:.1f}", f"{s['p10_ms']:.1f}", speed,
                     kib(s["cross_all_gather_bytes"]), kib(s["cross_reduce_scatter_bytes"]),
                     kib(s["cross_all_reduce_bytes"]), kib(s["in_node_all_gather_bytes"]),
                     kib(s["in_node_reduce_scatter_bytes"]), vs,
                     f"{s['last_loss']:.4f}"])
    lines = header("Stage-3 layouts for scale-out (ZeRO++, MiCS): bytes and step time",
                   "bench_zeropp.py",
                   facts["date"], wall, command)
    lines += [f"TinyGPT (vocab {args.vocab}, {args.n_layer} layers, width {args.n_embd}), "
              f"micro-batch {args.micro_batch} x {args.block} tokens per rank, world size "
              f"{args.world_size} (gloo) as {args.world_size // PER_NODE} nodes x {PER_NODE} "
              f"ranks, {args.threads} torch thread(s) per rank; {args.interleaved_steps} measured "
              f"steps per configuration after {args.warmup} warm-up steps, round-robin in one set "
              "of processes. qwz = zero_quantized_weights, qgz = zero_quantized_gradients, hpz = "
              f"zero_hpz_partition_size {PER_NODE}, all = the three, mics = mics_shard_size "
              f"{PER_NODE}. Bytes in KiB per step, rank 0.",
              "", markdown_table(
                  ["configuration", "median step (ms)", "p10 (ms)", "step / plain",
                   "cross-node all-gather", "cross-node reduce-scatter", "cross-node all-reduce",
                   "in-node all-gather", "in-node reduce-scatter", "cross-node bytes / plain",
                   "loss at the last step"], rows),
              "", "On one machine the \"nodes\" share memory bandwidth: gloo over loopback makes "
              "bytes cheap, while quantizing costs CPU time, so the step times here show the "
              "cost of the int8 code, not the saving a slow inter-node link would bring."]
    lines += interleaved.footer(facts)
    return "\n".join(lines)


def main(argv=None):
    args = settle(parse_args(argv), ALL_CONFIGS)
    return interleaved.run("zeropp", _interleaved, args, summarize, render)


if __name__ == "__main__":
    sys.exit(main())
