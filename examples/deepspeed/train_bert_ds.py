"""A bing_bert / HelloDeepSpeed-shaped training script: a small BERT-style masked language
model trained with DeepSpeed's API. It is written as a DeepSpeed user writes it; the one line
that differs from a `deepspeed` script is the import below.

    zero --num_procs 2 examples/deepspeed/train_bert_ds.py --deepspeed \
        --deepspeed_config examples/deepspeed/ds_config_bert.json --checkpoint_dir ckpt

Run it again with --load_checkpoint_dir ckpt to resume where it stopped. The data are made
up (sentences whose words share a topic), so nothing is downloaded.
"""
import argparse
import os

import torch
import torch.nn as nn

import zero.compat.deepspeed as deepspeed   # the one changed line (was: import deepspeed)


def get_arguments():
    parser = argparse.ArgumentParser(description="BERT-style MLM pretraining with DeepSpeed")
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("--num_steps", type=int, default=40)
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--checkpoint_dir", default=None, help="save a checkpoint here at the end")
    parser.add_argument("--checkpoint_every", type=int, default=0)
    parser.add_argument("--load_checkpoint_dir", default=None, help="resume from here")
    parser.add_argument("--seed", type=int, default=1234)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class BertMLM(nn.Module):
    def __init__(self, vocab_size, hidden, layers, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.position = nn.Embedding(seq_len, hidden)
        layer = nn.TransformerEncoderLayer(hidden, nhead=4, dim_feedforward=4 * hidden,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(hidden, vocab_size)
        self.loss = nn.CrossEntropyLoss(ignore_index=-100)

    def forward(self, tokens, labels):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.encoder(self.embed(tokens) + self.position(positions))
        logits = self.head(hidden).float()
        return self.loss(logits.view(-1, logits.shape[-1]), labels.view(-1))


def make_batch(step, rank, batch_size, seq_len, vocab_size, device):
    """Each sentence draws its words from one of vocab_size/4 topics (4 words each); 15% of
    the words are masked and predicted from the rest of the sentence."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    topic = torch.randint(0, vocab_size // 4, (batch_size, 1), generator=g)
    tokens = topic * 4 + torch.randint(0, 4, (batch_size, seq_len), generator=g)
    mask = torch.rand(batch_size, seq_len, generator=g) < 0.15
    labels = torch.where(mask, tokens, torch.full_like(tokens, -100))
    inputs = torch.where(mask, torch.zeros_like(tokens), tokens)
    return inputs.to(device), labels.to(device)


def main():
    args = get_arguments()
    torch.manual_seed(args.seed)
    deepspeed.init_distributed()
    model = BertMLM(args.vocab_size, args.hidden, args.layers, args.seq_len)
    no_decay = ["bias", "norm"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
         "weight_decay": 0.0},
    ]
    model, optimizer, _, _ = deepspeed.initialize(args=args, model=model,
                                                  model_parameters=grouped)
    rank = deepspeed.comm.get_rank()
    start_step = 0
    if args.load_checkpoint_dir:
        _, client_state = model.load_checkpoint(args.load_checkpoint_dir)
        start_step = client_state["checkpoint_step"]
        if rank == 0:
            print(f"resumed from step {start_step}", flush=True)
    device = deepspeed.accelerator.get_accelerator().device_name(model.local_rank)
    for step in range(start_step + 1, args.num_steps + 1):
        for micro in range(model.gradient_accumulation_steps()):
            inputs, labels = make_batch(step * 64 + micro, rank, model.train_micro_batch_size_per_gpu(),
                                        args.seq_len, args.vocab_size, device)
            loss = model(inputs, labels)
            model.backward(loss)
            model.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if args.checkpoint_dir and args.checkpoint_every and step % args.checkpoint_every == 0:
            model.save_checkpoint(args.checkpoint_dir, client_state={"checkpoint_step": step})
    if args.checkpoint_dir:
        model.save_checkpoint(args.checkpoint_dir, client_state={"checkpoint_step": args.num_steps})


if __name__ == "__main__":
    main()
