"""`deepspeed.runtime.config`: DeepSpeedConfig, a ds_config as DeepSpeed 0.19.8's scripts read
it: the batch trio resolved at the data-parallel world size, and the blocks under DeepSpeed's
attribute names (`zero_optimization_stage`, `zero_config.prefetch_bucket_size`,
`float16_config.loss_scale`, `monitor_config.tensorboard`, ...). The config is zero's own,
validated and resolved by zero.config.load_config; a bad config raises its ConfigError (a
ValueError naming every bad key), where DeepSpeed raises an assertion or pydantic's error.

What differs from DeepSpeed's: a path or a dict (no base64 string, no hjson); the blocks are
zero's frozen config objects (same field names, `device` a plain string), read-only; the world
size is torch.distributed's once it is initialized (DeepSpeed's needs its own
init_distributed first, else it says 1); the attributes are those set below (not DeepSpeed's
timers, compile, tensor-parallel, data-efficiency, autotuning or quantization configs). The
resolved values are checked against the real DeepSpeed's in tests/test_config_deepspeed.py."""
from __future__ import annotations

import logging

from zero import optimizer as zero_optimizer
from zero.autocast import DTYPES as AUTOCAST_DTYPES
from zero.config import ALL_FEATURES, load_config
from zero.config.schema import ZERO_OPTIMIZATION_ALIASES
from zero.engine import PRECISION_DTYPES

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "DEEPSPEED_OPTIMIZERS", "ADAGRAD_OPTIMIZER",
           "ADAM_OPTIMIZER", "ADAMW_OPTIMIZER", "LAMB_OPTIMIZER", "MUADAM_OPTIMIZER",
           "MUADAMW_OPTIMIZER", "MUSGD_OPTIMIZER", "LION_OPTIMIZER", "MUON_OPTIMIZER",
           "TORCH_ADAM_PARAM", "ADAM_W_MODE", "ADAM_W_MODE_DEFAULT"]

logger = logging.getLogger("zero")

# DeepSpeed's optimizer names, which scripts compare with engine.optimizer_name() (bing_bert:
# `== deepspeed.runtime.config.LAMB_OPTIMIZER`); DeepSpeedConfig lower-cases these.
ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = list(zero_optimizer.DEEPSPEED_OPTIMIZERS)
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True
# DeepSpeed's get_pipeline_config: the block's keys over these
_PIPELINE_DEFAULTS = {"stages": "auto", "partition": "best", "seed_layers": False,
                      "activation_checkpoint_interval": 0, "pipe_partitioned": True,
                      "grad_partitioned": True}


class DeepSpeedConfigError(Exception):
    """DeepSpeed's own config error, for scripts that raise or catch it."""


class _Block:
    """A config block under DeepSpeed's pydantic field names: `names` maps DeepSpeed's name to
    zero's (stage-3 keys drop their `stage3_` prefix there); every other attribute is zero's.
    Copies and pickles as a plain object."""

    def __init__(self, block, names=None, **overrides):
        self._block, self._names, self._overrides = block, dict(names or {}), overrides

    def __getattr__(self, name):
        if name.startswith("_"):  # not set yet (a copy being made): no lookup into _block
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._block, self._names.get(name, name))

    def __setattr__(self, name, value):
        if not name.startswith("_"):
            raise AttributeError(f"zero: DeepSpeedConfig blocks are read-only ({name})")
        super().__setattr__(name, value)

    def __repr__(self):
        return f"{type(self._block).__name__}({self._block!r})"


def _ranks(config, mpu, mesh_device) -> tuple[int, int]:
    """(global rank, data-parallel world size) as DeepSpeed finds them; (0, 1) before
    torch.distributed is initialized."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    rank = dist.get_rank()
    if mpu is not None:
        if hasattr(mpu, "get_data_parallel_world_size"):
            return rank, int(mpu.get_data_parallel_world_size())
        return rank, dist.get_world_size() // mpu.get_sequence_parallel_world_size()  # Ulysses
    if mesh_device is not None:
        return rank, dist.get_world_size(mesh_device.get_group(mesh_dim="data_parallel"))
    sequence = config.get("sequence_parallel_size", 1) if isinstance(config, dict) else 1
    return rank, dist.get_world_size() // sequence


class DeepSpeedConfig:
    """`DeepSpeedConfig(config, mpu=None, mesh_device=None)`: `config` a dict or a JSON path;
    the data-parallel world size comes from `mpu`, `mesh_device` or torch.distributed."""

    def __init__(self, config, mpu=None, mesh_device=None):
        self.global_rank, self.world_size = _ranks(config, mpu, mesh_device)
        # Parsed as DeepSpeed parses it: every key zero knows, built or not (initialize says
        # which values zero cannot train with).
        parsed = load_config(config, world_size=self.world_size, enabled_features=ALL_FEATURES)
        self._param_dict = dict(parsed.raw)
        self._set_batch(parsed)
        self._set_blocks(parsed)

    def _set_batch(self, parsed):
        self.train_batch_size = parsed.train_batch_size
        self.train_micro_batch_size_per_gpu = parsed.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = parsed.gradient_accumulation_steps
        self.steps_per_print = parsed.steps_per_print
        self.gradient_clipping = parsed.gradient_clipping
        self.prescale_gradients = parsed.prescale_gradients
        self.gradient_predivide_factor = parsed.gradient_predivide_factor
        self.communication_data_type = PRECISION_DTYPES.get(parsed.communication_data_type)
        self.seq_parallel_communication_data_type = PRECISION_DTYPES.get(
            parsed.seq_parallel_communication_data_type)
        self.wall_clock_breakdown = parsed.wall_clock_breakdown or parsed.flops_profiler.enabled
        self.memory_breakdown = bool(self._param_dict.get("memory_breakdown", False))
        self.zero_allow_untested_optimizer = parsed.zero_allow_untested_optimizer
        self.zero_force_ds_cpu_optimizer = parsed.zero_force_ds_cpu_optimizer
        self.dataloader_drop_last = bool(self._param_dict.get("dataloader_drop_last", False))
        self.use_data_before_expert_parallel_ = parsed.use_data_before_expert_parallelism

    def _set_blocks(self, parsed):
        raw_zero = self._param_dict.get("zero_optimization") or {}
        zero = parsed.zero_optimization
        offload = {name: getattr(zero, name) if raw_zero.get(name) is not None else None
                   for name in ("offload_optimizer", "offload_param")}  # None: not written
        self.zero_config = _Block(zero, ZERO_OPTIMIZATION_ALIASES, **offload)
        self.zero_optimization_stage = zero.stage
        self.zero_enabled = zero.stage > 0
        self.float16_config = parsed.fp16
        self.bfloat16_config = parsed.bf16
        written, self.optimizer_params = parsed.written_block("optimizer")
        self.optimizer_name = zero_optimizer.deepspeed_optimizer_name(written)
        self.scheduler_name, self.scheduler_params = parsed.written_block("scheduler")
        self.monitor_config = _Block(parsed, enabled=any(
            block.enabled for block in (parsed.tensorboard, parsed.wandb, parsed.csv_monitor,
                                        parsed.comet)))
        self.activation_checkpointing_config = parsed.activation_checkpointing
        self.flops_profiler_config = parsed.flops_profiler
        self.comms_config = _Block(parsed, comms_logger_enabled=parsed.comms_logger.enabled)
        self.aio_config = parsed.aio
        self.hybrid_engine = parsed.hybrid_engine
        self.pipeline = {**_PIPELINE_DEFAULTS, **(self._param_dict.get("pipeline") or {})}
        self.checkpoint_tag_validation_enabled = parsed.checkpoint.tag_validation != "Ignore"
        self.checkpoint_tag_validation_fail = parsed.checkpoint.tag_validation == "Fail"
        self.load_universal_checkpoint = parsed.checkpoint.load_universal
        self.use_node_local_storage = parsed.checkpoint.use_node_local_storage
        self.grad_accum_dtype = parsed.data_types.grad_accum_dtype
        autocast = self._param_dict.get("torch_autocast") or {}
        self.torch_autocast_enabled = parsed.torch_autocast.enabled
        self.torch_autocast_dtype = AUTOCAST_DTYPES.get(parsed.torch_autocast.dtype)
        self.torch_autocast_lower_precision_safe_modules = \
            autocast.get("lower_precision_safe_modules")  # None unless written, as DeepSpeed

    def print_user_config(self):
        import json

        logger.info("  json = %s", json.dumps(self._param_dict, sort_keys=True, indent=4,
                                              separators=(",", ":")))

    def print(self, name):
        logger.info("%s:", name)
        for arg in sorted(vars(self)):
            if not arg.startswith("_"):
                logger.info("  %s %s %s", arg, "." * (29 - len(arg)), getattr(self, arg))
        self.print_user_config()


def of_engine(engine) -> DeepSpeedConfig:
    """A DeepSpeedConfig of a live engine's config (DeepSpeed's `engine._config`): its
    batch sizes the engine's own, which under AutoTP from the config alone count every rank
    (validated as DeepSpeed's check counts them), over its data-parallel ranks."""
    batch_keys = ("train_batch_size", "train_micro_batch_size_per_gpu",
                  "gradient_accumulation_steps")
    resolved = {key: value for key, value in engine.config.raw.items() if key not in batch_keys}
    resolved.update(train_micro_batch_size_per_gpu=engine.train_micro_batch_size_per_gpu(),
                    gradient_accumulation_steps=engine.gradient_accumulation_steps())
    view = DeepSpeedConfig(resolved, mpu=_DataParallelWorld(engine.dp_world_size))
    view.train_batch_size = engine.train_batch_size()
    return view


class _DataParallelWorld:
    """The one question DeepSpeedConfig asks an mpu: how many data-parallel ranks there are."""

    def __init__(self, size: int):
        self._size = size

    def get_data_parallel_world_size(self) -> int:
        return self._size
