"""DeepSpeed-MoE on this CPU machine: zero beside the real DeepSpeed 0.19.8 in one invocation,
the same model, data and JSON config.

    build/ds-venv/bin/python benchmarks/bench_moe.py          # zero and DeepSpeed
    python benchmarks/bench_moe.py --engines zero --steps 2 --out /tmp/moe

World size 2 on gloo. The TinyGPT of the other benchmarks (seed 0) with each block's MLP an
MoE layer (`deepspeed.moe.layer.MoE`, the engine's own: zero's through
zero.compat.deepspeed) of `--experts` copies of that MLP, top-1 gating without random token
selection (so both engines route alike), the load-balancing loss added at 0.01. Expert
parallel size 1 (every rank holds every expert) or 2 (each rank half of them, tokens traded
by all-to-all), at ZeRO stages 1 and 2, fp32 and bf16, and at stage 3 (which DeepSpeed
refuses for its MoE: its rows show the refusal); AdamW, clipping off (DeepSpeed's MoE
norm is built from each rank's own experts' norms, not the whole model's). Every configuration runs in a fresh pair of
processes (launch.spawn_ranks) after a throwaway engine on a 1-layer model pays the one-time
costs: peak memory growth per rank = the peak RSS (VmHWM, reset just before the model is built)
minus the RSS then; step time = the slower rank's, median over the measured steps. Rank 0's
losses are kept: both engines start from the same weights and data.
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
ROWS = [(1, 1, "fp32"), (1, 2, "fp32"), (2, 1, "fp32"), (2, 2, "fp32"), (2, 1, "bf16"),
        (2, 2, "bf16"), (3, 2, "fp32"), (3, 2, "bf16")]  # (stage, ep_size, dtype)


def parse_args(argv=None):
    return cli.moe_beside_deepspeed(__doc__, os.path.join(
        benchmarks.under_test.ROOT, "benchmarks", "results", "moe"), argv)


def _moe_gpt(gpt, moe_class, experts: int, ep_size: int):
    """TinyGPT (seed 0), each block's MLP the experts of an MoE layer."""
    import torch

    from zero.models.tiny_gpt import Block, TinyGPT

    class MoEBlock(Block):
        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            out, l_aux, _ = self.moe(self.ln2(x))
            self.l_aux = l_aux
            return x + out

    class MoEGPT(TinyGPT):
        def forward(self, tokens, targets):
            loss = super().forward(tokens, targets)
            return loss + 0.01 * sum(block.l_aux for block in self.blocks)

    torch.manual_seed(0)
    model = MoEGPT(gpt)
    for block in model.blocks:
        block.__class__ = MoEBlock
        block.moe = moe_class(gpt.n_embd, block.mlp, num_experts=experts, ep_size=ep_size,
                              k=1, use_rts=False, min_capacity=0)
        del block.mlp
    return model


def _run(rank, world, name, args) -> dict:
    """One configuration ("<engine>-s<stage>-ep<n>-<dtype>") on this rank."""
    import torch.distributed as dist

    from zero.models.tiny_gpt import GPTConfig, synthetic_batches

    engine_name, stage, ep_size, dtype = name.split("-")
    stage, ep_size = int(stage[1:]), int(ep_size[2:])
    deepspeed = importlib.import_module(ENGINES[engine_name])
    deepspeed.init_distributed(dist_backend="gloo")
    moe_class = importlib.import_module(deepspeed.__name__ + ".moe.layer").MoE
    config = engine_config(args.micro_batch, 0.0, {"stage": stage}, bf16=dtype == "bf16")
    gpt = GPTConfig(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)

    def train(gpt, batches):
        model = _moe_gpt(gpt, moe_class, args.experts, ep_size)
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          model_parameters=model.parameters())
        times, losses = [], []
        for tokens, targets in batches:
            dist.barrier()
            t0 = time.perf_counter()
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return times, losses

    small = GPTConfig(vocab_size=args.vocab, block_size=8, n_layer=1, n_head=args.n_head,
                      n_embd=args.n_embd)
    train(small, synthetic_batches(small, args.micro_batch, 1))
    batches = synthetic_batches(gpt, args.micro_batch, args.warmup + args.steps,
                                seed=1000 + rank)
    return measured_steps(lambda measured: train(gpt, measured), batches, args.warmup)


def render(rows: dict, args, facts: dict, wall_s: float) -> str:
    lines = header("DeepSpeed-MoE: zero and DeepSpeed 0.19.8, CPU", "bench_moe.py",
                   facts["date"], wall_s, command_line())
    lines += [f"TinyGPT n_layer {args.n_layer}, n_head {args.n_head}, n_embd {args.n_embd}, "
              f"vocab {args.vocab}, sequence {args.seq_len}, micro-batch {args.micro_batch}; "
              f"each MLP an MoE of {args.experts} experts (top-1); AdamW; 2 ranks; "
              f"{args.steps} measured steps after {args.warmup}.", ""]
    table = []
    for stage, ep_size, dtype in ROWS:
        key = f"s{stage}-ep{ep_size}-{dtype}"
        zero, ds = rows.get(f"zero-{key}", {}), rows.get(f"deepspeed-{key}", {})
        cells = [str(stage), str(ep_size), dtype]
        for row in (zero, ds):
            cells += (["failed: " + row["error"], ""] if "error" in row else
                      [f"{row['peak_growth_mib']:.1f}", f"{row['step_s'] * 1000:.0f}"]
                      if row else ["", ""])
        both = "losses" in zero and "losses" in ds
        cells += [f"{zero['peak_growth_mib'] / ds['peak_growth_mib']:.2f}" if both else "",
                  f"{zero['step_s'] / ds['step_s']:.2f}" if both else "",
                  f"{max(abs(a - b) for a, b in zip(zero['losses'], ds['losses'])):.1e}"
                  if both else ""]
        table.append(cells)
    lines += [markdown_table(["stage", "ep", "dtype", "zero peak growth (MiB)", "zero step (ms)",
                              "DS peak growth (MiB)", "DS step (ms)", "memory zero/DS",
                              "step zero/DS", "max loss difference"], table), ""]
    lines += ["ep 1: both ranks hold every expert; ep 2: each rank half of them, tokens "
              "exchanged by two all-to-alls per layer each way.", "",
              "## Machine", "", f"- {facts['cpu']}", f"- load: {facts['load']}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    run_and_publish([f"{engine}-s{stage}-ep{ep_size}-{dtype}" for stage, ep_size, dtype in ROWS
                     for engine in args.engine_list], _run, args, "moe", render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
