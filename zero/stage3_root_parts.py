"""Stage 3: the root unit's modules called outside the model's forward.

The root unit (zero/stage3.py: embeddings, final norm, a tied head, a value head) is gathered
by the hook on the model's root module, for the whole of its forward. Scripts also call a
model's parts without that forward: DeepSpeed-Chat's reward and critic models run
`engine.forward_value(...)`, which calls the backbone and the value head directly, and TRL
scores with `getattr(model, model.base_model_prefix)(...)` and `model.score(...)`. DeepSpeed
gathers each module's own parameters in that module's hook, so those calls work there.

Here each module that owns root-unit parameters gets a hook pair that does nothing while the
root's forward runs (the usual path: one check). Called outside it, the module holds the root
unit for the length of its own call (GatherSchedule::hold, as GatheredParameters does, so the
recorded forward order is left alone) and, when autograd records it, puts the root unit's
backward triggers on its inputs and outputs, as the root's hooks do for a whole forward.
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
        self._holding: list[nn.Module] = []  # the owners holding the root unit now, innermost last

    @staticmethod
    def owners(plan, partitioned: dict[int, nn.Parameter]) -> list[nn.Module]:
        """The modules below the root that own (not through a child) a partitioned parameter of
        the root unit."""
        root = plan.modules[ROOT][1]
        return [module for module in root.modules() if module is not root and any(
            id(p) in partitioned and plan.unit_of_param.get(id(p)) == ROOT
            for p in module.parameters(recurse=False))]

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
        self._root_running -= 1

    def _owner_enters(self, module, args, kwargs):
        hooks = self._hooks()
        if self._root_running or hooks is None or hooks.removed or hooks.suspended:
            return None
        hooks.hold(ROOT)
        self._holding.append(module)
        if not torch.is_grad_enabled():
            return None
        return hooks.attach_post_backward(ROOT, (args, kwargs))

    def _owner_leaves(self, module, _inputs, outputs):
        if not self._holding or self._holding[-1] is not module:
            return None
        self._holding.pop()
        hooks = self._hooks()
        if hooks is None or hooks.removed:
            return None
        hooks.unhold(ROOT)
        if outputs is None or not torch.is_grad_enabled():
            return None
        return hooks.attach_pre_backward(ROOT, outputs)
