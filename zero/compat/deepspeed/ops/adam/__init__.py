"""`deepspeed.ops.adam`: DeepSpeedCPUAdam and FusedAdam as torch optimizers.

DeepSpeed's classes are torch optimizers running its own kernels. Here they are torch's Adam
/ AdamW with DeepSpeed's constructor arguments: zero's engine reads their hyperparameters and
runs its own sharded step (the vectorised CPU Adam when the optimizer is offloaded, see
docs/CPU_ADAM.md), so the kernel the class names does not matter. Accelerate builds a
DeepSpeedCPUAdam when a config offloads the optimizer and the script brings a torch optimizer.
"""
from __future__ import annotations

import torch


class _BiasCorrection:
    """DeepSpeed's bias_correction, kept in the defaults and every parameter group (the
    engine reads it per group). torch's Adam always corrects, so stepping such an optimizer
    outside zero's engine with bias_correction=False is refused instead of done wrongly."""

    def _keep_bias_correction(self, bias_correction: bool) -> None:
        self.defaults["bias_correction"] = bool(bias_correction)
        for group in self.param_groups:
            group.setdefault("bias_correction", bool(bias_correction))

    def add_param_group(self, param_group: dict) -> None:
        if param_group.get("amsgrad", self.defaults.get("amsgrad")):
            raise RuntimeError(f"zero: {type(self).__name__} does not support the AMSGrad variant "
                               "(nor does DeepSpeed's); use torch.optim.AdamW(amsgrad=True)")
        if "bias_correction" in self.defaults:  # (during torch's __init__ it is not yet)
            param_group.setdefault("bias_correction", self.defaults["bias_correction"])
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        if not all(group.get("bias_correction", True) for group in self.param_groups):
            raise NotImplementedError(
                f"zero: {type(self).__name__}(bias_correction=False) steps only inside zero's "
                "engine (pass it to deepspeed.initialize); torch's Adam, which runs it outside, "
                "always corrects")
        return super().step(closure)


class DeepSpeedCPUAdam(_BiasCorrection, torch.optim.Adam):
    """DeepSpeed's signature: decoupled weight decay (AdamW) when adamw_mode, the default."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=adamw_mode)
        self._keep_bias_correction(bias_correction)
        # False: with a 16-bit master offloaded its moments are 16-bit (boundary.sixteen_bit_states)
        self.fp32_optimizer_states = fp32_optimizer_states


class FusedAdam(_BiasCorrection, torch.optim.Adam):
    """DeepSpeed's FusedAdam signature (adam_w_mode, default on)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=adam_w_mode)
        self._keep_bias_correction(bias_correction)


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
