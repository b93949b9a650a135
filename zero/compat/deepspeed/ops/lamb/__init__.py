"""`deepspeed.ops.lamb`: FusedLamb as a torch optimizer that carries LAMB's hyperparameters.

Under zero's engine the class only names the update (`zero_optimizer_kind`): the engine runs
its own sharded LAMB step (csrc/adapter/lamb.h, DeepSpeed's FusedLamb formulas, each
parameter's trust ratio over the whole parameter at every ZeRO stage). DeepSpeed's FusedLamb
is a CUDA kernel; outside an engine this class does not step.
"""
from __future__ import annotations

import torch


class FusedLamb(torch.optim.Optimizer):
    """DeepSpeed's signature. max_grad_norm (FusedLamb's own clipping) must stay 0: the
    engine clips by the config's gradient_clipping."""
    zero_optimizer_kind = "lamb"

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0, max_coeff=10.0,
                 min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise RuntimeError("zero: FusedLamb does not support the AMSGrad variant (nor does "
                               "DeepSpeed's)")
        if min_coeff > max_coeff:
            raise ValueError(f"zero: FusedLamb min_coeff {min_coeff} is above max_coeff "
                             f"{max_coeff}; the trust ratio is clamped to [min_coeff, max_coeff]")
        if max_grad_norm:
            raise ValueError(f"zero: FusedLamb(max_grad_norm={max_grad_norm}) is not supported; "
                             "clip with the config's gradient_clipping instead")
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas),
                                      eps=eps, eps_inside_sqrt=eps_inside_sqrt,
                                      weight_decay=weight_decay, max_coeff=max_coeff,
                                      min_coeff=min_coeff))

    def step(self, closure=None):  # noqa: ARG002
        raise NotImplementedError("zero: FusedLamb steps inside zero's engine (pass it to "
                                  "deepspeed.initialize); DeepSpeed's own is a CUDA kernel")


__all__ = ["FusedLamb"]
