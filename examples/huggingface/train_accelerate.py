"""A plain Accelerate training loop: nothing in it names zero.

    zero --num_procs 2 train_accelerate.py --ds_config ds_accelerate.json --out out
    zero --num_procs 2 --no_deepspeed_alias train_accelerate.py --cpu --out out   # plain DDP

Accelerate brings up DeepSpeed (here: zero standing in for it) from a DeepSpeedPlugin; the
script's own torch AdamW and LambdaLR are handed to deepspeed.initialize. The global mean
loss of every step goes to out/losses.json; the state is saved with save_state and the final
model with get_state_dict. --save_at N also saves after step N; --resume DIR --resume_step N
goes on from there (load_state, skip_first_batches).
"""
import argparse
import json
import os

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import set_seed
from transformers import GPT2Config, GPT2LMHeadModel

from train_trainer import dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ds_config", default="")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gas", type=int, default=2)
    parser.add_argument("--save_at", type=int, default=0, help="save_state after this step too")
    parser.add_argument("--resume", default="", help="load_state from here and go on")
    parser.add_argument("--resume_step", type=int, default=0, help="the step it was saved at")
    args, _ = parser.parse_known_args()  # the launcher's --local_rank=N is left aside

    plugin = DeepSpeedPlugin(hf_ds_config=args.ds_config, gradient_accumulation_steps=args.gas) \
        if args.ds_config else None
    accelerator = Accelerator(cpu=args.cpu, deepspeed_plugin=plugin,
                              gradient_accumulation_steps=args.gas)
    set_seed(42)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96,
                                       n_positions=32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / args.steps)
    loader = torch.utils.data.DataLoader(dataset(256), batch_size=4, shuffle=False)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    if args.resume:
        accelerator.load_state(args.resume)
        loader = accelerator.skip_first_batches(loader, args.resume_step * args.gas)
    losses, window = [None] * args.resume_step, []
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        window.append(accelerator.gather(loss.detach()).mean().item())
        if accelerator.sync_gradients:
            losses.append(sum(window) / len(window))
            window = []
            if len(losses) == args.save_at:
                accelerator.save_state(os.path.join(args.out, f"state_{args.save_at}"))
            if len(losses) == args.steps:
                break
    accelerator.save_state(os.path.join(args.out, "state"))
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save(state, os.path.join(args.out, "model.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as file:
            json.dump({"losses": losses, "engine": type(model).__module__ + "." +
                       type(model).__name__}, file)


if __name__ == "__main__":
    main()
