"""Sequence parallelism (DeepSpeed-Ulysses) on this CPU machine: how much memory a rank needs
for one long sequence, and what a step costs, with and without it, zero beside the real
DeepSpeed 0.19.8 in one invocation.

    build/ds-venv/bin/python benchmarks/bench_ulysses.py          # zero and DeepSpeed
    python benchmarks/bench_ulysses.py --engines zero --seq-lens 256 --steps 2 --out /tmp/u

World size 2 on gloo. The TinyGPT of the other benchmarks (seed 0), its attention run through
the engine's own `deepspeed.sequence.layer.DistributedAttention` over a sequence group of
both ranks (sp 2: each rank holds half of the one sample's sequence, and the whole sequence
for half of the heads inside attention), or plain (sp 1: two data-parallel ranks, each its
own sample). ZeRO-3, fp32, AdamW, one micro-batch of one sample per step; the sequence
groups from DeepSpeed's parallel_state_sp as the mpu, as Ulysses for Hugging Face passes
them. Every configuration runs in a fresh pair of processes (launch.spawn_ranks), where a
throwaway engine on a 1-layer model pays the one-time costs first (imports, DeepSpeed's built
ops): peak memory growth per rank = the kernel's peak RSS (VmHWM, reset just before the
model is built) minus the RSS then; step time = the slower rank's, median over the measured
steps. Rank 0's losses are kept: zero and DeepSpeed start from the same weights and data, and at ZeRO-3 both
average the gradients over all ranks, so their losses agree.
"""
from __future__ import annotations

import argparse
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", default="1024,2048,4096")
    cli.add_beside_deepspeed_args(p, n_head=8, out_dir=os.path.join(
        benchmarks.under_test.ROOT, "benchmarks", "results", "ulysses"))
    args = cli.beside_deepspeed(p.parse_args(argv))
    args.seq_list = [int(n) for n in args.seq_lens.split(",")]
    return args


def _ulysses_gpt(gpt, attention_class, group):
    """TinyGPT (seed 0) taking a piece of the sequence at `start`, its attention over `group`
    through `attention_class` (group None: plain attention on what the rank holds)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from zero.models.tiny_gpt import CausalSelfAttention, TinyGPT

    class Attention(nn.Module):  # [batch, seq, heads, dim] in and out, causal
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                  is_causal=True).transpose(1, 2)

    class PieceAttention(CausalSelfAttention):
        def forward(self, x):
            batch, length, channels = x.shape
            q, k, v = (t.view(batch, length, self.n_head, -1)
                       for t in self.qkv(x).split(channels, dim=2))
            y = self.ulysses(q, k, v) if group is None else self.ulysses(q, k, v, 0)
            return self.proj(y.reshape(batch, length, channels))

    class PieceGPT(TinyGPT):
        def forward(self, tokens, targets, start):
            x = self.token_embedding(tokens) + self.position_embedding(
                torch.arange(start, start + tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    torch.manual_seed(0)
    model = PieceGPT(gpt)
    for block in model.blocks:
        block.attn.__class__ = PieceAttention
        block.attn.ulysses = Attention() if group is None else \
            attention_class(Attention(), group, 2, 1)
    return model


def _run(rank, world, name, args) -> dict:
    """One configuration ("<engine>-sp<s>-<length>") on this rank: memory, times, losses."""
    import torch
    import torch.distributed as dist

    from zero.models.tiny_gpt import GPTConfig, synthetic_batches

    engine_name, sp, length = name.split("-")
    sp, length = int(sp[2:]), int(length)
    deepspeed = importlib.import_module(ENGINES[engine_name])
    deepspeed.init_distributed(dist_backend="gloo")
    state = importlib.import_module(deepspeed.__name__ +
                                    ".runtime.sequence_parallel.parallel_state_sp")
    layer = importlib.import_module(deepspeed.__name__ + ".sequence.layer")
    gpt = GPTConfig(vocab_size=args.vocab, block_size=length, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    mpu = None
    if sp > 1:
        state.initialize_sequence_parallel(sp)
        mpu = state
    config = engine_config(1, 1.0, {"stage": 3, "reduce_bucket_size": 500_000})
    group = state.get_sequence_parallel_group() if sp > 1 else None

    def train(gpt, batches):
        model = _ulysses_gpt(gpt, layer.DistributedAttention, group)
        engine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu,
                                          model_parameters=model.parameters())
        piece = gpt.block_size // sp
        start = piece * (rank % sp)
        times, losses = [], []
        for tokens, targets in batches:
            dist.barrier()
            t0 = time.perf_counter()
            loss = engine(tokens[:, start:start + piece], targets[:, start:start + piece],
                          start)
            engine.backward(loss)
            engine.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return times, losses

    # a throwaway engine first pays the one-time costs (imports, DeepSpeed's built ops)
    small = GPTConfig(vocab_size=args.vocab, block_size=2 * sp, n_layer=1, n_head=args.n_head,
                      n_embd=args.n_embd)
    train(small, synthetic_batches(small, 1, 1))
    batches = synthetic_batches(gpt, 1, args.warmup + args.steps, seed=1000 + rank // sp)
    return measured_steps(lambda measured: train(gpt, measured), batches, args.warmup)


def render(rows: dict, args, facts: dict, wall_s: float) -> str:
    lines = header("Sequence parallelism (Ulysses): zero and DeepSpeed 0.19.8, CPU",
                   "bench_ulysses.py", facts["date"], wall_s, command_line())
    lines += [f"TinyGPT n_layer {args.n_layer}, n_head {args.n_head}, n_embd {args.n_embd}, "
              f"vocab {args.vocab}; ZeRO-3 fp32 AdamW; 2 ranks; one sample per step; "
              f"{args.steps} measured steps after {args.warmup}.", ""]
    table = []
    for name, row in rows.items():
        engine, sp, length = name.split("-")
        if "error" in row:
            table.append([engine, sp[2:], length, "failed: " + row["error"], "", "", ""])
            continue
        other = rows.get("-".join(("deepspeed" if engine == "zero" else "zero", sp, length)), {})
        apart = (f"{max(abs(a - b) for a, b in zip(row['losses'], other['losses'])):.1e}"
                 if "losses" in other else "")
        table.append([engine, sp[2:], length, f"{row['peak_growth_mib']:.1f}",
                      f"{row['step_s'] * 1000:.0f}",
                      f"{row['losses'][0]:.4f} / {row['losses'][-1]:.4f}", apart])
    lines += [markdown_table(["engine", "sp", "sequence", "peak growth per rank (MiB)",
                              "step (ms)", "rank 0 loss first / last",
                              "max loss difference to the other engine"], table), ""]
    lines += ["sp 1: each rank its own sample of the whole sequence (two data-parallel "
              "ranks); sp 2: the two ranks share one sample, each holding half of it.", "",
              "## Machine", "", f"- {facts['cpu']}", f"- load: {facts['load']}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    run_and_publish([f"{engine}-sp{sp}-{length}" for length in args.seq_list for sp in (1, 2)
                     for engine in args.engine_list], _run, args, "ulysses", render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
