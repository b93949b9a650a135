"""The training set-up the estimate depends on besides the shapes (ranks, precision, optimizer,
bucket sizes, stage-3 bounds, offload), and how a DeepSpeed config fills it in."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from offload import OFFLOAD_TILE

from .errors import EstimateError

PRECISIONS = ("fp32", "bf16", "fp16")
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# The optimizers zero steps itself (_C.OptimizerKind; "sgd_momentum": SGD with its buffer;
# "muon": Muon for the matrices, Adam for the rest, shapes.for_muon)
OPTIMIZERS = ("adam", "sgd", "sgd_momentum", "adagrad", "lion", "lamb", "muon")
EXTERNAL = "external"  # a torch.optim config type, run on the shards (zero/external_optimizer.py)
# Every parameter starts 16-byte aligned in its flat buffer (zero/engine.py ALIGNMENT_BYTES;
# a test keeps the two equal).
ALIGNMENT_BYTES = 16
DEFAULT_REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default, as in the config schema
# Stage-3 defaults of the config schema (zero/config/schema.py; a test keeps them equal).
DEFAULT_PERSISTENCE_THRESHOLD = 100_000
DEFAULT_PREFETCH_BUCKET_SIZE = 50_000_000
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
DEFAULT_MAX_REUSE_DISTANCE = 1_000_000_000
DEFAULT_MAX_INFLIGHT_GATHERS = 2
DEFAULT_MODEL_PERSISTENCE_THRESHOLD = 2**63 - 1  # sys.maxsize: no cap
DEFAULT_MODULE_GRANULARITY_THRESHOLD = 0         # off

# Offload (OFFLOAD_TILE from offload/options.py, the engine's own constant): the offloaded
# step streams chunks of at most OFFLOAD_TILE elements.
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# offload_param "nvme" defaults (zero/config/schema.py OFFLOAD_PARAM; a test keeps them equal)
DEFAULT_PARAM_BUFFER_COUNT = 5
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
DEFAULT_PARAM_MAX_IN_CPU = 0
BUFFER_COUNT_ERROR = ("zero_optimization.offload_param.buffer_count = {}: parameters on NVMe "
                      "need at least 2 host buffers (one unit is read while another is written "
                      "back)")


@dataclass(frozen=True)
class Setup:
    """What the estimate depends on besides the shapes."""
    world_size: int = 1
    num_nodes: int = 1
    precision: str = "fp32"
    communication_data_type: Optional[str] = None  # gradients reduced in it (None: precision)
    # bf16/fp16_master_weights_and_grads: the master in the 16-bit precision (the parameters
    # themselves where no copy is needed); bf16_optimizer_states: the optimizer's arrays too;
    # optimizer.params.fp32_optimizer_states false: those arrays too when offloaded
    sixteen_bit_master: bool = False
    sixteen_bit_states: bool = False
    fp32_optimizer_states: Optional[bool] = None
    # data_types.grad_accum_dtype fp32 under 16-bit precision: the gradient buffers are fp32
    fp32_grads: bool = False
    optimizer: str = "adam"          # one of OPTIMIZERS, or EXTERNAL
    external_arrays: tuple = ()      # EXTERNAL: the optimizer's per-element fp32 arrays
    reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE
    overlap_comm: Optional[bool] = None  # None: DeepSpeed's default, stage == 3
    gradient_accumulation_steps: int = 1  # 1: stage 1 shards its gradients as stage 2 does
    # stage 3 (zero_optimization.stage3_*), in elements
    persistence_threshold: int = DEFAULT_PERSISTENCE_THRESHOLD
    prefetch_bucket_size: int = DEFAULT_PREFETCH_BUCKET_SIZE
    max_live_parameters: int = DEFAULT_MAX_LIVE_PARAMETERS
    max_reuse_distance: int = DEFAULT_MAX_REUSE_DISTANCE
    max_inflight_gathers: int = DEFAULT_MAX_INFLIGHT_GATHERS
    model_persistence_threshold: int = DEFAULT_MODEL_PERSISTENCE_THRESHOLD
    # stage 3's units besides zero's policy (shapes_from_module(..., unit_rules=) plans them):
    # stage3_module_granularity_threshold, and leaf_module's (classes, names, name_suffixes)
    # (None: DeepSpeed's default)
    module_granularity_threshold: int = DEFAULT_MODULE_GRANULARITY_THRESHOLD
    leaf_module: Optional[tuple] = None
    mics_shard_size: int = -1  # MiCS: partitioned within groups of this many ranks (-1: off)
    hpz_partition_size: int = 1  # ZeRO++ hpZ: secondary copies shared by this many ranks
    quantized_weights: bool = False    # ZeRO++ qwZ: all-gathers carry int8
    quantized_gradients: bool = False  # ZeRO++ qgZ: reduce-scatters carry int8
    all_reduce_fetch: bool = False  # stage3_use_all_reduce_for_fetch_params: gathers are all-reduces
    # zero_quantized_nontrainable_weights: the frozen shard kept as int8 code (quantized_bytes)
    quantized_nontrainable: bool = False
    # hybrid_engine enabled with pin_parameters: the model's generate holds every unit at once
    hybrid_generate: bool = False
    # offload: the configured devices (which row `estimate(shapes, setup, stage)` gives and the
    # table marks) and the chunk of the offloaded step
    offload_optimizer: str = "none"   # none | cpu | nvme
    offload_param: str = "none"       # none | cpu | nvme
    sub_group_size: int = DEFAULT_SUB_GROUP_SIZE
    delayed_update: bool = False      # offload_optimizer.delayed_update (cpu only)
    offload_ratio: float = 1.0        # offload_optimizer.ratio: the offloaded tail of each shard
    grads_on_device: bool = False     # offload_optimizer.grads_on_device: no host gradient shard
    # offload_param "nvme" (zero_optimization.offload_param.*): host buffers that carry units
    # to and from the swap file, the most shard elements one NVMe unit may have, and the shard
    # elements of the first units kept in host memory
    param_buffer_count: int = DEFAULT_PARAM_BUFFER_COUNT
    param_buffer_size: int = DEFAULT_PARAM_BUFFER_SIZE
    param_max_in_cpu: int = DEFAULT_PARAM_MAX_IN_CPU
    # the model trains on the CPU: device and host bytes share the RAM, and the offloaded step
    # updates the model in place (no gradient or parameter staging)
    cpu_only: bool = False
    # expert_parallel (AutoEP) enabled: (autoep_size, preset_model, moe_layer_pattern); the
    # shapes builders split the model's MoE blocks' experts by it (expert_parallel)
    autoep: Optional[tuple] = None

    def __post_init__(self):
        if self.world_size < 1:
            raise EstimateError(f"world size must be >= 1, got {self.world_size}")
        if self.num_nodes < 1 or self.world_size % self.num_nodes:
            raise EstimateError(f"{self.world_size} ranks do not split evenly over "
                                f"{self.num_nodes} nodes")
        if self.precision not in PRECISIONS:
            raise EstimateError(f"precision {self.precision!r}: expected one of {PRECISIONS}")
        if (self.sixteen_bit_master or self.sixteen_bit_states) and self.precision == "fp32":
            raise EstimateError("a 16-bit master or optimizer state needs precision bf16 or fp16")
        if self.sixteen_bit_states and self.precision != "bf16":
            raise EstimateError("16-bit optimizer states (bf16_optimizer_states) need precision "
                                "bf16")
        if self.sixteen_bit_states and not self.sixteen_bit_master:
            raise EstimateError("16-bit optimizer states need the 16-bit master "
                                "(bf16_master_weights_and_grads)")
        if self.communication_data_type not in (None, *PRECISIONS):
            raise EstimateError(f"communication_data_type {self.communication_data_type!r}: "
                                f"expected one of {PRECISIONS}")
        if self.optimizer not in (*OPTIMIZERS, EXTERNAL):
            raise EstimateError(f"optimizer {self.optimizer!r}: expected one of {OPTIMIZERS}")
        if self.gradient_accumulation_steps < 1:
            raise EstimateError(f"gradient_accumulation_steps must be >= 1, got "
                                f"{self.gradient_accumulation_steps}")
        if self.reduce_bucket_size < 1:
            raise EstimateError(f"reduce_bucket_size must be >= 1, got {self.reduce_bucket_size}")
        for name in ("persistence_threshold", "prefetch_bucket_size", "max_live_parameters",
                     "max_reuse_distance", "model_persistence_threshold",
                     "module_granularity_threshold"):
            if getattr(self, name) < 0:
                raise EstimateError(f"stage3 {name} must be >= 0, got {getattr(self, name)}")
        if self.max_inflight_gathers < 1:
            raise EstimateError(f"stage3 max_inflight_gathers must be >= 1, got "
                                f"{self.max_inflight_gathers}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise EstimateError(f"{name} {getattr(self, name)!r}: expected one of "
                                    f"{OFFLOAD_DEVICES}")
        if self.sub_group_size < 1:
            raise EstimateError(f"sub_group_size must be >= 1, got {self.sub_group_size}")
        if not 0.0 <= float(self.offload_ratio) <= 1.0:
            raise EstimateError(f"offload_optimizer.ratio must be in [0, 1], got "
                                f"{self.offload_ratio}")
        if self.delayed_update and float(self.offload_ratio) < 1.0:
            raise EstimateError("the delayed update needs the whole step on the host (ratio 1)")
        for name in ("param_buffer_count", "param_buffer_size", "param_max_in_cpu"):
            if getattr(self, name) < 0:
                raise EstimateError(f"offload_param.{name[len('param_'):]} must be >= 0, got "
                                    f"{getattr(self, name)}")
        # as the config validator: only parameters on NVMe use the buffers (the NVMe rows of
        # another set-up say that they do not run instead)
        if self.offload_param == "nvme" and self.param_buffer_count < 2:
            raise EstimateError(BUFFER_COUNT_ERROR.format(self.param_buffer_count))

    def offloaded_numel(self, shard_numel: int) -> int:
        """Of one engine group's shard, the elements whose state and step are offloaded (the
        shard's tail): llround(ratio x shard), as the engine rounds (half away from zero)."""
        value = float(self.offload_ratio) * int(shard_numel)
        whole = math.floor(value)
        return int(whole) + (1 if value - whole >= 0.5 else 0)

    @property
    def offload_chunk_limit(self) -> int:
        """Elements per chunk of the offloaded step, before the shard caps it."""
        return min(int(self.sub_group_size), OFFLOAD_TILE)

    def offload_chunk(self, shard_numel: int) -> int:
        """C of one engine group: min(sub_group_size, 4,194,304, the group's shard)."""
        return min(self.offload_chunk_limit, max(int(shard_numel), 1))

    @property
    def expert_parallel(self):
        """The config's expert_parallel block (zero.config.ExpertParallelConfig) when AutoEP
        is on, else None: what zero.moe.auto_ep splits."""
        if self.autoep is None:
            return None
        from zero.config.model import ExpertParallelConfig
        size, preset, pattern = self.autoep
        return ExpertParallelConfig(enabled=True, autoep_size=size, preset_model=preset,
                                    moe_layer_pattern=pattern, use_grouped_mm=True,
                                    disable_triton_grouped_mm=False)

    @property
    def partition_world(self) -> int:
        """The ranks stage 3's partitioned groups shard over: MiCS's shard group, or all."""
        size = self.mics_shard_size
        return size if 0 < size < self.world_size else self.world_size

    @property
    def hpz_world(self) -> int | None:
        """hpZ's secondary group size H when hpZ is on (1 < H < N), else None."""
        size = self.hpz_partition_size
        return size if 1 < size < self.world_size else None

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.num_nodes

    @property
    def param_bytes(self) -> int:
        return PARAM_BYTES[self.precision]

    @property
    def master_dtype_bytes(self) -> int:
        """Bytes per element of the master weights (shard_precision.h)."""
        return self.param_bytes if self.sixteen_bit_master else 4

    def state_dtype_bytes(self, offloaded: bool) -> int:
        """Bytes per element of each optimizer array, for an option that offloads the
        optimizer or not (the engine's boundary.states_rule)."""
        from zero.boundary import states_rule

        sixteen = states_rule(self.sixteen_bit_states, self.fp32_optimizer_states,
                              self.sixteen_bit_master, offloaded)
        return self.param_bytes if sixteen else 4

    def array_bytes(self, name: str) -> int:
        """Bytes per element of one offloaded state array ("master", or an optimizer array)."""
        return self.master_dtype_bytes if name == "master" else self.state_dtype_bytes(True)

    @property
    def grad_dtype(self) -> str:
        """The gradient buffers' dtype (csrc grad_options): fp32 with fp32_grads, else the
        parameters'."""
        return "fp32" if self.fp32_grads else self.precision

    @property
    def grad_bytes(self) -> int:
        return PARAM_BYTES[self.grad_dtype]

    @property
    def comm_bytes(self) -> int:
        """Bytes per element of the reduce buckets: the communication dtype's."""
        return PARAM_BYTES[self.communication_data_type or self.precision]

    @property
    def comm_converts(self) -> bool:
        """The buckets' dtype (the communication dtype, else the parameters') is not the
        gradients': every reducer reduces a copy of each unit in a bucket of it
        (grad_reducer.h), at every stage."""
        return (self.communication_data_type or self.precision) != self.grad_dtype

    @property
    def alignment(self) -> int:
        return max(1, ALIGNMENT_BYTES // self.param_bytes)

    def overlap_for(self, stage: int) -> bool:
        return (stage == 3) if self.overlap_comm is None else bool(self.overlap_comm)

    def grads_sharded(self, stage: int) -> bool:
        """Whether the gradients are sharded below stage 3 (the engine's rule)."""
        from zero.boundary import grads_sharded

        return grads_sharded(stage, self.gradient_accumulation_steps)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "num_nodes": self.num_nodes,
                "ranks_per_node": self.ranks_per_node, "precision": self.precision,
                "communication_data_type": self.communication_data_type,
                "sixteen_bit_master": self.sixteen_bit_master,
                "sixteen_bit_states": self.sixteen_bit_states,
                "fp32_optimizer_states": self.fp32_optimizer_states,
                "fp32_grads": self.fp32_grads,
                "param_bytes": self.param_bytes, "optimizer": self.optimizer,
                "reduce_bucket_size": self.reduce_bucket_size, "overlap_comm": self.overlap_comm,
                "cpu_only": self.cpu_only,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "stage3": self.stage3_dict(), "mics_shard_size": self.mics_shard_size,
                "zero_hpz_partition_size": self.hpz_partition_size,
                "offload": {"offload_optimizer": self.offload_optimizer,
                            "offload_param": self.offload_param,
                            "sub_group_size": self.sub_group_size,
                            "delayed_update": self.delayed_update,
                            "ratio": self.offload_ratio,
                            "grads_on_device": self.grads_on_device,
                            "param_buffer_count": self.param_buffer_count,
                            "param_buffer_size": self.param_buffer_size,
                            "param_max_in_cpu": self.param_max_in_cpu}}

    def unit_rules(self):
        """The stage3_policy.UnitRules of this set-up."""
        from zero.stage3_policy import UnitRules

        leaf = {} if self.leaf_module is None else dict(zip(
            ("leaf_classes", "leaf_names", "leaf_suffixes"), self.leaf_module))
        return UnitRules(self.module_granularity_threshold, **leaf)

    def stage3_dict(self) -> dict:
        """The stage-3 settings under their config names."""
        return {"stage3_param_persistence_threshold": self.persistence_threshold,
                "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
                "stage3_max_live_parameters": self.max_live_parameters,
                "stage3_max_reuse_distance": self.max_reuse_distance,
                "stage3_max_inflight_gathers": self.max_inflight_gathers,
                **({"stage3_model_persistence_threshold": self.model_persistence_threshold}
                   if self.model_persistence_threshold != DEFAULT_MODEL_PERSISTENCE_THRESHOLD
                   else {}),
                **({"stage3_module_granularity_threshold": self.module_granularity_threshold}
                   if self.module_granularity_threshold else {}),
                **({"stage3_use_all_reduce_for_fetch_params": True}
                   if self.all_reduce_fetch else {}),
                **({"zero_quantized_nontrainable_weights": True}
                   if self.quantized_nontrainable else {})}


# config key -> Setup field (stage 3)
STAGE3_KEYS = {"stage3_param_persistence_threshold": "persistence_threshold",
               "stage3_prefetch_bucket_size": "prefetch_bucket_size",
               "stage3_max_live_parameters": "max_live_parameters",
               "stage3_max_reuse_distance": "max_reuse_distance",
               "stage3_max_inflight_gathers": "max_inflight_gathers",
               "stage3_model_persistence_threshold": "model_persistence_threshold",
               "stage3_module_granularity_threshold": "module_granularity_threshold",
               "mics_shard_size": "mics_shard_size",
               "zero_hpz_partition_size": "hpz_partition_size"}


def setup_from_config(config, world_size: int, num_nodes: int = 1, data_ranks: int | None = None,
                      all_ranks: int | None = None, **overrides):
    """(Setup, stage) from a DeepSpeed JSON config (a path or dict); keyword overrides that are
    not None win (precision, optimizer, reduce_bucket_size, overlap_comm, stage, and the
    stage-3 and offload fields of Setup). Stage-3 keys are read, and the offload blocks
    (devices, sub_group_size, ratio, delayed_update, grads_on_device; offload_param's
    buffer_count, buffer_size and max_in_cpu). `data_ranks`: the ranks the batch keys count
    when the world also holds pipeline stages or tensor slices (default: the world);
    `all_ranks`: load_config's, for AutoTP set by the config alone."""
    from zero.boundary import fp32_grads, sixteen_bit_master
    from zero.config import ALL_FEATURES, ConfigError, load_config
    from zero.parallel import sequence

    try:
        cfg = load_config(config, world_size=data_ranks or world_size,
                          enabled_features=ALL_FEATURES, all_ranks=all_ranks)
    except ConfigError as error:
        raise EstimateError(f"--config: {error}") from None
    if cfg.sequence_parallel_size > 1:  # reduced in seq_parallel_communication_data_type
        try:
            cfg = sequence.reduction_config(cfg)
        except sequence.SequenceParallelError as error:
            raise EstimateError(f"--config: {error}") from None
    raw_zero = cfg.raw.get("zero_optimization") or {}
    optimizer = "adam"
    if cfg.optimizer is not None and cfg.optimizer.type == "SGD":
        optimizer = "sgd_momentum" if cfg.optimizer.params.get("momentum", 0.0) else "sgd"
    elif cfg.optimizer is not None and cfg.optimizer.type in ("Adagrad", "Lion", "Lamb", "Muon"):
        optimizer = cfg.optimizer.type.lower()
    elif cfg.optimizer is not None and cfg.optimizer.type != "Adam" and cfg.optimizer.type != "AdamW":
        optimizer = EXTERNAL
    values = {
        "precision": cfg.precision,
        "communication_data_type": cfg.communication_data_type,
        "sixteen_bit_master": sixteen_bit_master(cfg),
        "sixteen_bit_states": bool(cfg.bf16.bf16_optimizer_states),
        "fp32_optimizer_states": (cfg.optimizer.params.get("fp32_optimizer_states")
                                  if cfg.optimizer is not None else None),
        "fp32_grads": fp32_grads(cfg),
        "optimizer": optimizer,
        "external_arrays": _external_arrays(cfg.optimizer) if optimizer == EXTERNAL else (),
        "reduce_bucket_size": cfg.zero_optimization.reduce_bucket_size,
        "overlap_comm": raw_zero.get("overlap_comm"),  # None: the stage-dependent default
        "gradient_accumulation_steps": int(cfg.gradient_accumulation_steps),
    }
    for key, name in STAGE3_KEYS.items():
        values[name] = int(getattr(cfg.zero_optimization, key))
    zero_cfg = cfg.zero_optimization
    values["offload_ratio"] = float(zero_cfg.offload_optimizer.ratio)
    values["offload_optimizer"] = zero_cfg.offload_optimizer.device
    values["offload_param"] = zero_cfg.offload_param.device
    values["sub_group_size"] = int(zero_cfg.sub_group_size)
    values["quantized_weights"] = bool(zero_cfg.zero_quantized_weights)
    values["quantized_gradients"] = bool(zero_cfg.zero_quantized_gradients)
    values["all_reduce_fetch"] = bool(zero_cfg.stage3_use_all_reduce_for_fetch_params)
    values["quantized_nontrainable"] = bool(zero_cfg.zero_quantized_nontrainable_weights)
    values["hybrid_generate"] = bool(cfg.hybrid_engine.enabled and cfg.hybrid_engine.pin_parameters)
    leaf = zero_cfg.leaf_module
    values["leaf_module"] = (tuple(leaf.classes), tuple(leaf.names), tuple(leaf.name_suffixes))
    values["delayed_update"] = bool(getattr(zero_cfg.offload_optimizer, "delayed_update", False))
    values["grads_on_device"] = bool(zero_cfg.offload_optimizer.grads_on_device)
    param = zero_cfg.offload_param
    values["param_buffer_count"] = int(param.buffer_count)
    values["param_buffer_size"] = int(param.buffer_size)
    values["param_max_in_cpu"] = int(param.max_in_cpu)
    autoep = cfg.expert_parallel
    values["autoep"] = (autoep.autoep_size, autoep.preset_model, autoep.moe_layer_pattern) \
        if autoep.enabled else None
    stage = cfg.zero_optimization.stage
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "stage":
            stage = value
        else:
            values[key] = value
    return Setup(world_size=world_size, num_nodes=num_nodes, **values), stage


def _external_arrays(optimizer_config) -> tuple:
    """What a torch.optim config type keeps per element: the engine's own probe of it."""
    import torch

    from zero.external_optimizer import probe
    from zero.optimizer import torch_optimizer

    client = torch_optimizer(optimizer_config, [torch.nn.Parameter(torch.zeros(1))])
    return tuple(probe(client, client.param_groups[0]))


def optimizer_arrays(setup: Setup, kind: str | None = None) -> tuple:
    """The arrays the optimizer keeps per element: the engine's own list of them (`kind`: of
    one group's update, where they differ: ModelShapes.group_kinds)."""
    kind = kind or setup.optimizer
    if kind == EXTERNAL:
        return setup.external_arrays
    from zero import _C

    momentum = kind == "sgd_momentum"
    return tuple(_C.optimizer_state_names(getattr(_C.OptimizerKind, "sgd" if momentum else kind),
                                          momentum))


def optimizer_state_bytes(setup: Setup, option=None, kind: str | None = None) -> int:
    """Bytes per element of the optimizer's arrays under `option` (None: not offloaded)."""
    offloaded = option is not None and option.offload_optimizer != "none"
    return setup.state_dtype_bytes(offloaded) * len(optimizer_arrays(setup, kind))
