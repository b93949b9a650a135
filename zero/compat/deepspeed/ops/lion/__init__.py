"""`deepspeed.ops.lion`: FusedLion and DeepSpeedCPULion as torch optimizers.

Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), per element:

    p <- p * (1 - lr * weight_decay) - lr * sign(beta1 * m + (1 - beta1) * g)
    m <- beta2 * m + (1 - beta2) * g

Under zero's engine the class only carries hyperparameters (`zero_optimizer_kind`): the
engine runs its own sharded Lion step (csrc/adapter/optimizer_math.cpp). Outside an engine
step() below runs the same update with torch ops. sign(0) is 0 here and in the engine, as in
the paper; DeepSpeed's kernels move such elements by the learning rate.
"""
from __future__ import annotations

import torch


class _Lion(torch.optim.Optimizer):
    zero_optimizer_kind = "lion"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0):
        if lr < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"zero: Lion needs lr >= 0, weight_decay >= 0 and betas in [0, 1); "
                             f"got lr={lr}, betas={tuple(betas)}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                lion_step(p, p.grad, state["exp_avg"], group["lr"], beta1, beta2,
                          group["weight_decay"])
        return loss


def lion_step(param, grad, exp_avg, lr, beta1, beta2, weight_decay) -> None:
    """One Lion update of `param` in place, the engine's op order (torch ops)."""
    direction = exp_avg.mul(beta1).add_(grad, alpha=1 - beta1).sign_()
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    param.add_(direction, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


class FusedLion(_Lion):
    """DeepSpeed's FusedLion signature."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, set_grad_none=True):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.set_grad_none = set_grad_none


class DeepSpeedCPULion(_Lion):
    """DeepSpeed's DeepSpeedCPULion signature."""

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0,
                 fp32_optimizer_states=True):
        super().__init__(model_params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.fp32_optimizer_states = fp32_optimizer_states


__all__ = ["DeepSpeedCPULion", "FusedLion"]
