"""A DeepSpeedExamples CIFAR-10-shaped script (training/cifar/cifar10_deepspeed.py): the
config is built in the script from --stage and --dtype and passed as config=, the engine
builds the data loader from training_data=. The one line that differs from a `deepspeed`
script is the import below.

    zero --num_procs 2 examples/deepspeed/cifar10_deepspeed.py --stage 2 --dtype bf16

The images are made up (no download): 3x32x32 noise whose class is the brightest of ten
fixed patterns mixed into it, so the network has something to learn.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import zero.compat.deepspeed as deepspeed   # the one changed line (was: import deepspeed)


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="number of total epochs")
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("--log-interval", type=int, default=10,
                        help="output logging information at a given interval")
    parser.add_argument("--dtype", default="bf16", type=str, choices=["bf16", "fp16", "fp32"],
                        help="Datatype used for training")
    parser.add_argument("--stage", default=0, type=int, choices=[0, 1, 2, 3],
                        help="ZeRO stage")
    parser.add_argument("--samples", default=1280, type=int, help="size of the made-up data set")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class PatternImages(torch.utils.data.Dataset):
    def __init__(self, samples, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(10, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (samples,), generator=g)
        self.noise = torch.randn(samples, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        label = self.labels[i]
        return self.noise[i] + 1.5 * self.patterns[label], label


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def get_ds_config(args):
    return {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                 "weight_decay": 3e-7}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                     "warmup_num_steps": 20}},
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {"enabled": args.dtype == "fp16", "fp16_master_weights_and_grads": False,
                 "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
                 "min_loss_scale": 1, "initial_scale_power": 15},
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": args.stage, "allgather_partitions": True,
                              "reduce_scatter": True, "allgather_bucket_size": 5e7,
                              "reduce_bucket_size": 5e7, "overlap_comm": True,
                              "contiguous_gradients": True},
    }


def main(args):
    deepspeed.init_distributed()
    torch.manual_seed(0)
    trainset = PatternImages(args.samples)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset,
        config=get_ds_config(args))
    local_device = deepspeed.accelerator.get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()
            if local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
                print(f"[{epoch + 1 : d}, {i + 1 : 5d}] loss: {running_loss / args.log_interval : .3f}",
                      flush=True)
                running_loss = 0.0
    print("Finished Training", flush=True)


if __name__ == "__main__":
    main(add_argument())
