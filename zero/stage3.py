"""ZeRO-3 on the Python side: which parameters form which gather unit, and the thin module
hooks that ask the C++ engine to gather and release units. The partitioning, the
all-gathers, the reduce-scatters and the memory live in C++ (csrc/adapter/stage3_group.h).

Gather-unit policy (documented in docs/ARCHITECTURE.md):
  * every child of an nn.ModuleList that owns parameters is one unit (the transformer
    blocks of a GPT, the layers of most models);
  * every other managed parameter belongs to the root unit, which stays gathered for the
    whole forward (embeddings, final norm, and a head tied to the embedding);
  * parameters with at most `stage3_param_persistence_threshold` elements are not
    partitioned: they stay whole on every rank (a stage-1 group: gradients all-reduced,
    optimizer state sharded) and are reported separately.
Units are numbered in forward order; backward releases each unit as soon as its last
gradient has been handed to its reduce-scatter.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class UnitPlan:
    modules: list[tuple[str, nn.Module]]           # unit index -> (name, module)
    unit_of_param: dict[int, int] = field(default_factory=dict)  # id(param) -> unit


def plan_units(model: nn.Module) -> UnitPlan:
    units: list[tuple[str, nn.Module]] = [("", model)]
    inside_unit: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in inside_unit or not isinstance(module, nn.ModuleList):
            continue
        for child_name, child in module.named_children():
            if any(True for _ in child.parameters()):
                units.append((f"{name}.{child_name}" if name else child_name, child))
                inside_unit.update(id(m) for m in child.modules())
    plan = UnitPlan(units)
    for index in range(len(units) - 1, -1, -1):  # blocks first, so the root gets the rest
        for param in units[index][1].parameters():
            plan.unit_of_param.setdefault(id(param), index)
    return plan


class Stage3Hooks:
    """Module hooks that report events to the C++ gather schedule (gather_schedule.h):
    before/after each unit's forward, before its backward (a hook on its outputs' grads),
    and the end of backward. The schedule gathers, prefetches, releases and checks that all
    ranks agree on the event sequence."""

    def __init__(self, core, plan: UnitPlan, placement: dict[int, list[tuple[int, int]]],
                 step_counter):
        self._core = core
        self._plan = plan
        self._placement = placement  # model unit -> [(engine group, group-local unit)]
        self._step = step_counter     # callable: the engine's global step
        self._handles = []
        self._gathered_for_backward: set[int] = set()
        for unit, (_, module) in enumerate(plan.modules):
            for group, local in placement.get(unit, ()):
                core.place(unit, group, local)
            if unit == 0 or unit in placement:  # the root always: it opens every forward
                self._handles.append(module.register_forward_pre_hook(self._pre_forward(unit)))
                self._handles.append(module.register_forward_hook(self._post_forward(unit)))

    def gather(self, unit: int) -> None:
        for group, local in self._placement.get(unit, ()):
            self._core.gather(group, local)

    def release(self, unit: int) -> None:
        for group, local in self._placement.get(unit, ()):
            self._core.release(group, local)

    def start_backward(self) -> None:
        self._gathered_for_backward.clear()

    def end_backward(self) -> None:
        self._core.end_backward(self._step())

    def _pre_forward(self, unit):
        def hook(_module, _inputs):
            self._core.before_forward(unit, self._step())
        return hook

    def _post_forward(self, unit):
        def hook(_module, _inputs, outputs):
            self._core.after_forward(unit)
            if torch.is_grad_enabled():
                for tensor in _tensors(outputs):
                    if tensor.requires_grad:
                        tensor.register_hook(self._pre_backward(unit))
            return outputs
        return hook

    def _pre_backward(self, unit):
        def hook(grad):
            if unit not in self._gathered_for_backward:
                self._gathered_for_backward.add(unit)
                self._core.before_backward(unit, self._step())
            return grad
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def each_gathered_unit(hooks: Stage3Hooks):
    """Yields every unit index while that unit (and only it) is gathered."""
    for unit in range(len(hooks._plan.modules)):
        hooks.gather(unit)
        try:
            yield unit
        finally:
            hooks.release(unit)


def _unit_params(engine, unit: int):
    """(param, [names]) of the partitioned parameters of one unit."""
    hooks = engine._stage3
    for param_id, param in engine._partitioned.items():
        if hooks._plan.unit_of_param[param_id] == unit:
            yield param, engine._param_names[param_id]


def full_state_dict(engine, keep: bool) -> dict:
    """The module's state dict with every partitioned parameter whole, built unit by unit so
    no rank ever holds more than one gathered unit beyond its shards. Every rank takes part
    in the gathers; only ranks with keep=True keep the (CPU) copies."""
    state = ({k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
             if keep else {})
    for unit in each_gathered_unit(engine._stage3):
        for param, names in _unit_params(engine, unit):
            for name in names if keep else ():
                state[name] = param.detach().cpu().clone()
    return state


def load_full_state_dict(engine, state: dict, strict: bool) -> None:
    """Loads a whole-parameter state dict into the shards: unit by unit, gather, overwrite,
    commit this rank's piece (and fp32 master), release. Everything else (persistent and
    frozen parameters, buffers) loads through the module as usual."""
    partitioned_names = {name for pid in engine._partitioned for name in engine._param_names[pid]}
    hooks = engine._stage3
    with torch.no_grad():
        for unit in each_gathered_unit(hooks):
            for param, names in _unit_params(engine, unit):
                source = next((state[name] for name in names if name in state), None)
                if source is not None:
                    param.data.copy_(source)
            for group, local in hooks._placement.get(unit, ()):
                engine._core.commit(group, local)
    rest = {k: v for k, v in state.items() if k not in partitioned_names}
    missing, unexpected = engine.module.load_state_dict(rest, strict=False)
    missing = [k for k in missing if k not in partitioned_names]
    if strict and (missing or unexpected):
        raise RuntimeError(f"zero: state dict mismatch: missing {missing}, "
                           f"unexpected {unexpected}")


@contextlib.contextmanager
def gathered_parameters(engine, params, modifier_rank=None):
    """zero.GatheredParameters: the units holding `params` are gathered inside the block;
    with modifier_rank set, that rank's edits are broadcast and written back on exit."""
    import torch.distributed as dist

    hooks = engine._stage3
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    units = sorted({hooks._plan.unit_of_param[id(p)] for p in params
                    if id(p) in engine._partitioned})
    for unit in units:
        hooks.gather(unit)
    try:
        yield
        if modifier_rank is not None:
            with torch.no_grad():
                for unit in units:
                    for param, _ in _unit_params(engine, unit):
                        dist.broadcast(param.data, src=modifier_rank)
                    for group, local in hooks._placement.get(unit, ()):
                        engine._core.commit(group, local)
    finally:
        for unit in units:
            hooks.release(unit)


class GatheredParameters:
    """deepspeed.zero.GatheredParameters(params, modifier_rank=None): inside the block the
    (stage-3 partitioned) parameters are whole; with modifier_rank set, that rank's edits are
    broadcast and written back into every rank's shard on exit. Parameters that are not
    partitioned need nothing and pass through."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        del fwd_module
        self._params = [params] if isinstance(params, torch.Tensor) else list(params)
        self._modifier_rank = modifier_rank
        self._enabled = enabled
        self._context = None

    def __enter__(self):
        engine = _ENGINES.get(_first_partitioned(self._params)) if self._enabled else None
        self._context = (gathered_parameters(engine, self._params, self._modifier_rank)
                         if engine is not None else contextlib.nullcontext())
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


# id(param) -> the stage-3 engine that partitions it (set by the engine, weakly by design:
# an engine lives as long as training does).
_ENGINES: dict = {}


def _first_partitioned(params):
    for param in params:
        if id(param) in _ENGINES:
            return id(param)
    return None
