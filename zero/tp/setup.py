"""What `initialize()` does for tensor parallelism: the tensor size from the config's
`tensor_parallel.autotp_size` (or from `deepspeed.tp_model_init`), the mesh's grid, the
AutoTP conversion, and the checks on what does not compose yet."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import agreement
from ..parallel import DeviceMesh
from ..parallel.grid import PipelineParallelGrid, grid_for
from ..parallel.mpu_grid import MpuGrid
from .auto_tp import auto_tp
from .split import TensorParallelSplitError, is_split

_RECORD = "_zero_tp_model_init"  # the attribute tp_model_init leaves on the model


@dataclass(frozen=True)
class TPModelInit:
    """What deepspeed.tp_model_init(model, tp_size, dtype) recorded."""
    tp_size: int
    dtype: torch.dtype | None


def tp_model_init(model: nn.Module, tp_size: int, dtype: torch.dtype | None = None,
                  config=None, **kwargs) -> nn.Module:
    """DeepSpeed's tp_model_init (0.19: record only): notes the tensor size and dtype on the
    model; `initialize()` converts it, with `tensor_parallel.autotp_size` filled in from
    here when the config has none (a different value in both is an error). Returns model."""
    if kwargs.get("tp_group") is not None or kwargs.get("mpu") is not None:
        raise NotImplementedError("zero: tp_model_init(tp_group=/mpu=) is not built: pass "
                                  "tp_size only, and the mpu to initialize(mpu=...), whose "
                                  "tensor group AutoTP then splits over")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"zero: tp_model_init tp_size = {tp_size!r} must be a positive integer")
    setattr(model, _RECORD, TPModelInit(tp_size, dtype))
    return model


def requested_size(raw: dict, model: nn.Module) -> int:
    """The tensor size before the config is validated (the batch trio counts data ranks):
    autotp_size when it is a positive int, else what tp_model_init recorded, else 1."""
    block = raw.get("tensor_parallel")
    size = block.get("autotp_size") if isinstance(block, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    recorded = getattr(model, _RECORD, None)
    return recorded.tp_size if recorded is not None else 1


def data_ranks(world_size: int, tensor: int) -> int:
    """world / tensor; ValueError naming both when it does not divide."""
    if world_size % tensor:
        raise ValueError(f"zero: tensor_parallel.autotp_size = {tensor} does not divide the "
                         f"world size {world_size}; choose a tensor size that divides "
                         f"{world_size} (the data-parallel size is world / autotp_size)")
    return DeviceMesh.build(world_size, tensor=tensor).data


def batch_ranks(world_size: int, tensor: int) -> tuple[int, int | None]:
    """load_config's world_size and all_ranks for a config whose tensor size is `tensor` (AutoTP
    from the config alone): the data ranks, and with tensor parallelism every rank, which
    DeepSpeed's batch check (and the HF Trainer's "auto") counts."""
    return data_ranks(world_size, tensor), (world_size if tensor > 1 else None)


def prepare(model: nn.Module, config, pipeline_grid: PipelineParallelGrid | None = None,
            mpu_grid: MpuGrid | None = None) -> PipelineParallelGrid | MpuGrid | None:
    """None without tensor parallelism or an mpu. Otherwise checks the config composes,
    builds the grid (collective) or takes a PipelineModule's (`pipeline_grid`, whose tensor
    size its topology set) or the script's mpu's (`mpu_grid`), converts `model` in place with
    auto_tp over the tensor group when `tensor_parallel.autotp_size` asks (a model an mpu
    comes with may be split already, as Megatron's is), and returns the grid; the engine
    then runs over grid.get_data_parallel_group()."""
    size = _size(config, model, pipeline_grid or mpu_grid)
    if mpu_grid is not None and _asked_size(config, model) <= 1:
        if size > 1:  # the script's layers split themselves
            _check(config, size, where=f"an mpu of tensor size {size}")
            _read_script_marks(model, size)
            check_same_inputs_once(model, mpu_grid)
        return mpu_grid
    if size <= 1:
        return None
    _check(config, size)
    grid = pipeline_grid or mpu_grid or grid_for(tensor=size)
    if pipeline_grid is None:
        converted = auto_tp(model, grid.get_tensor_model_parallel_group())
        split = bool(converted) or any(is_split(p) for p in model.parameters())
    else:  # each stage converts its own layers: one may have nothing to split, or fail alone
        split = _convert_stages(model, grid)
    if not split:
        raise ValueError(
            f"zero: tensor_parallel.autotp_size = {size} but the model has no layer to split: "
            "auto_tp found no attention or MLP block with input and output linears it knows "
            "(q_proj/k_proj/v_proj/o_proj, up_proj/gate_proj/down_proj, fc1/fc2, c_fc/c_proj, "
            "...) and no zero.tp layer was built by hand; set autotp_size to 0")
    check_same_inputs_once(model, grid)
    return grid


def _read_script_marks(model: nn.Module, size: int) -> None:
    """A model an mpu of tensor size > 1 comes with, without AutoTP, was split by the script:
    its slices carry Megatron's marks. The older `model_parallel` mark counts as
    `tensor_model_parallel`, as DeepSpeed reads both. Refused, naming the parameter or the
    fix: no marked slice at all (every rank would start from tensor rank 0's values), a slice
    without `partition_dim` (checkpoints join slices along it), a `partition_stride` other
    than 1 (interleaved slices are not joined)."""
    named = list(model.named_parameters())
    for _, param in named:
        if getattr(param, "model_parallel", False) and not is_split(param):
            param.tensor_model_parallel = True
    split = [(name, param) for name, param in named if is_split(param)]
    if not split:
        raise ValueError(
            f"zero: the mpu has tensor size {size} but no parameter of the model is marked as "
            "a slice; mark each split parameter as Megatron does (param.tensor_model_parallel "
            "= True, param.partition_dim = the dimension it is split along), or set "
            f"tensor_parallel.autotp_size = {size} to let AutoTP split the model")
    for name, param in split:
        if not isinstance(getattr(param, "partition_dim", None), int):
            raise ValueError(f"zero: {name} is marked tensor_model_parallel but has no "
                             "partition_dim; set it to the dimension the parameter is split "
                             "along (checkpoints join the slices along it)")
        if getattr(param, "partition_stride", 1) != 1:
            raise NotImplementedError(
                f"zero: {name} has partition_stride = {param.partition_stride}; interleaved "
                "slices are not built: split it into contiguous slices (partition_stride 1)")


def _convert_stages(module: nn.Module, grid: PipelineParallelGrid) -> bool:
    """auto_tp on this stage's layers, agreed over the world: whether any stage split a
    layer; a stage's TensorParallelSplitError is raised on every rank."""
    def convert() -> bool:
        converted = auto_tp(module, grid.get_tensor_model_parallel_group())
        return bool(converted) or any(is_split(p) for p in module.parameters())

    return any(agreement.on_every_rank(convert, TensorParallelSplitError,
                                       "AutoTP could not split another pipeline stage's layers"))


def check_same_inputs_once(model: nn.Module, grid: PipelineParallelGrid) -> None:
    """On the first forward, the ranks of a tensor group compare their inputs (one hash
    each, collective over the group) and all raise if they differ, as DeepSpeed checks its
    AutoTP inputs: a world-sized sampler would otherwise train each slice on other data,
    silently wrong."""
    group = grid.get_tensor_model_parallel_group()

    def hook(module, args, kwargs):
        handle.remove()
        digest = hashlib.sha256()
        for value in list(args) + [kwargs[k] for k in sorted(kwargs)]:
            if isinstance(value, torch.Tensor):
                data = value.detach().cpu().contiguous().reshape(-1)
                digest.update(str((value.dtype, tuple(value.shape))).encode())
                digest.update(data.view(torch.uint8).numpy().tobytes())
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, digest.hexdigest(), group=group)
        if len(set(everyone)) > 1:
            ranks = dist.get_process_group_ranks(group)
            raise ValueError(
                f"zero: the tensor-parallel ranks {ranks} got different inputs on the first "
                "forward; every rank of a tensor group must see the same batch: split the data "
                "over the data-parallel ranks (engine.grid.get_data_parallel_rank() / "
                "get_data_parallel_world_size(), or pass training_data to initialize)")

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)


def _size(config, model: nn.Module, given_grid) -> int:
    """The tensor size: a PipelineModule's topology's, else the mpu's or what the config or
    tp_model_init asks (the two must agree when both say it)."""
    if given_grid is not None and not isinstance(given_grid, MpuGrid):
        tensor = given_grid.get_tensor_model_parallel_world_size()
        configured = config.tensor_parallel.autotp_size
        if configured not in (0, 1, tensor) or getattr(model, _RECORD, None) is not None:
            raise ValueError(
                f"zero: tensor_parallel.autotp_size = {configured} but the PipelineModule's "
                f"topology has tensor (model) size {tensor}; with pipeline stages the topology "
                "sets it: PipelineModule(topology=PipeModelDataParallelTopology(num_pp, num_mp, "
                "num_dp)), and leave autotp_size out or equal (tp_model_init does not apply)")
        return tensor
    asked = _asked_size(config, model)
    if given_grid is None:
        return asked
    tensor = given_grid.get_tensor_model_parallel_world_size()
    if asked not in (0, 1, tensor):
        raise ValueError(
            f"zero: tensor_parallel.autotp_size (or tp_model_init's tp_size) = {asked} but the "
            f"mpu passed to initialize has tensor size {tensor}; make them equal, or leave "
            "autotp_size out when the model's layers are split already")
    return tensor


def _asked_size(config, model: nn.Module) -> int:
    configured = config.tensor_parallel.autotp_size
    recorded = getattr(model, _RECORD, None)
    if recorded is None:
        return configured
    if configured not in (0, recorded.tp_size):
        raise ValueError(f"zero: tensor_parallel.autotp_size = {configured} in the config but "
                         f"tp_model_init(tp_size={recorded.tp_size}); make them equal")
    from ..engine import PRECISION_DTYPES  # needs zero._C: only when tp_model_init was used

    engine_dtype = PRECISION_DTYPES[config.precision]
    if recorded.dtype is not None and recorded.dtype != engine_dtype:
        raise ValueError(f"zero: tp_model_init(dtype={recorded.dtype}) but the config trains "
                         f"in {engine_dtype} (bf16/fp16 blocks); make them agree")
    return recorded.tp_size


def _check(config, size: int, where: str | None = None) -> None:
    where = where or f"tensor_parallel.autotp_size = {size}"
    if config.zero_optimization.stage == 3:
        raise NotImplementedError(
            f"zero: ZeRO stage 3 with tensor parallelism ({where}) is not built: set "
            "zero_optimization.stage to 0, 1 or 2 (ZeRO then shards over the data-parallel "
            "ranks of each tensor slice)")
    data_ranks(dist.get_world_size(), size)  # raises, naming the sizes
