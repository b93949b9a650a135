"""Any other torch optimizer on the shard: DeepSpeed's "untested optimizer" (its
`zero_allow_untested_optimizer`), e.g. the HF Trainer's RMSprop or Adafactor.

As DeepSpeed steps its client optimizer over its fp32 partitions, the engine keeps one fp32
master per engine group, and a copy of the script's optimizer (its class, attributes and the
group's hyperparameters; the copy's own state) steps that shard as one parameter. An
element-wise optimizer (RMSprop, Adamax, NAdam, RAdam, Adadelta, Rprop, ASGD, ...) therefore
updates each element exactly as it would unsharded; one that looks across a tensor
(Adafactor's RMS and factored moments, LAMB's trust ratio) sees this rank's shard as its
tensor, as under DeepSpeed.

The per-element arrays of each optimizer group (found by one probe step on a throwaway
parameter) live in the engine like Adam's moments, under the optimizer's own names: counted
by the memory report, checkpointed and resharded, read by safe_get_full_optimizer_state. Its
other state (step counts, NAdam's mu_product, ...) stays in the copies; checkpoints keep each
optimizer group's.
"""
from __future__ import annotations

import collections

import torch


class ExternalOptimizer:
    """The script's optimizer `client`, run by the engine on each engine group's shard."""

    def __init__(self, client: torch.optim.Optimizer):
        self.client = client
        self.name = type(client).__name__
        # per optimizer group (the client's own dicts): the state it keeps per element
        self._names = {id(group): probe(client, group) for group in client.param_groups}
        self._copies: dict[int, tuple[torch.optim.Optimizer, torch.nn.Parameter]] = {}
        self._stepped: set[int] = set()  # engine groups whose copy holds its state
        self._loaded: set[int] = set()  # engine groups whose scalars came from a checkpoint

    def state_names(self, group: dict) -> list[str]:
        """What the client keeps per element with optimizer group `group`'s hyperparameters."""
        return self._names[id(group)]

    def update(self, g: int, group: dict):
        """The update of engine group g (C++ calls it with its fp32 master, gradients and the
        arrays in state_names(group) order), with optimizer group `group`'s hyperparameters
        now (a scheduler may have changed them)."""
        names = self.state_names(group)

        def run(master: torch.Tensor, grads: torch.Tensor, arrays: list) -> None:
            copy, param = self._copy(g, group)
            copy.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
            param.data = master
            param.grad = grads
            state = copy.state[param]
            if g in self._loaded:  # read to the CPU
                _to_device(state, master.device, group)
                self._loaded.discard(g)
            if g in self._stepped:  # else the first step builds the state its own way
                state.update(zip(names, arrays))
            copy.step()
            self._stepped.add(g)
            _check_arrays(self.name, state, names, master)
            for name, array in zip(names, arrays):
                value = state.pop(name)  # the engine keeps it; the copy holds no reference
                if value is not array:  # built by the first step, or replaced
                    array.copy_(value)
            if param.data.data_ptr() != master.data_ptr():
                master.copy_(param.data)
            param.grad = None
            param.data = torch.empty(0)

        return run

    def _copy(self, g: int, group: dict):
        if g not in self._copies:
            param = torch.nn.Parameter(torch.empty(0))
            self._copies[g] = (_clone(self.client, group, param), param)
        return self._copies[g]

    def scalar_state(self, groups: list[dict], owners: list[int]) -> dict[int, dict]:
        """Per optimizer group (index into `groups`) that has stepped, the state that is not
        per element (its first engine group's: step counts and the like are the same in all).
        `owners`: engine group -> optimizer group."""
        scalars = {}
        for g, owner in enumerate(owners):
            if g in self._stepped and owner not in scalars:
                copy, param = self._copy(g, groups[owner])
                scalars[owner] = _cloned(copy.state[param])
        return scalars

    def load_scalar_state(self, scalars: dict[int, dict], groups: list[dict],
                          owners: list[int]) -> None:
        """The saved scalars into each engine group's copy; the engine's arrays join them at
        each step."""
        self._stepped.clear()
        for g, owner in enumerate(owners):
            copy, param = self._copy(g, groups[owner])
            copy.state[param] = _cloned(scalars.get(owner, {}))
            if owner in scalars:
                self._stepped.add(g)
                self._loaded.add(g)


def _clone(client: torch.optim.Optimizer, group: dict,
           param: torch.nn.Parameter) -> torch.optim.Optimizer:
    """The client's class and attributes over one parameter with `group`'s hyperparameters,
    with a state and step hooks of its own. Not the client's bound step: an LR scheduler built
    on the client wraps it on the instance."""
    copy = object.__new__(type(client))
    copy.__dict__.update({k: v for k, v in client.__dict__.items() if k != "step"})
    for key, value in client.__dict__.items():  # torch's hook registries
        if key.startswith("_optimizer_") and isinstance(value, collections.OrderedDict):
            setattr(copy, key, collections.OrderedDict())
    copy.state = collections.defaultdict(dict)
    copy.param_groups = [{**{k: v for k, v in group.items() if k != "params"},
                          "params": [param]}]
    return copy


def probe(client: torch.optim.Optimizer, group: dict) -> list[str]:
    """The state the client keeps per element with `group`'s hyperparameters: one step on a
    throwaway 1-D parameter where the group's parameters are (also the estimator's answer)."""
    device = group["params"][0].device if group["params"] else torch.device("cpu")
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 7, device=device))
    before = param.detach().clone()
    copy = _clone(client, group, param)
    param.grad = torch.linspace(-1e-3, 1e-3, 7, device=device)
    try:
        copy.step()
    except Exception as error:  # noqa: BLE001 - reported with what to do
        raise ValueError(f"zero: optimizer {type(client).__name__} cannot step a flat shard "
                         f"({type(error).__name__}: {error}); use Adam, AdamW, Adagrad, Lion "
                         "or SGD, or an element-wise torch optimizer") from None
    if torch.equal(param.detach(), before) and not copy.state[param]:
        raise ValueError(f"zero: optimizer {type(client).__name__} left a parameter as it was "
                         "and kept no state in a probe step; zero cannot tell how it updates a "
                         "shard")
    return _arrays(type(client).__name__, copy.state[param], param)


def _arrays(name: str, state: dict, param: torch.Tensor) -> list[str]:
    """The entries of `state` laid out like `param` (fp32 only)."""
    names = []
    for key, value in state.items():
        if torch.is_tensor(value) and value.shape == param.shape:
            if value.dtype != torch.float32:
                raise ValueError(f"zero: optimizer {name} keeps its state {key!r} in "
                                 f"{value.dtype}; zero keeps an external optimizer's "
                                 "per-element state in fp32")
            names.append(key)
    return names


def _check_arrays(name: str, state: dict, names: list[str], master: torch.Tensor) -> None:
    """The real step kept what the probe found (a state that appears later, or depends on
    values the probe did not meet, would be lost between steps)."""
    found = _arrays(name, state, master)
    if sorted(found) != sorted(names):
        raise RuntimeError(f"zero: optimizer {name} keeps {sorted(found)} per element on the "
                           f"shard, its probe step kept {sorted(names)}; zero cannot hold its "
                           "state: use Adam, AdamW, Adagrad, Lion or SGD")


def _to_device(state: dict, device: torch.device, group: dict) -> None:
    """Loaded scalars (read to the CPU) where torch keeps them: with the parameters, except a
    step count, which stays on the CPU unless the group is capturable or fused."""
    for key, value in state.items():
        if torch.is_tensor(value) and value.device != device:
            if key != "step" or group.get("capturable") or group.get("fused"):
                state[key] = value.to(device)


def _cloned(state: dict) -> dict:
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
