"""DeepSpeed's `engine.offload_states()` / `reload_states()` (0.19.8), RLHF's "sleep": between
training steps the engine's states leave the GPU for host memory, so that another engine
(vLLM generating rollouts, a reward model) can use it, and come back before training goes on.

The move itself is C++ (csrc/adapter/parked_states.h): each chosen state's device buffers
are copied to host memory of exactly their size (pinned for a GPU's buffers when asked) and
their device memory is given back; the memory report then counts them at their host
location. What differs from DeepSpeed, on purpose:
- whatever needs a moved state brings it back first (a forward or a gather the parameters,
  a backward the parameters and gradients, the step and a checkpoint everything), where
  DeepSpeed would fail or read stale copies; reload_states() brings all back at once;
  zero_grad() zeroes moved gradients where they are;
- at stages 0-2 the model's parameters (and stage 0-1's .grad, unless gradients accumulate in
  fp32) view the host copies
  meanwhile, so the module stays readable; a view taken then keeps its copy's memory and
  values after the reload (it no longer follows the engine);
- an engine without an optimizer, or with parameters offloaded, may offload what it holds
  on the device (DeepSpeed refuses both);
- the copies finish before the call returns, whatever `non_blocking` says.
"""
from __future__ import annotations

import enum
import logging

import torch

from . import _C

logger = logging.getLogger("zero")


class OffloadDeviceEnum(str, enum.Enum):
    """DeepSpeed's deepspeed.runtime.zero.offload_config.OffloadDeviceEnum."""
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, enum.Enum):
    """DeepSpeed's deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum."""
    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


def _kinds(include) -> list:
    """The C++ kinds of `include` (None: all). contiguous_grad_buffer has none: zero's reduce
    buckets hold memory only while a reduction runs."""
    names = list(OffloadStateTypeEnum) if include is None else include
    kinds = []
    for name in names:
        try:
            state = OffloadStateTypeEnum(name)
        except ValueError:
            raise ValueError(f"zero: offload_states(include=...) got {name!r}; the states are "
                             f"{[s.value for s in OffloadStateTypeEnum]}") from None
        if state is not OffloadStateTypeEnum.contiguous_grad_buffer:
            kinds.append(getattr(_C.StateKind, state.value))
    return kinds


def offload(core, device_type: str, include=None, device=OffloadDeviceEnum.cpu,
            pin_memory: bool = True) -> None:
    """engine.offload_states: `include`'s states (None: all) to host memory."""
    try:
        device = OffloadDeviceEnum(device)
    except ValueError:
        raise ValueError(f"zero: offload_states(device={device!r}); the devices are 'cpu' "
                         "(and 'none': nothing moves)") from None
    if device is OffloadDeviceEnum.none:
        logger.warning("zero: offload_states(device='none'): no device to offload the states "
                       "to; nothing moved")
        return
    if device is OffloadDeviceEnum.nvme:
        raise ValueError("zero: offload_states to NVMe is not supported (nor in DeepSpeed); "
                         "use device='cpu'")
    try:
        core.offload_states(_kinds(include), pin_memory)
    except MemoryError as error:  # the engine put back what the call had moved
        raise MemoryError(f"zero: offload_states ran out of host memory ({error}); nothing was "
                          "moved: the states this call was to offload are still on the device. "
                          "Offload fewer states (include=...) or free host memory") from error
    if device_type == "cuda":
        torch.cuda.empty_cache()  # back to the driver, for the other engine on the GPU


def offloaded(core) -> list[OffloadStateTypeEnum]:
    """The states offload_states moved that are not back yet."""
    return [OffloadStateTypeEnum(kind.name) for kind in core.offloaded_states]
