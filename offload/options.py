"""Offload settings for the C++ engine (typed, see zero/boundary.py), from a validated
ZeroConfig."""
from __future__ import annotations

import torch

import zero._C as _C
from zero.boundary import typed

OFFLOAD_TILE = 1 << 22  # elements per streamed chunk of the offloaded step, at most


def offload_options(config, on_swap_write=None):
    """offload_optimizer as _C.OffloadOptions: device "cpu" keeps the fp32 master and
    optimizer state in host memory, "nvme" in a swap file under nvme_path (removed when the
    engine goes); the step streams chunks of min(sub_group_size, OFFLOAD_TILE) elements,
    with the engine's host threads (torch's intra-op thread count when the engine starts;
    the launcher's core binding sets it) running the CPU Adam. grads_on_device keeps a
    stage 2-3 gradient shard on the device, copied to the host by the step.
    on_swap_write(bytes) is told each chunk written to the swap file outside the step."""
    zero_cfg = config.zero_optimization
    offload = zero_cfg.offload_optimizer
    nvme = offload.device == "nvme"
    return typed(_C.OffloadOptions, enabled=offload.device in ("cpu", "nvme"),
                 pin_memory=bool(offload.pin_memory),
                 tile_numel=min(int(zero_cfg.sub_group_size), OFFLOAD_TILE),
                 delayed_update=bool(offload.delayed_update), ratio=float(offload.ratio),
                 grads_on_device=bool(offload.grads_on_device),
                 nvme_path=offload.nvme_path if nvme else "", aio=aio_config(config),
                 on_swap_write=on_swap_write)


def aio_config(config):
    aio = config.aio
    return typed(_C.AioConfig, block_size=int(aio.block_size), queue_depth=int(aio.queue_depth),
                 intra_op_parallelism=int(aio.intra_op_parallelism))


def param_offload_options(config, on_swap_write=None):
    """offload_param at stage 3 as _C.ParamOffloadOptions: device "cpu" keeps each rank's
    parameter shard in host memory; "nvme" keeps it in a swap file under nvme_path, except the
    first gather units up to max_in_cpu elements, which stay in host memory. buffer_count host
    buffers (each one unit's shard, not buffer_size elements) carry NVMe units in and out;
    buffer_size bounds the shard elements of one unit. on_swap_write(bytes) is told each unit
    written to the swap file at start-up."""
    param = config.zero_optimization.offload_param
    nvme = param.device == "nvme"
    if nvme and not param.nvme_path:
        raise ValueError('zero: offload_param device "nvme" needs nvme_path')
    return typed(_C.ParamOffloadOptions, enabled=param.device != "none",
                 pin_memory=bool(param.pin_memory), nvme_path=param.nvme_path if nvme else "",
                 max_in_cpu=int(param.max_in_cpu), buffer_count=int(param.buffer_count),
                 buffer_numel=int(param.buffer_size), aio=aio_config(config),
                 on_swap_write=on_swap_write if nvme else None)


def _asked(block: str, config) -> bool:
    """Whether pinning is worth a warning: the config says pin_memory, or it is the default
    on a machine with a GPU (where pageable memory slows every copy). On a CPU-only machine
    the default has nothing to pin for: silence."""
    raw = (config.raw.get("zero_optimization") or {}).get(block) or {}
    return "pin_memory" in raw or torch.cuda.is_available()


def pinning_warning(config, group_infos: list) -> str | None:
    """The warning to give when pin_memory was asked for and could not be honoured (a CPU
    build of torch, the locked-memory limit), naming why; None when there is nothing to say.
    group_infos: every group's _C.OffloadInfo."""
    zero_cfg = config.zero_optimization
    reasons = set()
    if zero_cfg.offload_optimizer.pin_memory and _asked("offload_optimizer", config):
        reasons |= {info.why_not_pinned for info in group_infos}
    if zero_cfg.offload_param.pin_memory and _asked("offload_param", config):
        reasons |= {info.why_params_not_pinned for info in group_infos}
    reasons -= {""}
    if not reasons:
        return None
    return (f"zero: pin_memory is true but the offloaded state could not be pinned "
            f"({'; '.join(sorted(reasons))}); it uses page-aligned pageable memory, and "
            "host<->device copies are slower")
