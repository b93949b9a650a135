"""Stage 3: the root unit's modules called outside the model's forward.

The root unit (zero/stage3.py: embeddings, final norm, a tied head, a value head) is gathered
by the hook on the model's root module, for the whole of its forward. Scripts also call a
model's parts without that forward: DeepSpeed-Chat's reward and critic models run
`engine.forward_value(...)`, which calls the backbone and the value head directly, and TRL
scores with `getattr(model, model.base_model_prefix)(...)` and `model.score(...)`. DeepSpeed
gathers each module's own parameters in that module's hook, so those calls work there.

Here each module that owns root-unit parameters gets a hook pair that does nothing while the
root's forward runs (the usual path: one check) or inside another such module's call. Called
otherwise, the module holds the root unit for the length of its own call (GatherSchedule::hold,
as GatheredParameters does, so the recorded forward order is left alone). In a forward autograd
records, it puts the root unit's backward triggers on its inputs and outputs, as the root's
hooks do for a whole forward, and the unit is freed in place after (backward's gather fills the
views autograd saved). Recomputed in backward (activation checkpointing), it holds the unit
until that backward ends: the recomputed part's backward, and its gradients, follow.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn


ROOT = 0  # the root unit's index


class RootParts:
    """The hooks of one Stage3Hooks (`hooks`) on its root and on the root unit's modules."""

    def __init__(self, hooks, root: nn.Module, owners: list[nn.Module]):
        self._hooks = weakref.ref(hooks)  # the model keeps the hooks; they must not keep the engine
        self._root = root
        self._owners = owners
        self._root_running = 0  # depth of the root module's forward (it may call itself)
        self._depth = 0  # owner calls open inside the one that holds the root unit (0: none holds)
        self._recorded = False  # that call runs with gradients: it gets the backward triggers

    @staticmethod
    def owners(plan, partitioned: dict[int, nn.Parameter]) -> list[nn.Module]:
        """The modules below the root that own (not through a child) a partitioned parameter of
        the root unit."""
        root = plan.modules[ROOT][1]
        return [module for module, units in plan.units_owned(partitioned)
                if module is not root and ROOT in units]

    def attach(self) -> list:
        """Registers the hooks; returns their handles."""
        handles = [self._root.register_forward_pre_hook(self._root_enters, prepend=True),
                   self._root.register_forward_hook(self._root_leaves, always_call=True)]
        for module in self._owners:
            handles.append(module.register_forward_pre_hook(self._owner_enters, with_kwargs=True))
            handles.append(module.register_forward_hook(self._owner_leaves, always_call=True))
        return handles

    def _root_enters(self, _module, _args):
        self._root_running += 1

    def _root_leaves(self, _module, _inputs, _outputs):
        self._root_running = max(0, self._root_running - 1)

    def _owner_enters(self, _module, args, kwargs):
        if self._depth:  # inside the owner call that holds the root unit
            self._depth += 1
            return None
        hooks = self._hooks()
        if self._root_running or hooks is None or hooks.removed or hooks.suspended:
            return None
        hooks.hold(ROOT)
        if torch._C._current_graph_task_id() != -1:
            # recomputed in backward (activation checkpointing), its own backward follows: the
            # unit stays held until this backward ends (end_backward lets every unit go)
            return None
        self._depth = 1
        self._recorded = torch.is_grad_enabled()  # the backward triggers, for autograd's record
        return hooks.attach_post_backward(ROOT, (args, kwargs)) if self._recorded else None

    def _owner_leaves(self, _module, _inputs, outputs):
        if not self._depth:
            return None
        self._depth -= 1
        if self._depth:
            return None
        hooks = self._hooks()
        if hooks is None or hooks.removed:
            return None
        # freed in place, as after a forward: the views autograd saved (this call's, or an
        # earlier one's) are filled again by the backward's gather
        hooks.unhold(ROOT, hand_over=False)
        if outputs is None or not self._recorded:
            return None
        return hooks.attach_pre_backward(ROOT, outputs)
