"""`engine.optimizer.parameter_offload` at stage 3: the part of DeepSpeed's
DeepSpeedZeRoOffload that RLHF trainers reach into. TRL's unwrap_model_for_generation
(GRPO, RLOO, online DPO, distillation) gathers every parameter with GatheredParameters,
takes the module hooks off so that generate() runs on the whole weights without per-module
gathers (its remove_hooks: each handle in `forward_hooks` and `backward_hooks` removed, both
lists emptied), and puts them back after (its add_hooks: `_register_deepspeed_module` on
`module`).

zero's stage-3 hooks (stage3.Stage3Hooks) are forward hooks only: the backward triggers are
attached by them to the tensors of each forward, so `backward_hooks` is always empty.
"""
from __future__ import annotations

import weakref

from torch import nn

from .stage3 import Stage3Hooks


class ParameterOffload:
    """DeepSpeedZeRoOffload's hook handles and re-registration, over a Stage3Hooks."""

    def __init__(self, hooks: Stage3Hooks, module: nn.Module, quantized_frozen: bool = False):
        # the engine holds the hooks; this (reachable from the optimizer) must not keep them,
        # and the C++ engine behind them, alive
        self._hooks = weakref.ref(hooks)
        self.module = module
        self.forward_hooks = hooks.module_hooks
        self.backward_hooks = []
        self.quantized_frozen = quantized_frozen  # zero_quantized_nontrainable_weights
        # which parameters were frozen when the engine laid them out (a frozen group, or whole)
        self._frozen = {id(p) for p in module.parameters() if not p.requires_grad}

    def changed_since_layout(self) -> list[str]:
        """The parameters whose requires_grad changed since the engine laid the model out."""
        return [name for name, param in self.module.named_parameters()
                if (id(param) in self._frozen) == param.requires_grad]

    def _live(self) -> Stage3Hooks:
        hooks = self._hooks()
        if hooks is None or hooks.removed:
            raise RuntimeError("zero: this engine was destroyed; its stage-3 hooks are gone")
        return hooks

    def _register_deepspeed_module(self, module: nn.Module, count=None) -> None:
        """Puts the engine's module hooks back on `module` (the engine's own module)."""
        del count  # DeepSpeed's recursion counter
        if module is not self.module:
            raise ValueError("zero: _register_deepspeed_module takes the engine's own module "
                             "(engine.optimizer.parameter_offload.module)")
        hooks = self._live()
        hooks.attach_module_hooks()
        self.forward_hooks = hooks.module_hooks
        self.backward_hooks = []

    def _remove_module_hooks(self) -> None:
        """Takes the engine's module hooks off the model."""
        self._live().detach_module_hooks()
        self.forward_hooks = []
        self.backward_hooks = []
