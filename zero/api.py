"""DeepSpeed's entry points: initialize, add_config_arguments, init_distributed."""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from .config import load_config
from .distributed import init_distributed


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds DeepSpeed's --deepspeed / --deepspeed_config flags (and --zero_config)."""
    group = parser.add_argument_group("zero", "zero / DeepSpeed configuration")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable the engine (accepted for DeepSpeed compatibility).")
    group.add_argument("--deepspeed_config", "--zero_config", dest="deepspeed_config",
                       default=None, type=str, help="Path to the DeepSpeed-style JSON config.")
    group.add_argument("--local_rank", type=int, default=-1,
                       help="Set by the launcher; prefer the LOCAL_RANK environment variable.")
    return parser


def _config_source(args, config):
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if config is not None and from_args is not None:
        raise ValueError("zero: a config was passed to initialize() and args.deepspeed_config is "
                         f"set ({from_args}); pass only one")
    if config is None and from_args is None:
        raise ValueError("zero: no config: pass config=<dict or path> to initialize() or "
                         "--deepspeed_config <path> on the command line")
    return config if config is not None else from_args


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, config_params=None):
    """Returns (engine, optimizer, training_dataloader, lr_scheduler), like deepspeed.initialize."""
    from .engine import ZeroEngine  # needs zero._C

    if model is None:
        raise ValueError("zero.initialize: model is required")
    if mpu is not None:
        raise ValueError("zero.initialize: mpu (model parallelism) is not supported yet")
    if config is None and config_params is not None:
        config = config_params
    if dist_init_required is not False and not dist.is_initialized():
        init_distributed()
    zero_config = load_config(_config_source(args, config), world_size=dist.get_world_size())
    engine = ZeroEngine(model, zero_config, optimizer=optimizer,
                        model_parameters=model_parameters, lr_scheduler=lr_scheduler)
    dataloader = None
    if training_data is not None:
        dataloader = _dataloader(training_data, zero_config, collate_fn)
    return engine, engine.optimizer, dataloader, engine.lr_scheduler


def _dataloader(dataset, config, collate_fn):
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    return torch.utils.data.DataLoader(dataset, batch_size=config.train_micro_batch_size_per_gpu,
                                       sampler=sampler, collate_fn=collate_fn)
