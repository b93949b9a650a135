"""A script in the shape of DeepSpeedExamples' AutoTP example
(training/tensor_parallel/basic_example/autotp_example.py): it builds its own tensor and
data groups, hands them to the engine as an `mpu`, turns AutoTP on in the config
(`tensor_parallel.autotp_size`, with the `data_parallel_size` that example writes), trains a
Hugging Face causal LM loaded from a directory with a torch optimizer, and broadcasts each
batch over its tensor group. The one line that differs from a `deepspeed` script is the
import below; the device comes from get_accelerator(), so it runs on a CPU too.

    python -c "from examples.deepspeed.autotp_mpu import save_tiny_llama; save_tiny_llama('tiny')"
    zero --num_procs 4 examples/deepspeed/autotp_mpu.py --model_name tiny --tp_size 2 --dp_size 2
"""
import argparse
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import zero.compat.deepspeed as deepspeed   # the one changed line (was: import deepspeed)


@dataclass
class ModelParallelUnit:
    """What the engine asks of the script's groups (DeepSpeed's mpu protocol)."""

    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    tp_size: int
    dp_size: int
    tp_rank: int
    dp_rank: int

    def get_model_parallel_group(self):
        return self.tp_group

    def get_model_parallel_world_size(self):
        return self.tp_size

    def get_model_parallel_rank(self):
        return self.tp_rank

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self):
        return self.dp_size

    def get_data_parallel_rank(self):
        return self.dp_rank


def parse_args():
    parser = argparse.ArgumentParser(description="AutoTP with the script's own groups")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--model_name", type=str, required=True)
    parser.add_argument("--tp_size", type=int, default=2)
    parser.add_argument("--dp_size", type=int, default=1)
    parser.add_argument("--zero_stage", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_length", type=int, default=16)
    parser.add_argument("--num_steps", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--precision", type=str, default="fp32", choices=["bf16", "fp16", "fp32"])
    return parser.parse_args()


def tensor_and_data_groups(rank, tp_size, dp_size):
    """Consecutive ranks share a tensor group (ranks 0..tp-1, ...); every rank creates every
    group, as torch.distributed requires."""
    tp_groups = [dist.new_group(list(range(d * tp_size, (d + 1) * tp_size)))
                 for d in range(dp_size)]
    dp_groups = [dist.new_group(list(range(t, tp_size * dp_size, tp_size)))
                 for t in range(tp_size)]
    return tp_groups[rank // tp_size], dp_groups[rank % tp_size], rank % tp_size, rank // tp_size


def main():
    args = parse_args()
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tp_size * args.dp_size != world:
        raise SystemExit(f"tp_size {args.tp_size} x dp_size {args.dp_size} != world {world}")
    accelerator = deepspeed.get_accelerator()
    device = torch.device(accelerator.device_name(rank % accelerator.device_count()))
    tp_group, dp_group, tp_rank, dp_rank = tensor_and_data_groups(rank, args.tp_size,
                                                                  args.dp_size)
    model = AutoModelForCausalLM.from_pretrained(args.model_name).to(device)
    config = {"train_batch_size": args.batch_size * args.dp_size,
              "train_micro_batch_size_per_gpu": args.batch_size,
              "zero_optimization": {"stage": args.zero_stage},
              "tensor_parallel": {"autotp_size": args.tp_size},
              "data_parallel_size": args.dp_size}
    if args.precision != "fp32":
        config[args.precision] = {"enabled": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    mpu = ModelParallelUnit(tp_group, dp_group, args.tp_size, args.dp_size, tp_rank, dp_rank)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           mpu=mpu)

    # one fixed batch per data rank, so the loss has something to fall on
    generator = torch.Generator().manual_seed(dp_rank)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch_size, args.seq_length), generator=generator)
    ids = ids.to(device)
    dist.broadcast(ids, src=dp_rank * args.tp_size, group=tp_group)  # the tensor group's first
    for step in range(args.num_steps):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    if rank == 0:
        print("AutoTP example completed.")


def save_tiny_llama(path):
    """A 2-layer Llama with random weights, saved where --model_name can load it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64)
                     ).save_pretrained(path)


if __name__ == "__main__":
    main()
