"""A plain Hugging Face Trainer script: nothing in it names zero or DeepSpeed.

    zero --num_procs 2 train_trainer.py --deepspeed ds_config.json --output_dir out --max_steps 8
    torchrun --nproc_per_node 2 train_trainer.py --output_dir out --max_steps 8   # plain DDP

A small GPT-2 built from its config (no download; --moe: a small Mixtral) learns a synthetic
copy task; the loss of every step is in out/log_history.json. --resume_from_checkpoint
resumes, --init_from loads a saved model (either) with from_pretrained (under ZeRO-3 inside
zero.Init, as the Trainer does),
--evaluate_first evaluates before training (--train false: only that), --lora R trains PEFT LoRA
adapters of rank R on the frozen model. On a machine without a GPU, --bf16 needs
--use_cpu true (transformers' rule, with DeepSpeed as with zero).
"""
import dataclasses
import json
import os

import torch
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, HfArgumentParser,
                          Trainer, TrainingArguments, set_seed)


@dataclasses.dataclass
class ScriptArguments:
    init_from: str = dataclasses.field(default="", metadata={"help": "from_pretrained this dir"})
    samples: int = dataclasses.field(default=256, metadata={"help": "training sequences"})
    evaluate_first: bool = dataclasses.field(default=False,
                                             metadata={"help": "evaluate before training"})
    train: bool = dataclasses.field(default=True, metadata={"help": "false: evaluate only"})
    lora: int = dataclasses.field(default=0, metadata={"help": "> 0: PEFT LoRA of this rank"})
    moe: bool = dataclasses.field(default=False, metadata={
        "help": "a small Mixtral (4 experts, top-2) instead of GPT-2: the config's "
                "expert_parallel block splits its experts"})


def small_model(moe: bool) -> torch.nn.Module:
    """A small GPT-2, or (moe) a small Mixtral: 4 experts, top-2; built from its config."""
    if moe:
        from transformers import MixtralConfig, MixtralForCausalLM
        return MixtralForCausalLM(MixtralConfig(
            vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=32))
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96,
                                      n_positions=32))


def dataset(samples: int, seed: int = 1234) -> list[dict]:
    """Sequences whose second half repeats the first: learnable, so the loss falls."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(samples):
        half = torch.randint(0, 96, (16,), generator=generator)
        ids = torch.cat([half, half])
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def main():
    script_args, args = HfArgumentParser((ScriptArguments, TrainingArguments)) \
        .parse_args_into_dataclasses()
    set_seed(args.seed)
    if script_args.init_from:
        model = AutoModelForCausalLM.from_pretrained(script_args.init_from)
    else:
        model = small_model(script_args.moe)
    if script_args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=script_args.lora, lora_alpha=2 * script_args.lora,
                                                 target_modules=["c_attn", "c_fc"],
                                                 lora_dropout=0.0, fan_in_fan_out=True))
    data = dataset(script_args.samples)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:16])
    first = trainer.evaluate() if script_args.evaluate_first else None
    metrics = first
    if script_args.train:
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        metrics = trainer.evaluate()
        trainer.save_model(os.path.join(args.output_dir, "final"))
    if trainer.is_world_process_zero():
        with open(os.path.join(args.output_dir, "log_history.json"), "w") as file:
            json.dump({"log_history": trainer.state.log_history, "eval": metrics, "first": first,
                       "wrapped": type(trainer.model_wrapped).__module__ + "." +
                       type(trainer.model_wrapped).__name__}, file, indent=1)


if __name__ == "__main__":
    main()
