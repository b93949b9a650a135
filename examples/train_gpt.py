"""The main job: a small GPT trained data-parallel by zero, configured by a DeepSpeed JSON.

    zero --num_procs 2 examples/train_gpt.py --deepspeed_config configs/stage2.json

Every rank prints nothing but rank 0's progress; at the end every rank prints its memory
report (measured bytes per category beside the ZeRO formula).
"""
import argparse
import json

import torch
import torch.distributed as dist

import zero
from zero.init import full_numel
from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="passed by the launcher (zero / deepspeed)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    return zero.add_config_arguments(parser).parse_args()


def _stage(config_path) -> int:
    with open(config_path) as file:
        return int(json.load(file).get("zero_optimization", {}).get("stage", 0))


def main():
    args = parse_args()
    zero.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # At stage 3 the model is built already partitioned: no rank ever holds all of it.
    with zero.Init(config_dict_or_path=args.deepspeed_config,
                   enabled=_stage(args.deepspeed_config) == 3):
        model = TinyGPT(GPTConfig(vocab_size=512, block_size=64, n_layer=args.n_layer,
                                  n_head=4, n_embd=args.n_embd))
    engine, _, _, _ = zero.initialize(args=args, model=model,
                                      model_parameters=model.parameters())
    gas = engine.gradient_accumulation_steps()
    micro = engine.train_micro_batch_size_per_gpu()
    data = synthetic_batches(model.config, micro, args.steps * gas * world, seed=1)
    if rank == 0:
        print(f"training {sum(full_numel(p) for p in model.parameters()):,} parameters on {world} "
              f"ranks: ZeRO stage {engine.stage}, {engine.dtype}, micro-batch {micro}, "
              f"accumulation {gas}", flush=True)
    for step in range(args.steps):
        total = torch.zeros(1)
        for micro_step in range(gas):
            tokens, targets = data[(step * gas + micro_step) * world + rank]
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        done = engine.global_steps  # counted as the engine's reports count it (from 1)
        if rank == 0 and (done == 1 or done % 10 == 0 or step == args.steps - 1):
            print(f"step {done:4d}  loss {total.item() / (gas * world):.4f}  "
                  f"lr {engine.get_lr()[0]:.2e}  grad-norm "
                  f"{engine.get_global_grad_norm() or 0.0:.3f}", flush=True)
    for r in range(world):  # every rank's table, in rank order
        if r == rank:
            engine.print_memory_report()
        dist.barrier()
    engine.final_memory_report(show=False)  # the run's last JSON line per rank (memory_report.path)


if __name__ == "__main__":
    main()
