"""DeepSpeed's entry points: initialize, add_config_arguments, init_distributed."""
from __future__ import annotations

import argparse
import logging
import os

import torch.distributed as dist

from . import activation_checkpointing, agreement
from .config import ConfigError, load_config, read_config
from .distributed import TORCH_DISTRIBUTED_DEFAULT_PORT, init_distributed
from .engine_batch import ROUTE_EVAL, RepeatingLoader
from .parallel import sequence
from .parallel.mpu_grid import MpuError, MpuGrid
from .parallel.norm_span import norm_span
from .tp import setup as tp_setup

logger = logging.getLogger("zero")


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's add_config_arguments: adds --deepspeed, --deepspeed_config and the deprecated
    --deepscale / --deepscale_config, and nothing else. --local_rank stays the script's own
    (DeepSpeed scripts add it themselves; the launcher passes --local_rank=N unless
    --no_local_rank, and LOCAL_RANK is always in the environment)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on the engine)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated: --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated: --deepspeed_config")
    return parser


class ConfigSourceError(ValueError):
    """initialize() was given no config, or two."""


def _config_source(args, config):
    """The config to use, by DeepSpeed's rules: config= (or config_params=), else
    args.deepspeed_config (or the deprecated args.deepscale_config); two is an error."""
    deepscale = getattr(args, "deepscale_config", None)
    if deepscale is not None:
        logger.warning("zero: --deepscale_config is deprecated, please use --deepspeed_config")
        if getattr(args, "deepspeed_config", None) is not None:
            raise ConfigSourceError(
                "Not sure how to proceed, we were given both a deepscale_config and "
                f"deepspeed_config ({deepscale} and {args.deepspeed_config}): pass only "
                "--deepspeed_config")
        args.deepspeed_config, args.deepscale_config = deepscale, None
    from_args = getattr(args, "deepspeed_config", None)
    if from_args is not None:
        if config is not None:
            raise ConfigSourceError(
                "Not sure how to proceed, we were given deepspeed configs in the deepspeed "
                f"arguments (--deepspeed_config {from_args}) and deepspeed.initialize() function "
                "call (config=...): pass only one of them")
        return from_args
    if config is None:
        raise ConfigSourceError(
            "DeepSpeed requires --deepspeed_config to specify configuration file (or pass "
            "config=<dict or path> to initialize())")
    return config


def _align_local_rank(args) -> None:
    """DeepSpeed's args check: args.local_rank, when the script set it (>= 0), must agree with
    LOCAL_RANK; afterwards args.local_rank is LOCAL_RANK for scripts that read it."""
    local_rank = getattr(args, "local_rank", None)   # args may be None
    if local_rank is None:
        return
    if not isinstance(local_rank, int):
        raise ValueError(f"args.local_rank of {local_rank!r} is an unknown type "
                         f"{type(local_rank).__name__}; declare it with type=int")
    env = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= 0 and local_rank != env:
        raise ValueError(f"Mismatch in local rank setting, args.local_rank={local_rank} but "
                         f"env['LOCAL_RANK']={env}.")
    args.local_rank = env


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=TORCH_DISTRIBUTED_DEFAULT_PORT, mpu=None,
               dist_init_required=None, collate_fn=None, config=None, mesh_param=None,
               config_params=None):
    """Returns (engine, optimizer, training_dataloader, lr_scheduler), like deepspeed.initialize
    (its arguments in its order: `distributed_port` goes to init_distributed, `mesh_param`
    is its (data, sequence) mesh shape: parallel/sequence.py)."""
    from .engine import ZeroEngine  # needs zero._C

    if model is None:
        raise ValueError("zero.initialize: model is required")
    if config is None and config_params is not None:
        config = config_params
    source = _config_source(args, config)   # before any rendezvous: a wrong call fails at once
    if dist_init_required is not False and not dist.is_initialized():
        init_distributed(distributed_port=distributed_port)
    _align_local_rank(args)
    pipeline = _pipeline_module(model)
    sequence_mpu = sequence.is_sequence_mpu(mpu)  # DeepSpeed's parallel_state_sp
    mpu_grid = None if sequence_mpu else _mpu_grid(mpu, pipeline)
    # The batch trio counts data-parallel ranks: with pipeline stages, one stage's ranks;
    # with an mpu, its data group's; with tensor parallelism, world / tensor; with sequence
    # parallelism, world / sequence.
    raw = read_config(source)
    sequence_size = sequence.planned_size(raw, mpu, mesh_param)
    sequence.check_alone(sequence_size, pipeline=pipeline is not None, mpu=mpu_grid is not None,
                         tensor=tp_setup.requested_size(raw, model))
    all_ranks = None  # AutoTP from the config alone: tp_setup.batch_ranks
    if sequence_size > 1:
        data_ranks = sequence.replicas(dist.get_world_size(), sequence_size)
    elif pipeline is not None:
        data_ranks = model.mpu().get_data_parallel_world_size()
    elif mpu_grid is not None:
        data_ranks = mpu_grid.get_data_parallel_world_size()
    else:
        data_ranks, all_ranks = tp_setup.batch_ranks(dist.get_world_size(),
                                                     tp_setup.requested_size(raw, model))
    zero_config = _load_config_everywhere(source, world_size=data_ranks,
                                          unused_blocks=_unused_blocks(raw, optimizer),
                                          all_ranks=all_ranks)
    if "activation_checkpointing" in zero_config.raw and not activation_checkpointing.is_configured():
        activation_checkpointing.configure(deepspeed_config=zero_config)  # the block applies
    # Every rank, whatever part of the model it holds, runs one config: checked over the
    # world before the mesh's groups are made (pipeline and tensor parallelism then check
    # the model within each data-parallel group, where it is the same).
    agreement.agree_config(zero_config.raw)
    sequence_layout = _sequence_layout(sequence_size, mpu if sequence_mpu else None)
    grid = tp_setup.prepare(model, zero_config,
                            pipeline_grid=model.mpu() if pipeline is not None else None,
                            mpu_grid=mpu_grid)
    tensor_group = (grid.get_tensor_model_parallel_group()
                    if grid is not None and grid.get_tensor_model_parallel_world_size() > 1
                    else None)
    if pipeline is not None:
        engine = pipeline(model, zero_config, optimizer=optimizer,
                          model_parameters=model_parameters, lr_scheduler=lr_scheduler,
                          tensor_parallel_group=tensor_group)
    elif grid is not None:
        engine = ZeroEngine(model, zero_config, optimizer=optimizer,
                            model_parameters=model_parameters, lr_scheduler=lr_scheduler,
                            data_parallel_group=grid.get_data_parallel_group(),
                            tensor_parallel_group=tensor_group,
                            norm_span=norm_span(grid, model))
        engine.grid = engine.mpu = grid  # DeepSpeed's engine.mpu
    else:
        engine = ZeroEngine(model, zero_config, optimizer=optimizer,
                            model_parameters=model_parameters, lr_scheduler=lr_scheduler,
                            sequence_parallel=sequence_layout)
        if sequence_mpu:
            engine.mpu = mpu  # DeepSpeed's engine.mpu: the script's parallel_state_sp
    engine.collate_fn = collate_fn
    dataloader = None
    if training_data is not None:  # DeepSpeed's: each data-parallel rank reads its part
        if pipeline is None:
            dataloader = engine.deepspeed_io(training_data)
        else:  # DeepSpeed's pipeline engine reads it by itself, in order (a DistributedSampler
            # without shuffling, as the eval route's), over and over
            dataloader = RepeatingLoader(engine.deepspeed_io(training_data, route=ROUTE_EVAL))
            engine.set_dataiterator(dataloader)
    optimizer = None if engine.inference_only else engine.optimizer  # DeepSpeed: None
    return engine, optimizer, dataloader, engine.lr_scheduler


def _load_config_everywhere(source, **kwargs):
    """load_config, its ConfigError raised on every rank: a rank whose config alone is invalid
    (a per-rank edit of the JSON) would otherwise leave the others waiting in the config
    agreement's collective until its process died."""
    if not dist.is_initialized():
        return load_config(source, **kwargs)
    loaded = []
    agreement.on_every_rank(lambda: loaded.append(load_config(source, **kwargs)), ConfigError,
                            "this rank's config is valid but another's is not; nothing was built")
    return loaded[0]


def _unused_blocks(raw: dict, optimizer) -> tuple[str, ...]:
    """Without an optimizer (none passed, no "optimizer" block) DeepSpeed builds no scheduler
    and never reads the "scheduler" block: the HF Trainer's evaluate() before train() at
    stage 3 hands one over with total_num_steps 0. zero leaves it unvalidated too."""
    if optimizer is None and raw.get("optimizer") is None and raw.get("scheduler") is not None:
        logger.info("zero: no optimizer, so the config's \"scheduler\" block is not used")
        return ("scheduler",)
    return ()


def _pipeline_module(model):
    """The PipelineEngine class when `model` is a zero.pipe.PipelineModule (DeepSpeed returns
    its pipeline engine for one), else None."""
    from .pipe import PipelineModule

    if not isinstance(model, PipelineModule):
        return None
    from .pipe.engine import PipelineEngine

    return PipelineEngine


def _sequence_layout(size: int, mpu) -> sequence.SequenceParallel | None:
    """The sequence groups (None without sequence parallelism): the mpu's, or built here
    (collective); DeepSpeed's module-level accessors answer for them from now on."""
    if size <= 1:
        return None
    layout = sequence.from_mpu(mpu) if mpu is not None else sequence.build(size)
    sequence.ActiveGroups.set(layout)
    return layout


def _mpu_grid(mpu, pipeline) -> MpuGrid | None:
    """The script's model-parallel unit as zero's grid (parallel/mpu_grid.py); a
    PipelineModule brings its own."""
    if mpu is None:
        return None
    if pipeline is not None:
        raise MpuError("zero.initialize: a PipelineModule brings its own grid (its topology); "
                       "pass it without mpu=")
    grids = []  # read on every rank, refused on every rank if one rank's mpu is wrong
    agreement.on_every_rank(lambda: grids.append(MpuGrid(mpu)), MpuError,
                            "the engine was not built")
    return grids[0]
