"""The learning-rate schedules tests/test_schedulers_deepspeed.py compares: each a scheduler
config as a DeepSpeed JSON names it, an optimizer, and the steps to run. Shared by make.py
(the real DeepSpeed writes expected.json) and the test (zero's schedulers on the same)."""
import torch

STEPS = 40
CASES = {
    "warmup-log": ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3,
                                "warmup_num_steps": 10}, "adam"),
    "warmup-linear": ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                                   "warmup_num_steps": 8, "warmup_type": "linear"}, "adam"),
    "warmup-default-max": ("WarmupLR", {"warmup_num_steps": 5}, "adam"),
    "warmup-decay": ("WarmupDecayLR", {"total_num_steps": 30, "warmup_min_lr": 1e-5,
                                       "warmup_max_lr": 1e-3, "warmup_num_steps": 6}, "adam"),
    "warmup-decay-linear": ("WarmupDecayLR", {"total_num_steps": 25, "warmup_num_steps": 5,
                                              "warmup_type": "linear"}, "adam"),
    "warmup-cosine": ("WarmupCosineLR", {"total_num_steps": 30, "warmup_min_ratio": 0.1,
                                         "warmup_num_steps": 5, "cos_min_ratio": 0.01}, "adam"),
    "warmup-cosine-linear": ("WarmupCosineLR", {"total_num_steps": 35, "warmup_num_steps": 7,
                                                "warmup_type": "linear"}, "adam"),
    "onecycle-adam": ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2,
                                   "decay_lr_rate": 0.1, "cycle_first_step_size": 5,
                                   "cycle_second_step_size": 7, "decay_step_size": 3,
                                   "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
                                   "decay_mom_rate": 0.1}, "adam"),
    "onecycle-staircase": ("OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 5e-3,
                                        "cycle_first_step_size": 4, "cycle_first_stair_count": 2,
                                        "decay_lr_rate": 0.5, "decay_step_size": 5,
                                        "cycle_momentum": False}, "adam"),
    "onecycle-sgd": ("OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                  "cycle_first_step_size": 6, "cycle_min_mom": 0.8,
                                  "cycle_max_mom": 0.95}, "sgd"),
    "lr-range-test": ("LRRangeTest", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5,
                                      "lr_range_test_step_rate": 2.0}, "adam"),
    "lr-range-test-staircase": ("LRRangeTest", {"lr_range_test_min_lr": 1e-3,
                                                "lr_range_test_step_size": 4,
                                                "lr_range_test_staircase": True}, "sgd"),
}


def optimizer(kind):
    """Two parameter groups with their own lrs (schedules that read the groups' lr)."""
    first, second = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    groups = [{"params": [first]}, {"params": [second], "lr": 5e-4}]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999))


def run(scheduler, opt):
    """Each group's lr (and momentum or betas) after construction, then after each step."""
    def seen():
        return [[group["lr"], list(group["betas"]) if "betas" in group else group.get("momentum")]
                for group in opt.param_groups]
    values = [seen()]
    for _ in range(STEPS):
        scheduler.step()
        values.append(seen())
    return values
