"""Stage 3: a module of one gather unit called inside another unit's forward.

A unit's parameters are gathered by the hooks on its own module (zero/stage3.py). A model may
also call a module of one unit from another unit's forward: a layer shared across blocks
(`self.blocks[0].shared(x)` inside block 1), a block's submodule called from the root's
forward. DeepSpeed gathers every module's own parameters in that module's hook, so such calls
work there without `register_external_parameter`; here they would see the empty placeholders.

So during the first forward each module that owns parameters of a unit other than the root
(whose modules zero/stage3_root_parts.py covers) gets a hook, and so does each unit's module,
to know which units are running. A module called while its own unit is not running, inside
another unit's forward, links the two units as `register_external_parameter` does: its unit
is gathered at once (GatherSchedule::add_external) and from then on whenever the calling unit
is, forward and backward. The first forward ends by taking these hooks off again (no hook per
module afterwards, nothing more for torch.compile to break on). Not seen, so to be registered
(`zero.register_external_parameter(calling_module, param)`) as in DeepSpeed: a call first made
in a later step or outside every unit's forward, and any call in a model compiled in place
before its first forward (engine.compile, module.compile(): the hooks go before it, as taking
them off after a compiled forward would make dynamo compile it again).
"""
from __future__ import annotations

import weakref

from torch import nn


class CrossUnitCalls:
    """The first forward's hooks of one Stage3Hooks (`hooks`)."""

    def __init__(self, hooks, plan, partitioned: dict[int, nn.Parameter]):
        self._hooks = weakref.ref(hooks)  # the model keeps the hooks; they must not keep the engine
        self._units = plan.modules  # unit -> (name, module); unit 0 is the root
        self._owners = self.owners(plan, partitioned)
        self._running: list[int] = []  # units whose forward runs now, innermost last
        self._handles: list = []
        self._done = False  # the first forward has ended

    @staticmethod
    def owners(plan, partitioned: dict[int, nn.Parameter]) -> list[tuple[nn.Module, int]]:
        """(module, unit) for each module that owns (not through a child) partitioned parameters
        of a unit other than the root and is not a unit's own module."""
        unit_modules = {id(module) for _, module in plan.modules}
        return [(module, min(units)) for module, units in plan.units_owned(partitioned)
                if id(module) not in unit_modules and len(units) == 1 and 0 not in units]

    @property
    def handles(self) -> list:
        """The handles of the hooks on now."""
        return list(self._handles)

    def attach(self) -> None:
        """Registers the first forward's hooks (none once it has ended)."""
        self.detach()
        if self._done or not self._owners:
            return
        for unit, (_, module) in enumerate(self._units):
            self._handles.append(module.register_forward_pre_hook(self._enters(unit),
                                                                  prepend=True))
            self._handles.append(module.register_forward_hook(self._leaves(unit),
                                                              always_call=True))
        for module, unit in self._owners:
            self._handles.append(module.register_forward_pre_hook(self._called(unit)))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._running, self._handles = [], []

    def stop(self) -> None:
        """No more hooks, now or when the hooks go on again."""
        self._done = True
        self.detach()

    def _enters(self, unit):
        def hook(_module, _args):
            self._running.append(unit)
        return hook

    def _leaves(self, unit):
        def hook(_module, _inputs, _outputs):
            if self._running and self._running[-1] == unit:
                self._running.pop()
            if unit == 0 and not self._running:  # the first forward ended
                self.stop()
        return hook

    def _called(self, unit):
        def hook(_module, _args):
            if not self._running or unit in self._running:
                return
            hooks = self._hooks()
            if hooks is None or hooks.removed or hooks.suspended:
                return
            hooks.link_external(self._running[-1], unit)
        return hook
