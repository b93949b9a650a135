"""DeepSpeed's model-states memory estimates (`deepspeed.runtime.zero.stage3.
estimate_zero3_model_states_mem_needs*`, `deepspeed.runtime.zero.stage_1_and_2.
estimate_zero2_model_states_mem_needs*`, the snippet in Hugging Face's DeepSpeed guide),
answered by zero's estimator: DeepSpeed's table, one row per offload option, holding the bytes
zero's engine allocates for that option instead of DeepSpeed's rule-of-thumb multiples.

    per GPU   the device bytes per rank at the step's peak (estimate(...).device_bytes: the
              16-bit parameters, gradients, fp32 master and Adam state that stay on the
              device, its buckets and, at stage 3, the gathered parameters), 16-bit weights
              and Adam, as DeepSpeed's table assumes
    per CPU   the host bytes of a node's ranks (host_bytes x GPUs per node), times
              additional_buffer_factor as in DeepSpeed, and at least what each rank builds in
              fp32 on the host before the engine shards it (DeepSpeed's rule): without
              zero.Init (zero_init=0, and always at stage 2) the whole model, 4 bytes x all
              parameters x GPUs per node; with it one layer at a time, 4 bytes x the largest
              layer x GPUs per node

`..._all_live(model)` reads the model's own shapes and stage-3 gather units (exact);
`..._all_cold(total_params, ...)` stands tensors of `largest_layer_params` elements in for
them, each one a gather unit (shapes_from_count). `zero-mem estimate` gives every category.
"""
from __future__ import annotations

import torch

from zero.offload_states import OffloadDeviceEnum

from .estimator import estimate
from .options import option_for
from .shapes import ModelShapes, shapes_from_count, shapes_from_module
from .training_setup import Setup

HEADER = "  per CPU  |  per GPU |   Options"


def model_to_params(model: torch.nn.Module) -> tuple[int, int]:
    """All parameters (a shared one once) and the most any one module holds directly:
    DeepSpeed's counts (a parameter zero.Init partitioned by its whole size)."""
    def numel(p) -> int:
        return getattr(p, "ds_numel", None) or p.numel()

    total = sum({id(p): numel(p) for p in model.parameters()}.values())
    largest = max((sum(numel(p) for p in m.parameters(recurse=False))
                   for m in model.modules()), default=0)
    return total, largest


def needs(shapes: ModelShapes, total_params: int, largest_layer_params: int, stage: int,
          num_gpus_per_node: int, num_nodes: int, offload_optimizer: bool,
          offload_param: bool = False, zero_init: bool = False,
          additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(host bytes per node, device bytes per GPU) of one option of DeepSpeed's table."""
    setup = Setup(world_size=num_gpus_per_node * num_nodes, num_nodes=num_nodes,
                  precision="bf16", optimizer="adam")
    option = option_for(stage, "cpu" if offload_optimizer else "none",
                        "cpu" if offload_param else "none")
    result = estimate(shapes, setup, option)
    built = largest_layer_params if zero_init and stage == 3 else total_params
    host = max(result.host_bytes, 4 * built) * num_gpus_per_node
    return int(host * additional_buffer_factor), result.device_bytes


def _hardware(total_params: int, num_gpus_per_node: int, num_nodes: int, model: str) -> str:
    nodes = "nodes" if num_nodes > 1 else "node"
    gpus = "GPUs" if num_gpus_per_node > 1 else "GPU"
    return ("Estimated memory needed for params, optim states and gradients for a:\n"
            f"HW: Setup with {num_nodes} {nodes}, {num_gpus_per_node} {gpus} per node.\n"
            f"SW: Model with {int(total_params / 1e6)}M total params{model}.")


def _row(host: int, device: int, options: str) -> str:
    return f" {host / 2**30:7.2f}GB | {device / 2**30:6.2f}GB | {options}"


def _device(offloaded: bool) -> str:
    """As DeepSpeed formats it (its str enum, padded to 4: the name under Python 3.11)."""
    return f"{OffloadDeviceEnum.cpu:4}" if offloaded else "none"


def stage3_table(shapes: ModelShapes, total_params: int, largest_layer_params: int,
                 num_gpus_per_node: int = 1, num_nodes: int = 1,
                 additional_buffer_factor: float = 1.5) -> str:
    """DeepSpeed's ZeRO-3 table: parameters and optimizer offloaded, the optimizer alone,
    neither; each with and without zero.Init."""
    lines = [_hardware(total_params, num_gpus_per_node, num_nodes,
                       f", {int(largest_layer_params / 1e6)}M largest layer params"), HEADER]
    for offload_optimizer, offload_param in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            host, device = needs(shapes, total_params, largest_layer_params, 3,
                                 num_gpus_per_node, num_nodes, offload_optimizer, offload_param,
                                 zero_init, additional_buffer_factor)
            lines.append(_row(host, device, f"offload_param={_device(offload_param)}, "
                              f"offload_optimizer={_device(offload_optimizer)}, "
                              f"zero_init={int(zero_init)}"))
    return "\n".join(lines + [_NOTE])


def stage2_table(shapes: ModelShapes, total_params: int, num_gpus_per_node: int = 1,
                 num_nodes: int = 1, additional_buffer_factor: float = 1.5) -> str:
    """DeepSpeed's ZeRO-2 table: the optimizer offloaded, and not."""
    lines = [_hardware(total_params, num_gpus_per_node, num_nodes, ""), HEADER]
    for offload_optimizer in (True, False):
        host, device = needs(shapes, total_params, total_params, 2, num_gpus_per_node,
                             num_nodes, offload_optimizer,
                             additional_buffer_factor=additional_buffer_factor)
        lines.append(_row(host, device, f"offload_optimizer={_device(offload_optimizer)}"))
    return "\n".join(lines + [_NOTE])


_NOTE = ("(zero's estimate: the bytes its engine allocates per rank for each option, bf16 "
         "with Adam; `zero-mem estimate` lists every category)")


def live_shapes(model: torch.nn.Module) -> tuple[ModelShapes, int, int]:
    """The model's shapes and gather units, and DeepSpeed's two counts."""
    total, largest = model_to_params(model)
    return shapes_from_module(model), total, largest


def cold_shapes(total_params: int, largest_layer_params: int | None = None) -> ModelShapes:
    """Stand-in shapes for a parameter count: tensors of the largest layer's size, each one
    gather unit (without it, shapes_from_count's default tensor size)."""
    return shapes_from_count(int(total_params), tensor_numel=largest_layer_params or None)
