"""Supervised fine-tuning in the shape of DeepSpeed-Chat's step 1
(applications/DeepSpeed-Chat/training/step1_supervised_finetuning/main.py and its dschat/utils):
a Hugging Face causal LM, the config built in code the way DeepSpeed-Chat's get_train_ds_config
builds it (the "bfloat16" block, memory_efficient_linear false, hybrid_engine and tensorboard
blocks switched off), LoRA layers swapped in with deepspeed.compression.helper, FusedAdam or
DeepSpeedCPUAdam, a transformers scheduler, the model's own methods called on the engine, and
the stage-3 save that gathers each parameter and keeps `param.data.cpu()`.

Nothing here names zero: run it under zero's launcher, which stands in for `deepspeed`.

    zero --num_gpus 2 examples/deepspeed/sft_chat.py --zero_stage 3 --lora_dim 8 \\
        --only_optimize_lora --offload --gradient_checkpointing --output_dir out

The model is a small OPT built from its config and the data are made-up token sequences that
repeat a per-sample pattern (no download), so the loss has something to fall to.
"""
import argparse
import math
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler
from transformers import OPTConfig, OPTForCausalLM, default_data_collator, get_scheduler

import deepspeed
from deepspeed import get_accelerator
from deepspeed.compression.helper import recursive_getattr, recursive_setattr
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

SEQ_LEN = 32


def parse_args():
    parser = argparse.ArgumentParser(description="SFT")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--zero_stage", type=int, default=0)
    parser.add_argument("--dtype", type=str, default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--lora_dim", type=int, default=0)
    parser.add_argument("--only_optimize_lora", action="store_true")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    parser.add_argument("--output_dir", type=str, default=None)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def train_ds_config(offload, dtype, stage):
    """The dict DeepSpeed-Chat's get_train_ds_config returns, keys and spellings as there."""
    device = "cpu" if offload else "none"
    dtype_block = "fp16" if dtype == "fp16" else "bfloat16"
    return {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10,
        "zero_optimization": {
            "stage": stage, "overlap_comm": True,
            "offload_param": {"device": device}, "offload_optimizer": {"device": device},
            "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e7,
            "stage3_prefetch_bucket_size": 3e7, "memory_efficient_linear": False,
        },
        dtype_block: {"enabled": True},
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "wall_clock_breakdown": False,
        "hybrid_engine": {"enabled": False, "max_out_tokens": 512, "inference_tp_size": 1,
                          "release_inference_cache": False, "pin_parameters": True,
                          "tp_gather_partition_size": 8},
        "tensorboard": {"enabled": False, "output_path": "step1_tensorboard/ds_tensorboard_logs/",
                        "job_name": "step1_model_tensorboard"},
    }


def tiny_config():
    return OPTConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                     num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64,
                     pad_token_id=1, bos_token_id=0, eos_token_id=0)


def dataset(samples, seed):
    """Each sample repeats one of eight 4-token patterns: each token says what follows it."""
    patterns = torch.randint(2, 64, (8, 4), generator=torch.Generator().manual_seed(0))
    choice = torch.randint(0, 8, (samples,), generator=torch.Generator().manual_seed(seed))
    ids = patterns[choice].repeat(1, SEQ_LEN // 4)
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]


class LoraLinear(torch.nn.Module):
    """DeepSpeed-Chat's LinearLayer_LoRA in outline: the frozen weight and bias stay on the
    module, the two low-rank matrices beside them, fused into the weight before saving."""

    def __init__(self, weight, bias, dim, scaling=1.0):
        super().__init__()
        self.weight, self.bias = weight, bias
        rows, columns = weight.ds_shape if hasattr(weight, "ds_shape") else weight.shape
        self.lora_right_weight = torch.nn.Parameter(torch.zeros(columns, dim, dtype=weight.dtype))
        self.lora_left_weight = torch.nn.Parameter(torch.zeros(dim, rows, dtype=weight.dtype))
        torch.nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
        self.scaling = scaling / dim
        self.fused = False

    def fuse(self):
        self.weight.data += self.scaling * (self.lora_right_weight @ self.lora_left_weight).t()
        self.fused = True

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        if self.fused:
            return out
        return out + (x @ self.lora_right_weight @ self.lora_left_weight) * self.scaling


def convert_to_lora(model, dim):
    names = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and "decoder.layers." in name]
    for name in names:
        linear = recursive_getattr(model, name)
        recursive_setattr(model, name, LoraLinear(linear.weight, linear.bias, dim))
    return model


def to_fetch(params):
    """DeepSpeed-Chat's _z3_params_to_fetch: the partitioned ones."""
    return [p for p in params if hasattr(p, "ds_id")
            and p.ds_status == deepspeed.runtime.zero.partition_parameters.ZeroParamStatus.NOT_AVAILABLE]


def fuse_lora(model, stage3):
    for module in model.modules():
        if isinstance(module, LoraLinear):
            params = [module.weight, module.bias, module.lora_left_weight, module.lora_right_weight]
            with deepspeed.zero.GatheredParameters(to_fetch(params), modifier_rank=0, enabled=stage3):
                module.fuse()


def save_model(engine, rank, output_dir, stage3):
    """DeepSpeed-Chat's save_hf_format / save_zero_three_model: a state dict without the LoRA
    matrices, each stage-3 parameter gathered and kept as `param.data.cpu()`."""
    os.makedirs(output_dir, exist_ok=True)
    state = {}
    for name, param in engine.module.named_parameters():
        if hasattr(param, "ds_id"):
            with deepspeed.zero.GatheredParameters(to_fetch([param]), enabled=stage3):
                value = param.data.cpu()
        else:
            value = param.cpu()
        if rank == 0 and "lora" not in name:
            state[name] = value
    if rank == 0:
        torch.save(state, os.path.join(output_dir, "pytorch_model.bin"))
        engine.module.config.to_json_file(os.path.join(output_dir, "config.json"))


def evaluate(model, loader, device):
    model.eval()
    total = torch.zeros((), device=device)
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad():
            total += model(**batch).loss.float()
    total /= len(loader)
    torch.distributed.all_reduce(total)
    model.train()
    return (total / torch.distributed.get_world_size()).item()


def main():
    args = parse_args()
    get_accelerator().set_device(args.local_rank)
    device = torch.device(get_accelerator().device_name(), args.local_rank)
    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    ds_config = train_ds_config(args.offload, args.dtype, args.zero_stage)
    ds_config["train_micro_batch_size_per_gpu"] = args.per_device_train_batch_size
    ds_config["train_batch_size"] = args.per_device_train_batch_size * world
    get_accelerator().manual_seed_all(1234)
    torch.manual_seed(1234)

    model = OPTForCausalLM(tiny_config())
    if args.lora_dim > 0:
        model = convert_to_lora(model, args.lora_dim)
        if args.only_optimize_lora:
            for name, param in model.named_parameters():
                param.requires_grad = "lora_" in name
            model.enable_input_require_grads()  # make_model_gradient_checkpointing_compatible

    train = DataLoader(dataset(args.samples, seed=0), collate_fn=default_data_collator,
                       sampler=DistributedSampler(dataset(args.samples, seed=0)),
                       batch_size=args.per_device_train_batch_size)
    held_out = dataset(16, seed=1)
    evaluation = DataLoader(held_out, collate_fn=default_data_collator,
                            sampler=DistributedSampler(held_out, shuffle=False), batch_size=4)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and "bias" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and "bias" in n]
    groups = [{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = (DeepSpeedCPUAdam if args.offload else FusedAdam)(
        groups, lr=args.learning_rate, betas=(0.9, 0.95))
    scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=0,
                              num_training_steps=args.num_train_epochs * len(train))
    model, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, args=args, config=ds_config, lr_scheduler=scheduler,
        dist_init_required=True)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # the HF model's method, through the engine

    print(f"rank {rank} eval loss before {evaluate(model, evaluation, device):.4f}", flush=True)
    step = 0
    for epoch in range(args.num_train_epochs):
        train.sampler.set_epoch(epoch)
        for batch in train:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch, use_cache=False).loss
            model.backward(loss)
            model.step()
            step += 1
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
        model.tput_timer.update_epoch_count()
    numel = sum(p.ds_numel if hasattr(p, "ds_id") else p.numel() for p in model.model.parameters())
    print(f"rank {rank} eval loss after {evaluate(model, evaluation, device):.4f} "
          f"parameters {numel}", flush=True)

    if args.output_dir is not None:
        stage3 = args.zero_stage == 3
        fuse_lora(model.module, stage3)
        save_model(model, rank, args.output_dir, stage3)


if __name__ == "__main__":
    main()
