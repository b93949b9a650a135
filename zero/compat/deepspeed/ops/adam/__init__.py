"""`deepspeed.ops.adam`: DeepSpeedCPUAdam and FusedAdam as torch optimizers.

DeepSpeed's classes are torch optimizers running its own kernels. Here they are torch's Adam
/ AdamW with DeepSpeed's constructor arguments: zero's engine reads their hyperparameters and
runs its own sharded step (the vectorised CPU Adam when the optimizer is offloaded, see
docs/CPU_ADAM.md), so the kernel the class names does not matter. Accelerate builds a
DeepSpeedCPUAdam when a config offloads the optimizer and the script brings a torch optimizer.
"""
from __future__ import annotations

import torch


def _check(bias_correction):
    if not bias_correction:
        raise ValueError("zero: DeepSpeedCPUAdam/FusedAdam with bias_correction=False is not "
                         "supported; use bias_correction=True (the default)")


class DeepSpeedCPUAdam(torch.optim.Adam):
    """DeepSpeed's signature: decoupled weight decay (AdamW) when adamw_mode, the default."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        _check(bias_correction)
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=adamw_mode)
        # False: with a 16-bit master offloaded its moments are 16-bit (boundary.sixteen_bit_states)
        self.fp32_optimizer_states = fp32_optimizer_states


class FusedAdam(torch.optim.Adam):
    """DeepSpeed's FusedAdam signature (adam_w_mode, default on)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        _check(bias_correction)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=adam_w_mode)


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
