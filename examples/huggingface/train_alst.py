"""A Hugging Face Trainer script with Ulysses sequence parallelism (DeepSpeed's ALST), as the
transformers docs write one: nothing in it names zero.

    zero --num_procs 2 train_alst.py --deepspeed ds_zero3.json --sp_size 2 --output_dir out
    deepspeed --num_gpus 2 train_alst.py ...      # the same script under the real DeepSpeed

A small Llama built from its config (no download, sdpa attention) learns a synthetic copy
task on sequences of 64 tokens; with --sp_size s each rank of a group holds 64 / s of every
sequence (ParallelismConfig(sp_backend="deepspeed")). The loss of every step is in
out/log_history.json.
"""
import dataclasses
import json
import os

import torch
from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments, set_seed)

SEQ = 64


@dataclasses.dataclass
class ScriptArguments:
    sp_size: int = dataclasses.field(default=1, metadata={"help": "sequence parallel size"})
    samples: int = dataclasses.field(default=64, metadata={"help": "training sequences"})


def dataset(samples: int, seed: int = 1234) -> list[dict]:
    """Sequences whose second half repeats the first, with their positions."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(samples):
        half = torch.randint(0, 96, (SEQ // 2,), generator=generator)
        ids = torch.cat([half, half])
        rows.append({"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(SEQ)})
    return rows


def main():
    script_args, args = HfArgumentParser((ScriptArguments, TrainingArguments)) \
        .parse_args_into_dataclasses()
    if script_args.sp_size > 1:
        from accelerate.utils import ParallelismConfig
        from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

        args.parallelism_config = ParallelismConfig(
            sp_backend="deepspeed", sp_size=script_args.sp_size,
            sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                                       sp_attn_implementation="sdpa"))
    set_seed(args.seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQ)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(script_args.samples))
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(args.output_dir, "log_history.json"), "w") as file:
            json.dump({"log_history": trainer.state.log_history}, file, indent=1)


if __name__ == "__main__":
    main()
