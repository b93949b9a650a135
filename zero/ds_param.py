"""DeepSpeed's ZeRO-3 face on a parameter: `ds_id`, `ds_shape`, `ds_numel`, `ds_persist`,
`ds_status` and `ds_active_sub_modules` (always empty here), what scripts and libraries read
on a DeepSpeed stage-3 model. PEFT and the HF examples count `ds_numel` where `numel()` is
0 (a partitioned parameter); RLHF trainers gather the parameters whose `ds_status` is
`NOT_AVAILABLE` before handing weights over.

zero.Init and a stage-3 engine mark each parameter they manage (`mark`): the static values
become attributes, and a plain nn.Parameter becomes a ZeroParameter, the same object with
its class swapped (ties, hooks and the optimizer's references all hold), whose `ds_status`
reads its own storage: AVAILABLE while it holds its whole shape (gathered, or kept whole),
NOT_AVAILABLE while it is this rank's empty placeholder. zero gathers in C++ and waits before
Python sees a parameter, so INFLIGHT is never reported. A parameter of another class
(another library's subclass) is left alone.
"""
from __future__ import annotations

import enum
import itertools
import math

import torch
from torch import nn


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's (deepspeed.runtime.zero.partition_parameters), with its values."""
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


_ATTRIBUTES = ("ds_shape", "ds_numel", "ds_persist", "ds_id", "ds_active_sub_modules",
               "ds_z3_leaf_module")  # (stage3.mark_leaf_modules')


class ZeroParameter(nn.Parameter):
    """A parameter zero.Init or a stage-3 engine manages (see the module's docstring). A copy
    or a pickle of it is a plain nn.Parameter without the ds_* attributes: nobody manages
    it (DeepSpeed's copies lose them too)."""

    @property
    def ds_status(self) -> ZeroParamStatus:
        whole = self.numel() == self.ds_numel
        return ZeroParamStatus.AVAILABLE if whole else ZeroParamStatus.NOT_AVAILABLE

    def __deepcopy__(self, memo):
        if id(self) not in memo:
            memo[id(self)] = nn.Parameter(self.data.clone(memory_format=torch.preserve_format),
                                          self.requires_grad)
        return memo[id(self)]

    def __reduce_ex__(self, protocol):
        rebuild, args = super().__reduce_ex__(protocol)[:2]
        if rebuild is torch._utils._rebuild_parameter_with_state:
            data, requires_grad, hooks, state = args
            if isinstance(state, tuple):  # (__dict__, slots)
                state = (_without_ds(state[0]), state[1])
            else:
                state = _without_ds(state)
            args = (data, requires_grad, hooks, state)
        return rebuild, args


def _without_ds(attributes: dict | None) -> dict | None:
    return attributes and {k: v for k, v in attributes.items() if k not in _ATTRIBUTES}


_IDS = itertools.count()  # ds_id: in order of marking, unique in this process, as DeepSpeed's


def mark(param: nn.Parameter, full_shape, persist: bool) -> None:
    """Gives `param` DeepSpeed's stage-3 attributes: its whole shape `full_shape`, and
    `persist` when it is kept whole on every rank (DeepSpeed's persistent parameters). A
    parameter of another class (another library's subclass) is left as it is: ds_id without
    ds_status would break the loops that read both."""
    if not hasattr(param, "ds_active_sub_modules"):
        # DeepSpeed's ids of the modules using the parameter now; zero counts a unit's users
        # in C++, so it stays empty (TRL's remove_hooks clears it on every parameter)
        param.ds_active_sub_modules = set()
    if type(param) is nn.Parameter:
        param.__class__ = ZeroParameter
    elif not isinstance(param, ZeroParameter):
        return
    param.ds_shape = torch.Size(full_shape)
    param.ds_numel = math.prod(param.ds_shape)
    param.ds_persist = persist
    if not hasattr(param, "ds_id"):
        param.ds_id = next(_IDS)
