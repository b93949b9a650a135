"""A plain TRL script: nothing in it names zero or DeepSpeed. GRPO (generation inside
training, and with --beta > 0 a frozen reference model), DPO (a reference model beside the
trained one) or SFT on a tiny GPT-2, loaded by TRL from a directory as a model name would
be; with --lora R, PEFT LoRA adapters of rank R are trained on the frozen model.

    python train_trl.py --save_model tiny                   # once: the model and tokenizer
    zero --num_procs 2 train_trl.py --model tiny --trainer grpo --deepspeed ds_zero3.json \
        --output_dir out --bf16 false
    torchrun --nproc_per_node 2 train_trl.py --model tiny --trainer dpo --use_cpu true \
        --output_dir out

The model is built from its config and the tokenizer from a word list (no download); the
data are made here. Every logged step is in out/log_history.json.
"""
import dataclasses
import json
import os

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (AutoTokenizer, GPT2Config, GPT2LMHeadModel, HfArgumentParser,
                          PreTrainedTokenizerFast, set_seed)
from trl import (DistillationConfig, DistillationTrainer, DPOConfig, DPOTrainer, GRPOConfig,
                 GRPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer, RLOOConfig,
                 RLOOTrainer, SFTConfig, SFTTrainer)

WORDS = ["<pad>", "<eos>", "<unk>", *[f"w{i}" for i in range(40)]]


@dataclasses.dataclass
class ScriptArguments:
    model: str = dataclasses.field(default="", metadata={"help": "the saved model's directory"})
    trainer: str = dataclasses.field(default="grpo", metadata={
        "help": "grpo, rloo, dpo, kto, sft, reward or distill"})
    lora: int = dataclasses.field(default=0, metadata={"help": "> 0: PEFT LoRA of this rank"})
    samples: int = dataclasses.field(default=32, metadata={"help": "prompts (pairs for dpo)"})
    save_model: str = dataclasses.field(default="", metadata={
        "help": "only save a new tiny model and its tokenizer into this directory"})


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def new_model(tok: PreTrainedTokenizerFast) -> GPT2LMHeadModel:
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(WORDS), n_positions=64,
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        bos_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(config)


def prompt(i: int) -> str:
    return " ".join(f"w{(i + k) % 20}" for k in range(4))


def reward_high_words(completions, **_):
    """More of the words w20..w39 is better: a reward the policy can learn."""
    return [sum(word in WORDS[23:] for word in text.split()) / 8.0 for text in completions]


def generating(trainer_class):
    """GRPO and RLOO: the policy generates completions of each prompt, a reward function
    scores them."""
    def build(model: str, args, samples: int, tok, peft):
        data = Dataset.from_dict({"prompt": [prompt(i) for i in range(samples)]})
        return trainer_class(model=model, reward_funcs=reward_high_words, args=args,
                             train_dataset=data, processing_class=tok, peft_config=peft)
    return build


def paired(trainer_class):
    """DPO (beside a reference model) and RewardTrainer (a reward model, the GPT-2 with a
    scalar head): chosen / rejected completions of each prompt."""
    def build(model: str, args, samples: int, tok, peft):
        data = Dataset.from_dict({
            "prompt": [prompt(i) for i in range(samples)],
            "chosen": [" w30 w31 w32" for _ in range(samples)],
            "rejected": [" w1 w2 w3" for _ in range(samples)]})
        return trainer_class(model=model, args=args, train_dataset=data, processing_class=tok,
                             peft_config=peft)
    return build


def sft(model: str, args: SFTConfig, samples: int, tok, peft) -> SFTTrainer:
    data = Dataset.from_dict({"text": [prompt(i) + " w30 w31 w32" for i in range(samples)]})
    return SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      peft_config=peft)


def kto(model: str, args: KTOConfig, samples: int, tok, peft) -> KTOTrainer:
    """Unpaired completions, each marked desirable or not."""
    data = Dataset.from_dict({
        "prompt": [prompt(i) for i in range(samples)],
        "completion": [" w30 w31 w32" if i % 2 else " w1 w2 w3" for i in range(samples)],
        "label": [bool(i % 2) for i in range(samples)]})
    return KTOTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      peft_config=peft)


def distill(model: str, args: DistillationConfig, samples: int, tok, peft
            ) -> DistillationTrainer:
    """The model learns from a teacher (here the same saved model, frozen)."""
    data = Dataset.from_dict({"prompt": [prompt(i) for i in range(samples)],
                              "completion": [" w30 w31" for _ in range(samples)]})
    return DistillationTrainer(model=model, teacher_model=model, args=args, train_dataset=data,
                               processing_class=tok, peft_config=peft)


TRAINERS = {"grpo": (GRPOConfig, generating(GRPOTrainer)),
            "rloo": (RLOOConfig, generating(RLOOTrainer)),
            "dpo": (DPOConfig, paired(DPOTrainer)),
            "reward": (RewardConfig, paired(RewardTrainer)),
            "kto": (KTOConfig, kto), "sft": (SFTConfig, sft),
            "distill": (DistillationConfig, distill)}


def main():
    script_args, rest = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses(
        return_remaining_strings=True)
    if script_args.save_model:
        set_seed(1234)
        tok = tokenizer()
        new_model(tok).save_pretrained(script_args.save_model)
        tok.save_pretrained(script_args.save_model)
        return
    config_class, build = TRAINERS[script_args.trainer]
    (args,) = HfArgumentParser(config_class).parse_args_into_dataclasses(args=rest)
    set_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(script_args.model)
    peft = None
    if script_args.lora:
        from peft import LoraConfig
        peft = LoraConfig(r=script_args.lora, lora_alpha=2 * script_args.lora,
                          target_modules=["c_attn", "c_fc"], lora_dropout=0.0)
    trainer = build(script_args.model, args, script_args.samples, tok, peft)
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(args.output_dir, "log_history.json"), "w") as file:
            json.dump({"log_history": trainer.state.log_history,
                       "wrapped": type(trainer.model_wrapped).__module__ + "." +
                       type(trainer.model_wrapped).__name__}, file, indent=1)


if __name__ == "__main__":
    main()
