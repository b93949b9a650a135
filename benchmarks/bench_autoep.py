"""AutoEP (`expert_parallel`) on this CPU machine: a Hugging Face Mixtral trained by zero and by
the real DeepSpeed 0.19.8 in one invocation, with its experts split over the 2 ranks and
whole on each, the same model, data and JSON config.

    build/ds-venv/bin/python benchmarks/bench_autoep.py         # zero and DeepSpeed
    python benchmarks/bench_autoep.py --engines zero --steps 2 --out /tmp/autoep

World size 2 on gloo. A MixtralForCausalLM built from its config (seed 0; `--n-layer`
layers of `--experts` experts, top-2, hidden `--n-embd`, intermediate 2x), the router's
load-balancing loss in the loss; AdamW, clipping 1.0; ZeRO stages 2 and 3, fp32, with
`"expert_parallel": {"enabled": true, "autoep_size": 2}` (each rank half of the experts,
tokens exchanged by all-to-all) and without it (every rank every expert). Every configuration
runs in a fresh pair of processes (launch.spawn_ranks) after a throwaway engine on a 1-layer
model pays the one-time costs: peak memory growth per rank = the peak RSS (VmHWM, reset
just before the model is built) minus the RSS then; step time = the slower rank's, median
over the measured steps; rank 0's losses are kept.
"""
from __future__ import annotations

import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchmarks.under_test  # noqa: E402,F401  (first: which zero)
from benchmarks import cli  # noqa: E402
from benchmarks.launch import measured_steps, run_and_publish  # noqa: E402
from benchmarks.models import engine_config  # noqa: E402
from benchmarks.report import header, markdown_table  # noqa: E402
from benchmarks.under_test import command_line  # noqa: E402

ENGINES = {"zero": "zero.compat.deepspeed", "deepspeed": "deepspeed"}
ROWS = [(2, 0), (2, 2), (3, 0), (3, 2)]  # (stage, autoep_size: 0 off)


def parse_args(argv=None):
    return cli.moe_beside_deepspeed(__doc__, os.path.join(
        benchmarks.under_test.ROOT, "benchmarks", "results", "autoep"), argv)


def _mixtral(args, n_layer: int):
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=2 * args.n_embd,
        num_hidden_layers=n_layer, num_attention_heads=args.n_head,
        num_key_value_heads=args.n_head, num_local_experts=args.experts,
        num_experts_per_tok=2, max_position_embeddings=args.seq_len,
        output_router_logits=True))


def _run(rank, world, name, args) -> dict:
    """One configuration ("<engine>-s<stage>-ep<n>") on this rank."""
    import torch
    import torch.distributed as dist

    engine_name, stage, autoep = name.split("-")
    stage, autoep = int(stage[1:]), int(autoep[2:])
    deepspeed = importlib.import_module(ENGINES[engine_name])
    deepspeed.init_distributed(dist_backend="gloo")
    config = engine_config(args.micro_batch, 1.0, {"stage": stage})
    if autoep:
        config["expert_parallel"] = {"enabled": True, "autoep_size": autoep}

    def train(n_layer, batches):
        model = _mixtral(args, n_layer)
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          model_parameters=model.parameters())
        times, losses = [], []
        for tokens in batches:
            dist.barrier()
            t0 = time.perf_counter()
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)
            engine.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return times, losses

    def batches(count, seq, seed):
        generator = torch.Generator().manual_seed(seed)
        return [torch.randint(0, args.vocab, (args.micro_batch, seq), generator=generator)
                for _ in range(count)]

    train(1, batches(1, 8, 0))
    measured = batches(args.warmup + args.steps, args.seq_len, 1000 + rank)
    return measured_steps(lambda steps: train(args.n_layer, steps), measured, args.warmup)


def render(rows: dict, args, facts: dict, wall_s: float) -> str:
    lines = header("AutoEP (expert_parallel): zero and DeepSpeed 0.19.8, CPU", "bench_autoep.py",
                   facts["date"], wall_s, command_line())
    lines += [f"MixtralForCausalLM: {args.n_layer} layers of {args.experts} experts (top-2), "
              f"hidden {args.n_embd}, intermediate {2 * args.n_embd}, vocab {args.vocab}, "
              f"sequence {args.seq_len}, micro-batch {args.micro_batch}; AdamW; 2 ranks; "
              f"{args.steps} measured steps after {args.warmup}.", ""]
    table = []
    for stage, autoep in ROWS:
        cells = [str(stage), str(autoep) if autoep else "off"]
        for engine in ("zero", "deepspeed"):
            row = rows.get(f"{engine}-s{stage}-ep{autoep}", {})
            cells += (["failed: " + row["error"], ""] if "error" in row else
                      [f"{row['peak_growth_mib']:.1f}", f"{row['step_s'] * 1000:.0f}"]
                      if row else ["", ""])
        off = rows.get(f"zero-s{stage}-ep0", {})
        mine = rows.get(f"zero-s{stage}-ep{autoep}", {})
        cells.append(f"{max(abs(a - b) for a, b in zip(mine['losses'], off['losses'])):.1e}"
                     if "losses" in mine and "losses" in off else "")
        table.append(cells)
    lines += [markdown_table(["stage", "autoep_size", "zero peak growth (MiB)", "zero step (ms)",
                              "DS peak growth (MiB)", "DS step (ms)",
                              "zero: max loss difference to autoep off"], table), ""]
    lines += ["autoep_size 2: each rank holds half of every layer's experts (and their "
              "optimizer states), tokens exchanged by two all-to-alls per layer each way; "
              "off: every rank holds every expert.", "",
              "## Machine", "", f"- {facts['cpu']}", f"- load: {facts['load']}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    run_and_publish([f"{engine}-s{stage}-ep{autoep}" for stage, autoep in ROWS
                     for engine in args.engine_list], _run, args, "autoep", render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
