"""Any other torch optimizer on the shard: DeepSpeed's "untested optimizer" (its
`zero_allow_untested_optimizer`), e.g. the HF Trainer's RMSprop or Adafactor.

As DeepSpeed steps its client optimizer over its fp32 partitions, the engine keeps one fp32
master per engine group, and a copy of the script's optimizer (its class, attributes and
hyperparameters; the copy's own state) steps that shard as one parameter. An element-wise
optimizer (RMSprop, Adamax, NAdam, RAdam, Adadelta, Rprop, ASGD, ...) therefore updates each
element exactly as it would unsharded; one that looks across a tensor (Adafactor's RMS and
factored moments, LAMB's trust ratio) sees this rank's shard as its tensor, as under
DeepSpeed.

The optimizer's per-element arrays (found by one probe step on a throwaway parameter) live in
the engine like Adam's moments, under the optimizer's own names: counted by the memory report,
checkpointed and resharded, read by safe_get_full_optimizer_state. Its other state (step
counts, NAdam's mu_product, ...) stays in the copies; checkpoints keep each optimizer group's.
"""
from __future__ import annotations

import collections

import torch


class ExternalOptimizer:
    """The script's optimizer `client`, run by the engine on each engine group's shard."""

    def __init__(self, client: torch.optim.Optimizer):
        self.client = client
        self.name = type(client).__name__
        self.state_names = _probe(client)
        self._copies: dict[int, tuple[torch.optim.Optimizer, torch.nn.Parameter]] = {}
        self._owners: dict[int, int] = {}  # engine group -> optimizer group
        self._stepped: set[int] = set()  # engine groups whose copy holds its state

    def update(self, g: int, owner: int, group: dict):
        """The update of engine group g (C++ calls it with its fp32 master, gradients and the
        arrays in state_names order), with optimizer group `group`'s hyperparameters now."""
        self._owners[g] = owner

        def run(master: torch.Tensor, grads: torch.Tensor, arrays: list) -> None:
            copy, param = self._copy(g)
            copy.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
            param.data = master
            param.grad = grads
            state = copy.state[param]
            if g in self._stepped:  # else the first step builds the state its own way
                state.update(zip(self.state_names, arrays))
            copy.step()
            self._stepped.add(g)
            for name, array in zip(self.state_names, arrays):
                value = state.pop(name)  # the engine keeps it; the copy holds no reference
                if value is not array:  # built by the first step, or replaced
                    array.copy_(value)
            if param.data.data_ptr() != master.data_ptr():
                master.copy_(param.data)
            param.grad = None
            param.data = torch.empty(0)

        return run

    def _copy(self, g: int):
        if g not in self._copies:
            param = torch.nn.Parameter(torch.empty(0))
            self._copies[g] = (_clone(self.client, param), param)
        return self._copies[g]

    def scalar_state(self) -> dict[int, dict]:
        """Per optimizer group that has stepped, the state that is not per element (its first
        engine group's: step counts and the like are the same in all)."""
        scalars = {}
        for g, owner in sorted(self._owners.items()):
            if g in self._stepped and owner not in scalars:
                copy, param = self._copy(g)
                scalars[owner] = _cloned(copy.state[param])
        return scalars

    def load_scalar_state(self, scalars: dict[int, dict], owners: list[int]) -> None:
        """The saved scalars into each engine group's copy (`owners`: engine group ->
        optimizer group); the engine's arrays join them at each step."""
        self._stepped.clear()
        for g, owner in enumerate(owners):
            copy, param = self._copy(g)
            copy.state[param] = _cloned(scalars.get(owner, {}))
            if owner in scalars:
                self._stepped.add(g)


def _cloned(state: dict) -> dict:
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}


def _clone(client: torch.optim.Optimizer, param: torch.nn.Parameter) -> torch.optim.Optimizer:
    """The client's class and attributes over one parameter, with a state of its own."""
    copy = object.__new__(type(client))
    copy.__dict__.update(client.__dict__)
    copy.state = collections.defaultdict(dict)
    copy.param_groups = [{**{k: v for k, v in client.param_groups[0].items() if k != "params"},
                          "params": [param]}]
    return copy


def _probe(client: torch.optim.Optimizer) -> list[str]:
    """The state the client keeps per element: one step on a throwaway 1-D parameter."""
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 7))
    copy = _clone(client, param)
    param.grad = torch.linspace(-1e-3, 1e-3, 7)
    try:
        copy.step()
    except Exception as error:  # noqa: BLE001 - reported with what to do
        raise ValueError(f"zero: optimizer {type(client).__name__} cannot step a flat shard "
                         f"({type(error).__name__}: {error}); use Adam, AdamW, Adagrad, Lion "
                         "or SGD, or an element-wise torch optimizer") from None
    names = []
    for name, value in copy.state[param].items():
        if torch.is_tensor(value) and value.shape == param.shape:
            if value.dtype != torch.float32:
                raise ValueError(f"zero: optimizer {type(client).__name__} keeps its state "
                                 f"{name!r} in {value.dtype}; zero keeps an external "
                                 "optimizer's per-element state in fp32")
            names.append(name)
    return names
