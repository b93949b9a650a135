"""`deepspeed.ops.adagrad`: DeepSpeedCPUAdagrad as a torch optimizer.

torch's Adagrad with DeepSpeed's constructor arguments: zero's engine reads its
hyperparameters and runs its own sharded Adagrad step (on the host when the optimizer is
offloaded), so the kernel the class names does not matter.
"""
from __future__ import annotations

import torch


class DeepSpeedCPUAdagrad(torch.optim.Adagrad):
    """DeepSpeed's signature: L2 weight decay added to the gradient, as torch's Adagrad."""

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("zero: DeepSpeedCPUAdagrad with amsgrad=True is not supported "
                             "(DeepSpeed's own kernel ignores it); leave amsgrad False")
        super().__init__(model_params, lr=lr, eps=eps, weight_decay=weight_decay)


__all__ = ["DeepSpeedCPUAdagrad"]
