"""ZeRO-3 on the Python side: which parameters form which gather unit, and the thin module
hooks that report each unit's forward to the C++ schedule and attach its C++ backward
triggers. The partitioning, the scheduling, the all-gathers, the reduce-scatters and the
memory live in C++ (csrc/adapter/stage3_group.h, gather_schedule.h, backward_hooks.h).

Gather-unit policy (documented in docs/ARCHITECTURE.md):
  * a module marked with gather_unit(module) (or whose class was named in
    set_z3_leaf_modules, DeepSpeed's call, or chosen by the config's granularity threshold
    and leaf modules: stage3_policy.UnitRules) is one unit with everything inside it;
  * every other child of an nn.ModuleList that owns parameters is one unit (the transformer
    blocks of a GPT, the layers of most models); marked modules inside it are units of their
    own within it (nested: a MoE block marked by set_z3_leaf_modules inside its layer);
  * every other managed parameter belongs to the root unit, which stays gathered for the
    whole forward (embeddings, final norm, and a head tied to the embedding);
  * parameters with at most `stage3_param_persistence_threshold` elements (within
    `stage3_model_persistence_threshold` in all: stage3_policy.kept_whole) are not
    partitioned: they stay whole on every rank (a stage-1 group: gradients all-reduced,
    optimizer state sharded) and are reported separately;
  * frozen parameters (requires_grad False, as a LoRA base model's) are partitioned and
    gathered with their units too (a frozen group: no gradients, master or optimizer state),
    unless kept whole by the same thresholds (then they stay as they are).
Units are numbered in forward order. A parameter used by a module of another unit must be
registered (register_external_parameter), as in DeepSpeed; a module of another unit called
in a unit's forward is linked the same way by the first forward (zero/stage3_cross_calls.py).

Each partitioned parameter carries `param._zero_owner` (OWNER_ATTR), a weak handle to the
Stage3Hooks of the engine that partitions it: GatheredParameters and
register_external_parameter find their engine through it. It never keeps an engine alive,
and a copy or pickle of the parameter is owned by nobody.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import agreement
from .eager_hooks import dynamo_loaded, eager
from .stage3_cross_calls import CrossUnitCalls
from .stage3_policy import class_named
from .stage3_root_parts import RootParts


@dataclass
class UnitPlan:
    modules: list[tuple[str, nn.Module]]           # unit index -> (name, module)
    unit_of_param: dict[int, int] = field(default_factory=dict)  # id(param) -> unit
    # unit index -> the unit whose module encloses its own most closely (0, the root, for
    # the top level; the root's is 0): a marked module inside a block is a unit in that unit
    parents: list[int] = field(default_factory=list)

    def units_owned(self, partitioned: dict[int, nn.Parameter]) -> list[tuple[nn.Module, set[int]]]:
        """Each module (the root too) that owns partitioned parameters itself, not through a
        child, with the units they belong to."""
        found = []
        for module in self.modules[0][1].modules():
            units = {self.unit_of_param.get(id(p)) for p in module.parameters(recurse=False)
                     if id(p) in partitioned} - {None}
            if units:
                found.append((module, units))
        return found


class UnitPart(NamedTuple):
    """One engine group's piece of a model unit: its group-local unit `local` (`group`
    numbers the frozen groups when `frozen`: EngineCore.add_frozen_stage3_group)."""
    group: int
    local: int
    frozen: bool = False


UNIT_ATTR = "_z3_leaf"  # DeepSpeed's flag (deepspeed.utils.z3_leaf_module reads it)


def is_gather_unit(module: nn.Module) -> bool:
    """Whether `module` is flagged as one gather unit (gather_unit, DeepSpeed's leaf flag)."""
    return bool(getattr(module, UNIT_ATTR, False))  # (a class may set it, as for DeepSpeed)


def gather_unit(module: nn.Module, flag: bool = True) -> nn.Module:
    """Makes `module` (with everything inside it) one stage-3 gather unit: one all-gather
    before it runs, one reduce-scatter of its gradients (flag False: no longer). Returns the
    module."""
    module.__dict__[UNIT_ATTR] = flag
    return module


def modules_of_classes(model: nn.Module, leaf_module_classes) -> list[nn.Module]:
    """The modules inside `model` of the given classes, or class names (plain or
    module.Qualname), in `model.modules()` order."""
    if not all(isinstance(c, (type, str)) for c in leaf_module_classes):
        raise TypeError(f"zero: leaf_module_classes must be classes or class names, got "
                        f"{list(leaf_module_classes)}")
    classes = tuple(c for c in leaf_module_classes if isinstance(c, type))
    names = {c for c in leaf_module_classes if isinstance(c, str)}
    return [m for m in model.modules() if isinstance(m, classes) or class_named(m, names)]


def set_z3_leaf_modules(model: nn.Module, leaf_module_classes,
                        raise_if_not_found: bool = True, flag: bool = True) -> list[nn.Module]:
    """DeepSpeed's deepspeed.utils.set_z3_leaf_modules: every instance of the given classes
    (or class names, plain or module.Qualname) inside `model` becomes one gather unit (inside
    the block that holds it); flag False undoes it (unset_z3_leaf_modules). None found is a
    ValueError unless raise_if_not_found is false."""
    marked = modules_of_classes(model, leaf_module_classes)
    if not marked and raise_if_not_found:
        raise ValueError(f"zero: set_z3_leaf_modules: no module of {list(leaf_module_classes)} "
                         f"in {type(model).__name__}")
    return [gather_unit(m, flag) for m in marked]


def mark_leaf_modules(model: nn.Module, units=()) -> None:
    """As DeepSpeed's stage 3 leaves a model: `units` (the config's leaf modules and those of
    its granularity threshold, stage3_policy.UnitRules) flagged as leaves too, and each
    parameter inside a flagged module naming the outermost one in `param.ds_z3_leaf_module`
    (deepspeed.utils.z3_leaf_module / z3_leaf_parameter read them)."""
    for unit in units:
        gather_unit(unit)
    inside: set[int] = set()
    for module in model.modules():  # pre-order: the outermost flagged module first
        if id(module) in inside or not is_gather_unit(module):
            continue
        for param in module.parameters():
            param.ds_z3_leaf_module = module
        inside.update(id(m) for m in module.modules())


def plan_units(model: nn.Module, marked_units=()) -> UnitPlan:
    """The gather units of `model` (the policy above); `marked_units`: modules treated as
    marked besides those gather_unit marked (stage3_policy.UnitRules); the model itself
    marked makes it one unit."""
    units: list[tuple[str, nn.Module]] = [("", model)]
    extra = {id(m) for m in marked_units}
    root_marked = id(model) in extra or is_gather_unit(model)
    inside_unit: set[int] = {id(m) for m in model.modules()} if root_marked else set()
    has_params = lambda m: any(True for _ in m.parameters())  # noqa: E731
    marked = {id(m) for m in model.modules()
              if m is not model and (is_gather_unit(m) or id(m) in extra)}
    for name, module in model.named_modules():  # marked modules first: they win
        if id(module) in marked and id(module) not in inside_unit and has_params(module):
            units.append((name, module))
            inside_unit.update(id(m) for m in module.modules())
    claimed = {id(p) for _, unit in units[1:] for p in unit.parameters()}  # the marked units'
    for name, module in model.named_modules():
        if id(module) in inside_unit or not isinstance(module, nn.ModuleList):
            continue
        for child_name, child in module.named_children():
            # a block holding marked modules is a unit for the rest of it (nested units)
            owns = any(id(p) not in claimed for p in child.parameters())
            if owns and id(child) not in inside_unit:
                units.append((f"{name}.{child_name}" if name else child_name, child))
                inside_unit.update(id(m) for m in child.modules())
    order = {id(m): i for i, m in enumerate(model.modules())}
    units[1:] = sorted(units[1:], key=lambda unit: order[id(unit[1])])  # definition order
    plan = UnitPlan(units, parents=_parents(units))
    for index in range(len(units) - 1, -1, -1):  # inner units first, the root gets the rest
        for param in units[index][1].parameters():
            plan.unit_of_param.setdefault(id(param), index)
    return plan


def _parents(units: list[tuple[str, nn.Module]]) -> list[int]:
    """Each unit's innermost enclosing unit (units in definition order: an enclosing unit comes
    first)."""
    inside = [{id(m) for m in module.modules()} for _, module in units]
    return [0] + [max(v for v in range(u) if id(units[u][1]) in inside[v])
                  for u in range(1, len(units))]


def _modules_of(plan: UnitPlan, unit: int, roots: set[int]) -> list[nn.Module]:
    """The modules that run as part of `unit`: its module's tree down to, not into, the units
    nested in it (`roots`: every unit's module). A module registered under several units (one
    shared layer) is in each."""
    found, stack, seen = [], [plan.modules[unit][1]], set()
    while stack:
        module = stack.pop()
        if id(module) not in seen:
            seen.add(id(module))
            found.append(module)
            stack.extend(child for child in module.children() if id(child) not in roots)
    return found


def external_links(plan: UnitPlan) -> list[tuple[int, int]]:
    """(user unit, owner unit) for every parameter a module of another unit uses: registered
    as external (register_external_parameter), or its own but owned elsewhere (a head tied
    to an embedding that a marked unit took; a layer shared by several blocks, whose
    parameters the last of them owns)."""
    links, roots = [], {id(module) for _, module in plan.modules}
    for user in range(len(plan.modules)):
        for module in _modules_of(plan, user, roots):
            used = [*getattr(module, EXTERNAL_ATTR, ()), *module.parameters(recurse=False)]
            for param in used:
                owner = plan.unit_of_param.get(id(param))
                if owner is not None and owner != user and (user, owner) not in links:
                    links.append((user, owner))
    return links


EXTERNAL_ATTR = "_zero_external_params"


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """deepspeed.zero.register_external_parameter: `module`'s forward uses `parameter`, which
    belongs to another module (e.g. a head that reads the embedding's weight). At stage 3 the
    parameter's unit is then gathered whenever `module`'s unit is, in forward and backward.
    Call it before or after zero.initialize (the engine picks it up either way)."""
    if not isinstance(parameter, torch.Tensor):
        raise TypeError(f"zero: register_external_parameter expects a parameter, got "
                        f"{type(parameter).__name__}")
    registered = module.__dict__.setdefault(EXTERNAL_ATTR, [])
    if not any(p is parameter for p in registered):
        registered.append(parameter)
    hooks = owner_of(parameter)
    if hooks is not None:
        hooks.link_externals()


def unregister_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    registered = module.__dict__.get(EXTERNAL_ATTR, [])
    module.__dict__[EXTERNAL_ATTR] = [p for p in registered if p is not parameter]


class _ExternalParameters:
    """module.ds_external_parameters(), DeepSpeed's: (id, parameter) of each parameter
    registered as used by the module. A copy or a pickle of the module keeps none: nobody
    manages it."""

    __slots__ = ("_module",)

    def __init__(self, module: nn.Module | None = None):
        self._module = weakref.ref(module) if module is not None else None

    def __call__(self) -> list[tuple[int, nn.Parameter]]:
        module = self._module() if self._module is not None else None
        if module is None:
            return []
        return [(id(p), p) for p in module.__dict__.get(EXTERNAL_ATTR, [])]

    def __reduce__(self):
        return (_ExternalParameters, ())

    def __deepcopy__(self, memo):
        return _ExternalParameters()


def add_ds_external_parameters(model: nn.Module) -> None:
    """Gives every module of `model` DeepSpeed's ds_external_parameters() (TRL's remove_hooks
    reads the root's)."""
    for module in model.modules():
        module.ds_external_parameters = _ExternalParameters(module)


class Stage3Hooks:
    """Thin module hooks that report events to the C++ gather schedule (gather_schedule.h):
    before/after each unit's forward. The backward triggers are C++ autograd functions
    attached here to each unit's inputs and outputs (backward_hooks.h); the end-of-backward
    flush is queued by the first of them. Python only flattens the tensors."""

    def __init__(self, core, plan: UnitPlan, placement: dict[int, list[UnitPart]],
                 step_counter, partitioned: dict[int, nn.Parameter],
                 param_names: dict[int, list[str]], full_shapes: dict[int, torch.Size]):
        self._core = core
        self.plan = plan
        self.placement = placement  # model unit -> its groups' pieces
        self.partitioned = partitioned  # id(param) -> param, for every partitioned parameter
        self.param_names = param_names  # id(param) -> its names in the model (ties: several)
        self.full_shapes = full_shapes  # id(param) -> its whole shape
        self._step = step_counter     # callable: the engine's global step
        self._handles = []
        self._hooks_eager = False  # the hooks on are wrapped for torch.compile (eager_hooks)
        self._linked: set[tuple[int, int]] = set()
        self._root_parts = RootParts(self, plan.modules[0][1], RootParts.owners(plan, partitioned))
        self._cross_calls = CrossUnitCalls(self, plan, partitioned)
        self.suspended = False  # the module hooks do nothing (whole_model)
        # (param, modifier_rank) -> (source rank, group) of a GatheredParameters edit; the
        # engine's MoE layout sends an expert's within its expert data-parallel group
        self.modifier_source = lambda param, rank: (rank, None)
        for unit in range(len(plan.modules)):
            for part in placement.get(unit, ()):
                core.place(unit, part.group, part.local, part.frozen)
        self.attach_module_hooks()
        for param in partitioned.values():
            setattr(param, OWNER_ATTR, _Owner(self))
            if hasattr(param, RELEASED_ATTR):  # refilled since an earlier engine's destroy()
                delattr(param, RELEASED_ATTR)
        self.link_externals()

    @property
    def module_hooks(self) -> list:
        """The handles of the module hooks (torch's RemovableHandle)."""
        return list(self._handles)

    def attach_module_hooks(self) -> None:
        """Puts the module hooks on (again: the ones there are taken off first)."""
        self.detach_module_hooks()
        for unit, (_, module) in enumerate(self.plan.modules):
            if unit == 0 or unit in self.placement:  # the root always: it opens every forward
                self._handles.append(module.register_forward_pre_hook(
                    self._pre_forward(unit), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._post_forward(unit)))
        self._handles += self._root_parts.attach()  # (after the root's own: see module_hooks_attached)
        self._cross_calls.attach()  # the first forward's only (kept apart: module_hooks)
        self._hooks_eager = False
        self.make_hooks_eager()

    def make_hooks_eager(self) -> None:
        """Once dynamo is loaded (torch.compile loads it): wraps the module hooks that are on,
        in place (their order among the model's other hooks kept), so that torch.compile runs
        them as they are (zero/eager_hooks.py). Cheap when there is nothing to do: the engine
        calls it at every forward. A model compiled in place (module.compile(), engine.compile)
        loses the first forward's hooks (zero/stage3_cross_calls.py) before that forward:
        taken off after it, they would make dynamo recompile what it compiled with them."""
        if getattr(self.plan.modules[0][1], "_compiled_call_impl", None) is not None:
            self._cross_calls.stop()
        if self._hooks_eager or not dynamo_loaded():
            return
        for handle in self._handles + self._cross_calls.handles:
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                hooks[handle.id] = eager(hooks[handle.id])
        self._hooks_eager = True

    def detach_module_hooks(self) -> None:
        """Takes the module hooks off: the model then runs on what its parameters hold now
        (inside GatheredParameters, whole; outside, the empty placeholders)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._cross_calls.detach()

    @property
    def removed(self) -> bool:
        """True once remove() let go of the engine (engine.destroy())."""
        return self._core is None

    def module_hooks_attached(self) -> bool:
        """Whether the root's hook is still on the model (a caller may have removed the
        handles themselves, as TRL's remove_hooks does)."""
        if not self._handles:
            return False
        root = self._handles[0]
        hooks = root.hooks_dict_ref()
        return hooks is not None and root.id in hooks

    def link_externals(self) -> None:
        for user, owner in external_links(self.plan):
            self.link_external(user, owner)

    def link_external(self, user: int, owner: int) -> None:
        """Unit `user` uses parameters of unit `owner`: from now on `owner` is gathered whenever
        `user` is (at once, if `user` is in use now)."""
        if (user, owner) not in self._linked:
            self._core.add_external(user, owner)
            self._linked.add((user, owner))

    def hold(self, unit: int) -> None:
        """Gathers a unit outside forward/backward (state dicts, GatheredParameters)."""
        self._core.hold(unit)

    def unhold(self, unit: int, hand_over: bool = True) -> None:
        """hand_over: a gathered buffer still referenced elsewhere (a tensor a script kept) is
        left to it; False: freed in place (for a forward's saved views, refilled in backward)."""
        self._core.unhold(unit, hand_over)

    def commit(self, unit: int) -> None:
        """The unit's gathered values (edited in place) become every rank's shard and fp32
        master; call while it is held."""
        for part in self.placement.get(unit, ()):
            self._core.commit(part.group, part.local, part.frozen)

    def attach_post_backward(self, unit: int, value):
        """`value` with its tensors routed through the unit's end-of-backward trigger."""
        return _map_tensors(value, lambda tensors: self._core.attach_post_backward(unit, tensors))

    def attach_pre_backward(self, unit: int, value):
        """`value` with its tensors routed through the unit's start-of-backward trigger."""
        return _map_tensors(value, lambda tensors: self._core.attach_pre_backward(unit, tensors))

    def unit_params(self, unit: int):
        """(param, [names]) of the partitioned parameters of one unit."""
        for param_id, param in self.partitioned.items():
            if self.plan.unit_of_param[param_id] == unit:
                yield param, self.param_names[param_id]

    def units_of(self, params) -> list[int]:
        return sorted({self.plan.unit_of_param[id(p)] for p in params
                       if id(p) in self.partitioned})

    # The model keeps its hooks; the hooks must not keep this object (and through it the C++
    # engine, its buffers and swap files) alive, or model and engine would form a cycle.
    def _pre_forward(self, unit):
        this = weakref.ref(self)

        def hook(_module, args, kwargs):
            hooks = this()
            if hooks is None or hooks.suspended:
                return None
            training = torch.is_grad_enabled()
            hooks._core.before_forward(unit, hooks._step(), training)
            return hooks.attach_post_backward(unit, (args, kwargs)) if training else None
        return hook

    def _post_forward(self, unit):
        this = weakref.ref(self)

        def hook(_module, _inputs, outputs):
            hooks = this()
            if hooks is None or hooks.suspended:
                return None
            hooks._core.after_forward(unit)
            return hooks.attach_pre_backward(unit, outputs) if torch.is_grad_enabled() else None
        return hook

    def remove(self) -> None:
        """Takes the hooks off the model and lets go of the C++ engine. The partitioned
        parameters stay empty (as DeepSpeed's, whose destroy() also only removes its hooks;
        here the shards go with the engine): marked, so that a new engine over them says
        what happened (refuse_released_parameters)."""
        self.detach_module_hooks()
        for param in self.partitioned.values():
            if getattr(param, OWNER_ATTR, None) is not None and owner_of(param) is self:
                delattr(param, OWNER_ATTR)
                setattr(param, RELEASED_ATTR, True)
        self._core = None


def _map_tensors(value, fn):
    """`value` with its tensors (found through lists, tuples, dicts and other pytree nodes)
    replaced by fn(all of them at once)."""
    leaves, spec = tree_flatten(value)
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if not where:
        return value
    for i, tensor in zip(where, fn([leaves[i] for i in where])):
        leaves[i] = tensor
    return tree_unflatten(leaves, spec)


@contextlib.contextmanager
def whole_model(hooks: Stage3Hooks):
    """Every unit gathered at once and the module hooks idle: inside, the model runs as a plain
    module on whole parameters (the hybrid engine's generate). Collective: every rank enters it."""
    held, suspended = [], hooks.suspended
    try:
        for unit in range(len(hooks.plan.modules)):
            hooks.hold(unit)
            held.append(unit)
        hooks.suspended = True  # (not taken off: TRL's remove_hooks keeps the handles it saw)
        yield
    finally:
        hooks.suspended = suspended
        for unit in reversed(held):
            hooks.unhold(unit)


def each_gathered_unit(hooks: Stage3Hooks):
    """Yields every unit index while that unit (and only it) is gathered."""
    for unit in range(len(hooks.plan.modules)):
        hooks.hold(unit)
        try:
            yield unit
        finally:
            hooks.unhold(unit)


def full_state_dict(hooks: Stage3Hooks, module: nn.Module, keep) -> dict:
    """The module's state dict with every partitioned parameter whole, built unit by unit so
    no rank ever holds more than one gathered unit beyond its shards. Every rank takes part
    in the gathers; only ranks with keep=True keep the (CPU) copies (`keep` may also be a
    predicate on the name: MoE's experts, which every rank holds its own of)."""
    kept = keep if callable(keep) else (lambda name: keep)
    state, copies = {}, {}
    # one copy per tensor: tied names share it, as in the module (and DeepSpeed)
    for name, value in module.state_dict(keep_vars=True).items():
        if kept(name):
            if id(value) not in copies:
                copies[id(value)] = value.detach().cpu().clone()
            state[name] = copies[id(value)]
    for unit in each_gathered_unit(hooks):
        for param, names in hooks.unit_params(unit):
            names = [name for name in names if kept(name)]
            if names:
                state.update(dict.fromkeys(names, param.detach().cpu().clone()))
    return state


def _check_partitioned_state(hooks: Stage3Hooks, state: dict, strict: bool) -> None:
    """What torch's load_state_dict would refuse of the partitioned parameters, found before
    anything is gathered or written: a value that is not a tensor of the parameter's whole
    shape, and with `strict` a parameter none of whose names the state has."""
    errors, missing = [], []
    for pid, names in hooks.param_names.items():
        if pid not in hooks.partitioned:
            continue
        name = next((name for name in names if name in state), None)
        if name is None:
            missing.append(names[0])
            continue
        value, whole = state[name], tuple(hooks.full_shapes[pid])
        if not isinstance(value, torch.Tensor):
            errors.append(f"{name}: expected a tensor, got {type(value).__name__}")
        elif tuple(value.shape) != whole:
            errors.append(f"size mismatch for {name}: copying a param with shape "
                          f"{tuple(value.shape)} from checkpoint, the shape in current model "
                          f"is {whole}")
    if strict and missing:
        errors.append(f"missing keys {missing}")
    if errors:
        raise RuntimeError("zero: error(s) in loading the state dict (nothing was loaded): "
                           + "; ".join(errors))


def _load_the_rest(module: nn.Module, rest: dict, partitioned_names: set, strict: bool) -> None:
    """Everything but the partitioned parameters, through torch's own load_state_dict (its
    hooks, its shape checks), with its strictness for keys other than the partitioned ones."""
    missing, unexpected = module.load_state_dict(rest, strict=False)
    missing = [key for key in missing if key not in partitioned_names]
    if strict and (missing or unexpected):
        raise RuntimeError(f"zero: error(s) in loading the state dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")


def load_full_state_dict(hooks: Stage3Hooks, module: nn.Module, state: dict,
                         strict: bool) -> None:
    """Loads a whole-parameter state dict into the shards: unit by unit, gather, overwrite,
    commit this rank's piece (and fp32 master), release. Everything else (persistent and
    frozen parameters, buffers) loads through the module as usual. A state whose partitioned
    parameters the model cannot take is refused on every rank before any gather; an error in
    the rest stops every rank too (after the partitioned parameters were loaded, as torch's
    own strict load raises after loading the rest)."""
    agreement.on_every_rank(lambda: _check_partitioned_state(hooks, state, strict),
                            RuntimeError, "nothing was loaded")
    partitioned_names = {name for pid in hooks.partitioned for name in hooks.param_names[pid]}
    with torch.no_grad():
        for unit in each_gathered_unit(hooks):
            for param, names in hooks.unit_params(unit):
                source = next((state[name] for name in names if name in state), None)
                if source is not None:
                    param.data.copy_(source)
            hooks.commit(unit)
    rest = {key: value for key, value in state.items() if key not in partitioned_names}
    agreement.on_every_rank(lambda: _load_the_rest(module, rest, partitioned_names, strict),
                            RuntimeError, "the partitioned parameters were loaded, the rest not "
                            "on every rank")


@contextlib.contextmanager
def gathered_parameters(hooks: Stage3Hooks, params, modifier_rank=None):
    """zero.GatheredParameters: the units holding `params` are gathered inside the block;
    with modifier_rank set, that rank's edits are broadcast and written back on exit."""
    import torch.distributed as dist

    params = [params] if isinstance(params, torch.Tensor) else list(params)
    units = hooks.units_of(params)
    for unit in units:
        hooks.hold(unit)
    try:
        yield
        if modifier_rank is not None:
            with torch.no_grad():
                for unit in units:
                    for param, _ in hooks.unit_params(unit):
                        dist.broadcast(param.data, *hooks.modifier_source(param, modifier_rank))
                    hooks.commit(unit)
    finally:
        for unit in units:
            hooks.unhold(unit)


class GatheredParameters:
    """deepspeed.zero.GatheredParameters(params, modifier_rank=None): inside the block the
    (stage-3 partitioned, or zero.Init-partitioned) parameters are whole; with modifier_rank
    set, that rank's edits are broadcast and written back into every rank's shard on exit,
    and into the parameters zero.Init kept whole (as DeepSpeed's persistent ones). Other
    parameters that are not partitioned need nothing and pass through."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        del fwd_module
        self._params = [params] if isinstance(params, torch.Tensor) else list(params)
        self._modifier_rank = modifier_rank
        self._enabled = enabled
        self._context = None

    def __enter__(self):
        self._context = contextlib.ExitStack()
        if self._enabled:
            with contextlib.ExitStack() as stack:  # (a failed gather lets go of the others)
                for context in self._gathers():
                    stack.enter_context(context)
                self._context = stack.pop_all()
        return None

    def _gathers(self):
        """One gather per engine owning some of the parameters (DeepSpeed-Chat's EMA update
        gathers an actor's parameter and its copy's: two engines), in the order they first
        appear, the same on every rank; then zero.Init's parameters that no engine owns yet."""
        from . import init as zero_init

        owners: dict[int, tuple[Stage3Hooks, list]] = {}
        unowned = []
        for param in self._params:
            hooks = owner_of(param)
            if hooks is None:
                unowned.append(param)
            else:
                owners.setdefault(id(hooks), (hooks, []))[1].append(param)
        for hooks, params in owners.values():
            yield gathered_parameters(hooks, params, self._modifier_rank)
        if unowned:  # (zero_init.gathered passes by what it has nothing to do for)
            yield zero_init.gathered(unowned, self._modifier_rank)

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


OWNER_ATTR = "_zero_owner"
RELEASED_ATTR = "_zero_released"  # partitioned by an engine since destroyed: no values left


def refuse_released_parameters(model: nn.Module) -> None:
    """A model whose stage-3 engine was destroyed holds empty parameters: a new engine over
    it is refused, naming them and the way to keep the weights."""
    released = [name for name, param in model.named_parameters()
                if getattr(param, RELEASED_ATTR, False) and param.numel() == 0]
    if released:
        raise ValueError(
            f"zero: {len(released)} parameters of this model (e.g. {released[0]!r}) were "
            "partitioned at stage 3 by an engine that was destroyed since; they hold no values "
            "(their shards went with the engine). To go on with the weights: save them before "
            "destroy() "
            "(engine.save_checkpoint, or engine.save_16bit_model) and load them into a newly "
            "built model, or keep the engine")


class _Owner:
    """What param._zero_owner holds: a weak handle to the Stage3Hooks partitioning it."""

    __slots__ = ("_hooks",)

    def __init__(self, hooks: Stage3Hooks | None = None):
        self._hooks = weakref.ref(hooks) if hooks is not None else None

    def __call__(self) -> Stage3Hooks | None:
        return self._hooks() if self._hooks is not None else None

    def __reduce__(self):  # a pickled parameter is owned by nobody
        return (_Owner, ())

    def __deepcopy__(self, memo):  # nor is a copy
        return _Owner()


def owner_of(param) -> Stage3Hooks | None:
    """The live stage-3 engine (its Stage3Hooks) that partitions `param`, if any."""
    owner = getattr(param, OWNER_ATTR, None)
    hooks = owner() if owner is not None else None
    return hooks if hooks is not None and hooks._core is not None else None
