"""Frozen dataclasses of a validated config (what ``load_config`` returns).

Every value here is resolved: defaults filled in, sizes as ints, computed
DeepSpeed defaults applied (overlap_comm, Adam's weight_decay, the batch trio).
Field names are the DeepSpeed key names; a
test checks that each dataclass matches the supported keys of its schema block.
"""

from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, FrozenSet, Mapping, Optional, Tuple


@dataclass(frozen=True)
class OffloadOptimizerConfig:
    device: str  # "none" | "cpu" | "nvme"
    nvme_path: Optional[str]
    pin_memory: bool
    buffer_count: int
    pipeline_read: bool
    pipeline_write: bool
    fast_init: bool
    ratio: float
    delayed_update: bool
    grads_on_device: bool

    @property
    def enabled(self):
        return self.device != "none"


@dataclass(frozen=True)
class OffloadParamConfig:
    device: str  # "none" | "cpu" | "nvme"
    nvme_path: Optional[str]
    pin_memory: bool
    buffer_count: int
    buffer_size: int
    max_in_cpu: int

    @property
    def enabled(self):
        return self.device != "none"


@dataclass(frozen=True)
class LeafModuleConfig:
    classes: Tuple[str, ...]
    names: Tuple[str, ...]
    name_suffixes: Tuple[str, ...]


@dataclass(frozen=True)
class ZeroOptimizationConfig:
    stage: int
    contiguous_gradients: bool
    reduce_scatter: bool
    reduce_bucket_size: int
    allgather_bucket_size: int
    overlap_comm: bool  # resolved: DeepSpeed's default is (stage == 3)
    round_robin_gradients: bool
    offload_optimizer: OffloadOptimizerConfig
    offload_param: OffloadParamConfig
    leaf_module: LeafModuleConfig
    stage3_prefetch_bucket_size: int
    stage3_param_persistence_threshold: int
    stage3_model_persistence_threshold: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    stage3_max_inflight_gathers: int
    stage3_gather_16bit_weights_on_model_save: bool
    stage3_module_granularity_threshold: int
    stage3_use_all_reduce_for_fetch_params: bool
    sub_group_size: int
    zero_hpz_partition_size: int
    zero_quantized_weights: bool
    zero_quantized_nontrainable_weights: bool
    zero_quantized_gradients: bool
    mics_shard_size: int  # resolved: from dp_shard_size / dp_replicate_size when those are given
    dp_shard_size: int
    dp_replicate_size: int
    memory_efficient_linear: bool  # read by nobody: zero runs torch's linear either way


@dataclass(frozen=True)
class FP16Config:
    enabled: bool
    loss_scale: float  # 0.0 = dynamic loss scaling
    initial_scale_power: int
    loss_scale_window: int
    hysteresis: int
    consecutive_hysteresis: bool
    min_loss_scale: float
    auto_cast: bool  # forward's floating-point positional inputs cast to fp16
    fp16_master_weights_and_grads: bool  # the fp16 parameters are the master

    @property
    def dynamic_loss_scale(self):
        return self.loss_scale == 0

    @property
    def initial_dynamic_scale(self):
        return 2.0 ** self.initial_scale_power


@dataclass(frozen=True)
class BF16Config:
    enabled: bool
    immediate_grad_update: bool  # accepted either way: zero adds each gradient at its hook
    bf16_master_weights_and_grads: bool  # the bf16 parameters are the master
    bf16_optimizer_states: bool  # the optimizer's arrays in bf16 too


@dataclass(frozen=True)
class AioConfig:
    block_size: int
    queue_depth: int
    intra_op_parallelism: int
    single_submit: bool
    overlap_events: bool


@dataclass(frozen=True)
class OptimizerConfig:
    """``type`` is "Adam", "AdamW", "SGD", "Adagrad", "Lion", "Lamb" or a torch.optim type run on
    the shards; ``params`` holds every key of its schema, defaults filled.

    ``decoupled_weight_decay`` is what the weight decay actually does, resolved
    the DeepSpeed way: True for "AdamW", and for "Adam" unless
    ``params["adam_w_mode"]`` is false (DeepSpeed's "Adam" defaults to AdamW
    behaviour); False for "SGD" and "Adagrad" (L2 added to the gradient); True for "Lion" and
    "Lamb" (its decay joins the update the trust ratio scales).
    """

    type: str
    params: Mapping[str, Any]
    decoupled_weight_decay: bool


@dataclass(frozen=True)
class SchedulerConfig:
    """``type`` is "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle" or "LRRangeTest";
    ``params`` are the constructor arguments of that DeepSpeed schedule with defaults filled.

    WarmupLR's ``warmup_max_lr`` None means each parameter group's own lr (DeepSpeed's
    behaviour).
    """

    type: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class MemoryReportConfig:
    path: Optional[str]  # JSON-lines file; None: no file
    every_n_steps: Optional[int]  # resolved (defaults to steps_per_print); None: no periodic report


@dataclass(frozen=True)
class CheckpointConfig:
    tag_validation: str  # "Ignore" | "Warn" | "Fail"
    load_universal: bool  # accepted: zero's checkpoints load at any world size anyway
    use_node_local_storage: bool  # each node's local rank 0 writes the shared files


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    partition_activations: bool
    cpu_checkpointing: bool
    contiguous_memory_optimization: bool
    number_checkpoints: Optional[int]
    synchronize_checkpoint_boundary: bool
    profile: bool


@dataclass(frozen=True)
class PipelineConfig:
    schedule: str  # "1f1b" | "gpipe"
    activation_checkpoint_interval: int  # > 0: set on the module by the engine
    use_reentrant: bool | None  # DeepSpeed's; zero recomputes non-reentrant either way
    stages: int | None  # stages, partition, seed_layers: DeepSpeed's engine reads none either
    partition: str
    seed_layers: bool
    pipe_partitioned: bool  # DeepSpeed's, with tensor parallelism only; no effect here
    grad_partitioned: bool


@dataclass(frozen=True)
class TensorParallelConfig:
    autotp_size: int  # 0 or 1: off


@dataclass(frozen=True)
class ExpertParallelConfig:  # AutoEP (zero/moe/auto_ep.py)
    enabled: bool
    autoep_size: int
    preset_model: Optional[str]  # "mixtral" | "qwen3_moe" | None (from config.model_type)
    moe_layer_pattern: Optional[str]
    use_grouped_mm: bool  # accepted, no effect
    disable_triton_grouped_mm: bool  # accepted, no effect


@dataclass(frozen=True)
class MonitorDirConfig:  # tensorboard, csv_monitor
    enabled: bool
    output_path: str
    job_name: str


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool
    group: Optional[str]
    team: Optional[str]
    project: str


@dataclass(frozen=True)
class CometConfig:
    enabled: bool
    samples_log_interval: int
    project: Optional[str]
    workspace: Optional[str]
    api_key: Optional[str]
    experiment_name: Optional[str]
    experiment_key: Optional[str]
    online: Optional[bool]
    mode: Optional[str]


@dataclass(frozen=True)
class DataTypesConfig:
    grad_accum_dtype: Optional[str]  # DeepSpeed's spelling as written; None: the training dtype
    buffer_dtype: Optional[str]  # DeepSpeed's spelling; None: buffers keep theirs (model_dtype.py)


@dataclass(frozen=True)
class ThroughputTimerConfig:
    enabled: bool
    synchronized: bool


@dataclass(frozen=True)
class TimersConfig:
    throughput: ThroughputTimerConfig


@dataclass(frozen=True)
class CommsLoggerConfig:
    enabled: bool
    verbose: bool
    prof_all: bool
    prof_ops: Tuple[str, ...]
    debug: bool


@dataclass(frozen=True)
class HybridEngineConfig:
    enabled: bool
    max_out_tokens: int  # DeepSpeed's kernels' workspace: no effect in zero
    release_inference_cache: bool  # no effect in zero
    pin_parameters: bool
    tp_gather_partition_size: int  # tensor-parallel generation only: no effect in zero


@dataclass(frozen=True)
class TorchAutocastConfig:
    enabled: bool
    dtype: Optional[str]  # one of schema.AUTOCAST_DTYPES; None: the device's autocast default
    lower_precision_safe_modules: Tuple[str, ...]  # checked to import; reduction is unchanged


@dataclass(frozen=True)
class FlopsProfilerConfig:
    enabled: bool
    recompute_fwd_factor: float
    profile_step: int
    module_depth: int
    top_modules: int
    detailed: bool
    output_file: Optional[str]


@dataclass(frozen=True)
class ZeroConfig:
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    data_parallel_size: Optional[int]  # checked against the data-parallel ranks; None: unsaid
    optimizer: Optional[OptimizerConfig]  # None: the client passes its own optimizer
    scheduler: Optional[SchedulerConfig]
    fp16: FP16Config
    bf16: BF16Config
    gradient_clipping: float  # 0.0 = off
    zero_optimization: ZeroOptimizationConfig
    aio: AioConfig
    steps_per_print: Optional[int]  # None: never (DeepSpeed's current default)
    memory_breakdown: bool  # rank 0 prints see_memory_usage around each phase
    wall_clock_breakdown: bool
    dataloader_drop_last: bool  # the training_data loader drops a short last micro-batch
    prescale_gradients: bool
    gradient_predivide_factor: float
    communication_data_type: Optional[str]  # "fp16" | "bf16" | "fp32" | None (= training dtype)
    use_data_before_expert_parallelism: bool  # MoE's rank layout (zero/moe/groups.py)
    sequence_parallel_size: int  # 1: none; the groups come from parallel/sequence.py
    seq_parallel_communication_data_type: str  # the reduction dtype under sequence parallelism
    zero_allow_untested_optimizer: bool  # a client optimizer zero does not build, under ZeRO
    zero_force_ds_cpu_optimizer: bool  # accepted for compatibility, no effect
    memory_report: MemoryReportConfig
    nonfinite_gradients: str  # "skip" | "raise"
    checkpoint: CheckpointConfig
    activation_checkpointing: ActivationCheckpointingConfig
    pipeline: PipelineConfig
    tensor_parallel: TensorParallelConfig
    expert_parallel: ExpertParallelConfig
    tensorboard: MonitorDirConfig
    csv_monitor: MonitorDirConfig
    wandb: WandbConfig
    comet: CometConfig
    comms_logger: CommsLoggerConfig
    flops_profiler: FlopsProfilerConfig
    timers: TimersConfig
    data_types: DataTypesConfig
    hybrid_engine: HybridEngineConfig
    torch_autocast: TorchAutocastConfig
    world_size: int
    enabled_features: FrozenSet[str]
    raw: Mapping[str, Any]  # the config as given (a private deep copy)

    @property
    def precision(self):
        """"fp16", "bf16" or "fp32": the training dtype of the model weights."""
        if self.fp16.enabled:
            return "fp16"
        return "bf16" if self.bf16.enabled else "fp32"

    # DeepSpeed's engine.config is the config dict; the HF Trainer reads it with .get()
    # (`engine.config.get("zero_optimization", {}).get("stage")`). Both read the config as given.
    def get(self, key, default=None):
        return self.raw.get(key, default)

    def __getitem__(self, key):
        return self.raw[key]

    def written_block(self, name: str) -> tuple:
        """(type, params) of the "optimizer" or "scheduler" block as the config writes them,
        no defaults filled in, as DeepSpeed's engine and DeepSpeedConfig read them; (None,
        None) without a block naming a type."""
        block = self.raw.get(name)
        if not isinstance(block, dict) or "type" not in block:
            return None, None
        return block["type"], block.get("params")


# --------------------------------------------------------------------------- building


def _make(cls, values):
    """cls(**values) for exactly the dataclass's fields (a missing one is a schema/model mismatch)."""
    return cls(**{f.name: values[f.name] for f in fields(cls)})


def _frozen(params):
    return MappingProxyType(dict(params))


def build(values, raw, world_size, features):
    """Turn the validator's resolved dict into a ZeroConfig."""
    zero = dict(values["zero_optimization"])
    zero["offload_optimizer"] = _make(OffloadOptimizerConfig, zero["offload_optimizer"])
    zero["offload_param"] = _make(OffloadParamConfig, zero["offload_param"])
    zero["leaf_module"] = _make(LeafModuleConfig, zero["leaf_module"])
    optimizer = values["optimizer"]
    if optimizer is not None:
        optimizer = OptimizerConfig(optimizer["type"], _frozen(optimizer["params"]),
                                    optimizer["decoupled_weight_decay"])
    scheduler = values["scheduler"]
    if scheduler is not None:
        scheduler = SchedulerConfig(scheduler["type"], _frozen(scheduler["params"]))
    top = dict(values)
    top.update(
        optimizer=optimizer,
        scheduler=scheduler,
        fp16=_make(FP16Config, values["fp16"]),
        bf16=_make(BF16Config, values["bf16"]),
        zero_optimization=_make(ZeroOptimizationConfig, zero),
        aio=_make(AioConfig, values["aio"]),
        memory_report=_make(MemoryReportConfig, values["memory_report"]),
        checkpoint=_make(CheckpointConfig, values["checkpoint"]),
        activation_checkpointing=_make(ActivationCheckpointingConfig,
                                       values["activation_checkpointing"]),
        pipeline=_make(PipelineConfig, values["pipeline"]),
        tensor_parallel=_make(TensorParallelConfig, values["tensor_parallel"]),
        expert_parallel=_make(ExpertParallelConfig, values["expert_parallel"]),
        tensorboard=_make(MonitorDirConfig, values["tensorboard"]),
        csv_monitor=_make(MonitorDirConfig, values["csv_monitor"]),
        wandb=_make(WandbConfig, values["wandb"]),
        comet=_make(CometConfig, values["comet"]),
        comms_logger=_make(CommsLoggerConfig, values["comms_logger"]),
        flops_profiler=_make(FlopsProfilerConfig, values["flops_profiler"]),
        timers=TimersConfig(_make(ThroughputTimerConfig, values["timers"]["throughput"])),
        data_types=_make(DataTypesConfig, values["data_types"]),
        hybrid_engine=_make(HybridEngineConfig, values["hybrid_engine"]),
        torch_autocast=_make(TorchAutocastConfig, values["torch_autocast"]),
        world_size=world_size,
        enabled_features=frozenset(features),
        raw=raw,
    )
    return _make(ZeroConfig, top)


DATACLASS_FOR_BLOCK = {  # schema block path -> dataclass (for the schema/model sync test)
    "": ZeroConfig,
    "fp16": FP16Config,
    "bf16": BF16Config,
    "zero_optimization": ZeroOptimizationConfig,
    "zero_optimization.offload_optimizer": OffloadOptimizerConfig,
    "zero_optimization.offload_param": OffloadParamConfig,
    "aio": AioConfig,
    "memory_report": MemoryReportConfig,
    "checkpoint": CheckpointConfig,
    "pipeline": PipelineConfig,
    "tensor_parallel": TensorParallelConfig,
    "expert_parallel": ExpertParallelConfig,
    "tensorboard": MonitorDirConfig,
    "csv_monitor": MonitorDirConfig,
    "wandb": WandbConfig,
    "comet": CometConfig,
    "comms_logger": CommsLoggerConfig,
    "timers": TimersConfig,
    "data_types": DataTypesConfig,
    "timers.throughput": ThroughputTimerConfig,
    "flops_profiler": FlopsProfilerConfig,
    "hybrid_engine": HybridEngineConfig,
    "torch_autocast": TorchAutocastConfig,
}
