"""Declarative schema of the DeepSpeed-compatible JSON config.

Every key zero knows about is declared here once, with its type, default,
allowed values, documentation and support status. The validator
(``validate.py``) and the documentation generator (``docs.py``) both read these
tables; nothing else hard-codes key names, so adding a key is a one-place edit.

Defaults are DeepSpeed's *code* defaults (DeepSpeed 0.19: ``runtime/config.py``,
``runtime/constants.py``, ``runtime/zero/config.py``,
``runtime/zero/offload_config.py``, ``runtime/precision_config.py``,
``runtime/swap_tensor/aio_config.py``, ``runtime/lr_schedules.py``,
``ops/adam/fused_adam.py``); where DeepSpeed's documentation says otherwise
the code wins and the key's doc string says so.

The tables are written with zero/config/keys.py's `Key`, `Block` and constructors (the
key kinds, the features a value may need, the sanity bounds); the optimizer and scheduler
blocks are in zero/config/optimizer_schema.py.
"""

import sys

# (the kinds and features are read from here too: schema.INT, schema.BUILT_FEATURES)
from .keys import (ALL_FEATURES, AUTO_DEFAULT, BETAS, BLOCK, BOOL, BUILT_FEATURES, CHOICE,
                   FEATURE_NVME, FEATURE_OFFLOAD, FEATURE_OFFLOAD_PARAM, FEATURE_OFFLOAD_PARAM_NVME,
                   FEATURE_STAGE3, FLOAT, INT, MAX_AIO_BLOCK, MAX_BUFFERS, MAX_ELEMENTS, MAX_INT64,
                   MAX_LOSS_SCALE, MAX_SAMPLES, MAX_STEPS, OBJECT, PARAMS, REQUIRED, SECTION, STR,
                   STRINGS, Block, Key, boolean, choice, integer, nested, number, section,
                   unsupported)
from .optimizer_schema import (OPTIMIZER, OPTIMIZER_PARAMS, SCHEDULER,
                               SCHEDULER_PARAMS, TORCH_OPTIMIZERS)

# --------------------------------------------------------------------------- precision

FP16 = Block("fp16", "fp16 mixed precision with loss scaling.", (
    boolean("enabled", False, "Train in fp16 (fp32 master weights)."),
    number("loss_scale", 0.0, "Static loss scale; 0 selects dynamic loss scaling. At most 2**127 (the largest "
           "power of two in fp32, as for initial_scale_power).", minimum=0, maximum=MAX_LOSS_SCALE,
           auto=AUTO_DEFAULT),
    integer("initial_scale_power", 16, "Dynamic scaling starts at 2**initial_scale_power.", minimum=0, maximum=127,
            auto=AUTO_DEFAULT),
    integer("loss_scale_window", 1000, "Overflow-free steps before the dynamic scale grows.", minimum=1,
            maximum=MAX_STEPS, auto=AUTO_DEFAULT),
    integer("hysteresis", 2, "Overflows tolerated before the dynamic scale shrinks (delayed shift).", minimum=1,
            maximum=MAX_STEPS, auto=AUTO_DEFAULT),
    boolean("consecutive_hysteresis", False, "Refill hysteresis after every overflow-free step."),
    number("min_loss_scale", 1.0, "Lower bound of the dynamic loss scale (DeepSpeed types it int; zero also "
           "accepts fractions; at most 2**127, as loss_scale).", minimum=0, minimum_exclusive=True,
           maximum=MAX_LOSS_SCALE, auto=AUTO_DEFAULT),
    boolean("auto_cast", False, "Cast the floating-point tensors among forward's positional inputs to fp16 "
            "(DeepSpeed casts every tensor with a .half(), integer token ids too; zero leaves those alone). "
            "Accelerate adds it for --fp16 without an fp16 block."),
    boolean("fp16_master_weights_and_grads", False, "Keep the master weights in fp16: the fp16 parameters are "
            "the master (no fp32 copy), stepped with fp32 optimizer state (fp16 with optimizer.params."
            "fp32_optimizer_states false and offload_optimizer); stages 1-3. DeepSpeed also requires "
            "offload_optimizer (its CPU Adam) here; zero steps them wherever the optimizer runs."),
))

BF16 = Block("bf16", "bf16 mixed precision (no loss scaling).", (
    boolean("enabled", False, "Train in bf16 (fp32 master weights, unless bf16_master_weights_and_grads)."),
    boolean("immediate_grad_update", False, "DeepSpeed's BF16_Optimizer knob: add each gradient into the fp32 "
            "gradients as its hook fires (true) or after backward (false). zero always does the former "
            "(data_types.grad_accum_dtype fp32); either value is accepted and changes nothing."),
    unsupported(BOOL, "check_grad_overflow", True, "Skip a step whose gradients are not finite (DeepSpeed's "
                 "default): zero always does (nonfinite_gradients); false, which lets DeepSpeed apply such a "
                 "step, is refused."),
    boolean("bf16_master_weights_and_grads", False, "Keep the master weights (and the gradients, unless "
            "data_types.grad_accum_dtype is fp32) in bf16: the bf16 parameters are the master, with no fp32 copy (2 bytes per parameter "
            "instead of 4; offload and parameter offload keep a bf16 copy). Stages 1-3; not with an optimizer "
            "zero does not build itself (it steps an fp32 master). "
            "DeepSpeed requires offload_optimizer unless bf16_optimizer_states is set; zero does not."),
    boolean("bf16_optimizer_states", False, "Keep the optimizer's state (Adam's moments, ...) in bf16 too: 2 bytes "
            "per parameter and array instead of 4. Needs bf16_master_weights_and_grads; stages 1-3."),
))

# --------------------------------------------------------------------------- ZeRO

_DEVICES = ("none", "cpu", "nvme")
_DEVICE_FEATURES = (("cpu", FEATURE_OFFLOAD), ("nvme", FEATURE_NVME))

OFFLOAD_PARAM = Block("zero_optimization.offload_param", "Offload parameters (stage 3 only).", (
    choice("device", "none", _DEVICES, "Where parameters live between uses (DeepSpeed's docs say cpu; its code "
            "default is none).", value_features=(("cpu", FEATURE_OFFLOAD_PARAM),
                                                 ("nvme", FEATURE_OFFLOAD_PARAM_NVME))),
    Key("nvme_path", STR, None, "Directory on the NVMe device (required when device is nvme).", nullable=True,
        feature=FEATURE_OFFLOAD_PARAM_NVME),
    boolean("pin_memory", True, "Use page-locked CPU memory (DeepSpeed 0.19.8's default; where it cannot be "
            "had, pageable memory, with a warning when the config asks for it or a GPU is there).",
            feature=FEATURE_OFFLOAD_PARAM),
    integer("buffer_count", 5, "Host buffers that carry parameter units to and from NVMe (zero: each is one "
            "unit's shard, the largest, not buffer_size elements; at least 2).", minimum=0, maximum=MAX_BUFFERS,
            feature=FEATURE_OFFLOAD_PARAM_NVME),
    integer("buffer_size", 100_000_000, "Elements per NVMe buffer (zero: the most parameter elements one gather "
            "unit may have per rank on NVMe).", minimum=0, maximum=MAX_ELEMENTS, feature=FEATURE_OFFLOAD_PARAM_NVME),
    integer("max_in_cpu", 0, "Parameter elements kept in CPU memory when offloading to NVMe (zero: the first "
            "gather units' shards up to this many elements stay in host memory, the rest go to NVMe; default 0, "
            "all on NVMe. DeepSpeed's default is 1e9 but it writes every partition to NVMe whatever the value).",
            minimum=0, maximum=MAX_ELEMENTS, feature=FEATURE_OFFLOAD_PARAM_NVME),
))

# DeepSpeed 0.19.8's default leaf_module.classes (leaf_module_config.py): MoE blocks whose experts
# a batch may not all use, so that they are gathered whole
DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)

LEAF_MODULE = Block("zero_optimization.leaf_module", "Stage 3: modules gathered whole as one gather unit "
                    "(DeepSpeed's set_z3_leaf_modules from the config), inside the block that holds them.", (
    Key("classes", STRINGS, DEFAULT_LEAF_MODULE_CLASSES, "Module classes, by import path (module.Class) or "
        "class name; a class the model does not use is ignored (DeepSpeed's default: three MoE blocks)."),
    Key("names", STRINGS, (), "Modules by their name in model.named_modules() (a name the model lacks "
        "is a warning)."),
    Key("name_suffixes", STRINGS, (), "Modules whose name ends with one of these."),
))

OFFLOAD_OPTIMIZER = Block("zero_optimization.offload_optimizer", "Offload optimizer state (and the optimizer "
                          "step) to CPU or NVMe.", (
    choice("device", "none", _DEVICES, "Where optimizer state lives (DeepSpeed's docs say cpu; its code default "
            "is none).", value_features=_DEVICE_FEATURES),
    Key("nvme_path", STR, None, "Directory on the NVMe device (required when device is nvme).", nullable=True,
        feature=FEATURE_NVME),
    boolean("pin_memory", True, "Use page-locked CPU memory (DeepSpeed 0.19.8's default; where it cannot be "
            "had, pageable memory, with a warning when the config asks for it or a GPU is there).",
            feature=FEATURE_OFFLOAD),
    integer("buffer_count", 4, "Buffers in the NVMe buffer pool (zero double-buffers: two chunks of state "
            "are on the host at a time; any value from 2 to 1024 is accepted).", minimum=2, maximum=MAX_BUFFERS),
    boolean("pipeline_read", False, "Overlap NVMe reads with the optimizer step (zero always does).",
            feature=FEATURE_NVME),
    boolean("pipeline_write", False, "Overlap NVMe writes with the optimizer step (zero always does).",
            feature=FEATURE_NVME),
    boolean("fast_init", False, "Fast optimizer initialisation with NVMe (zero: no effect, its swap file is "
            "preallocated and zero-filled).", feature=FEATURE_NVME),
    number("ratio", 1.0, "Fraction of each shard's optimizer state (and step) offloaded; the rest stays on the "
           "device (zero: stages 1-3; DeepSpeed: stage 3 only).", minimum=0, maximum=1, feature=FEATURE_OFFLOAD),
    boolean("delayed_update", False, "zero only: delayed parameter update (ZeRO-Offload's DPU): the CPU step of "
            "step i overlaps the forward and backward of step i+1, which trains on parameters one update old "
            "(device \"cpu\"; engine.apply_delayed_update() applies the last one).", feature=FEATURE_OFFLOAD),
    boolean("grads_on_device", False, "zero only: keep the gradient shard (stages 2-3) on the device instead of "
            "reducing it into host memory: backward runs as without offload and the optimizer step copies the "
            "shard to the host chunk by chunk, behind the CPU optimizer (with delayed_update: whole, as the "
            "update starts). Costs the shard's bytes on the device "
            "(2Ψ/N in 16 bits); saves a shard-sized copy per micro-step, and with gradient accumulation a "
            "device round trip for every later micro-step (stage 1 and a ratio below 1 keep gradients on the "
            "device anyway).", feature=FEATURE_OFFLOAD),
    unsupported(BOOL, "super_offload", False, "SuperOffload for superchips."),
    unsupported(BOOL, "convert_grad_on_cpu", True, "Where SuperOffload converts grads."),
    unsupported(FLOAT, "cpuadam_cores_perc", 0.8, "CPU share for SuperOffload's Adam."),
))


def _stage3(kind, name, default, doc, feature=FEATURE_STAGE3, **kw):
    return Key(name, kind, default, doc + " Stage 3 only.", feature=feature, **kw)


ZERO_OPTIMIZATION = Block("zero_optimization", "ZeRO partitioning of optimizer state (stage 1), gradients "
                          "(stage 2) and parameters (stage 3).", (
    integer("stage", 0, "0: plain data parallel, 1: partition optimizer state, 2: + gradients, 3: + parameters.",
            minimum=0, maximum=3, value_features=((3, FEATURE_STAGE3),)),
    boolean("contiguous_gradients", True, "Copy gradients into a contiguous buffer as they are produced."),
    boolean("reduce_scatter", True, "Average gradients with reduce/reduce-scatter instead of all-reduce."),
    integer("reduce_bucket_size", 500_000_000, "Elements reduced per bucket.", minimum=1,
            maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    integer("allgather_bucket_size", 500_000_000, "Elements all-gathered per bucket.", minimum=1,
            maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    boolean("overlap_comm", None, "Overlap gradient reduction with the backward pass. Default (DeepSpeed code): true "
            "for stage 3, false otherwise (DeepSpeed's docs say false).", nullable=True,
            auto="the stage-dependent default", default_doc="stage == 3"),
    boolean("round_robin_gradients", False, "DeepSpeed: reorder its contiguous partitions so that every rank "
            "copies gradients to the CPU throughout backward (CPU offload, stages 1-2). zero's reduce-scatter "
            "already gives every rank 1/N of each unit as the unit completes, so the copies are spread over all "
            "ranks either way; the flag changes nothing."),
    nested("offload_optimizer", OFFLOAD_OPTIMIZER, "Optimizer-state offload (table below). Absent or null: none."),
    nested("offload_param", OFFLOAD_PARAM, "Parameter offload (table below). Absent or null: none."),
    nested("leaf_module", LEAF_MODULE, "Stage 3: modules gathered whole as one unit (table below)."),
    _stage3(INT, "stage3_prefetch_bucket_size", 50_000_000, "Elements prefetched ahead of use (DeepSpeed's docs "
            "say 5e8; its code default is 5e7).", minimum=0, maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    _stage3(INT, "stage3_param_persistence_threshold", 100_000, "Parameters smaller than this stay unpartitioned.",
            minimum=0, maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    _stage3(INT, "stage3_model_persistence_threshold", sys.maxsize, "Cap on the elements kept whole in "
            "all: in model order, a small parameter that would pass it is partitioned (DeepSpeed's rule).",
            minimum=0, maximum=MAX_INT64, default_doc="sys.maxsize"),
    _stage3(INT, "stage3_max_live_parameters", 1_000_000_000, "Parameter elements resident per GPU before "
            "releasing: prefetching stops and kept units make way at it. As in DeepSpeed it refuses "
            "nothing: the units in use are gathered whatever it says (DeepSpeed-Chat sets 3e7, less "
            "than one layer of a 1.3B model), and the schedule's notice names it once.", minimum=0,
            maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    _stage3(INT, "stage3_max_reuse_distance", 1_000_000_000, "Keep a unit gathered after use if the recorded "
            "order reuses it before this many elements of other units are gathered (0: never; "
            "kept units make way when stage3_max_live_parameters needs room).", minimum=0,
            maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    _stage3(INT, "stage3_max_inflight_gathers", 2, "zero only (DeepSpeed hard-codes 2): prefetch "
            "all-gathers in flight at once.", minimum=1, maximum=MAX_BUFFERS),
    _stage3(BOOL, "stage3_gather_16bit_weights_on_model_save", False, "Gather the full 16-bit weights when saving "
            "the model."),
    _stage3(INT, "stage3_module_granularity_threshold", 0, "From the root down, a module whose elements per "
            "layer (its torch leaves with parameters, and itself) are at most this becomes one gather unit, "
            "as with set_z3_leaf_modules; containers never; 0: off (DeepSpeed's rule).",
            minimum=0, maximum=MAX_ELEMENTS),
    unsupported(BOOL, "stage3_allgather_sequential", False, "DeepSpeed: gather a unit's parameters one by one "
                 "instead of through a flat buffer (zero gathers each unit into its own buffer, no extra copy)."),
    _stage3(BOOL, "stage3_use_all_reduce_for_fetch_params", False, "Gather each unit by an all-reduce of "
            "a zeroed buffer holding this rank's shard (for networks where all-reduce is faster); not the "
            "quantized (zero_quantized_weights) or hpZ gathers, as in DeepSpeed."),
    integer("sub_group_size", 1_000_000_000, "Elements per tile of the offloaded optimizer step; zero streams "
            "tiles of min(sub_group_size, 4,194,304) elements through two staging buffers.", minimum=1,
            maximum=MAX_ELEMENTS, auto=AUTO_DEFAULT),
    unsupported(BOOL, "allgather_partitions", True, "All-gather (true) or broadcast updated partitions."),
    unsupported(BOOL, "load_from_fp32_weights", True, "Initialise fp32 master weights from checkpoint fp32 copies."),
    unsupported(BOOL, "elastic_checkpoint", False, "Legacy elastic checkpointing."),
    unsupported(BOOL, "ignore_unused_parameters", True, "Tolerate parameters without gradients (stage 2)."),
    unsupported(BOOL, "legacy_stage1", False, "Old stage 1 implementation."),
    unsupported(BOOL, "use_multi_rank_bucket_allreduce", True, "Combine reduce buckets of several ranks."),
    _stage3(INT, "zero_hpz_partition_size", 1, "ZeRO++ hpZ: ranks per secondary group (consecutive "
            "ranks within one node, e.g. the GPUs per node). After a unit's first all-gather of a step "
            "each rank keeps its 1/H of it, and the unit's later gathers (backward, further micro-batches) "
            "stay within the group; costs Psi/H more parameter bytes per rank. 1, or the world size: off. "
            "Must divide the world size and the ranks per node.", minimum=1, maximum=MAX_BUFFERS),
    _stage3(BOOL, "zero_quantized_weights", False, "ZeRO++ qwZ: parameters all-gathered as block-wise "
            "int8 (one fp32 scale per 256 values), about 1/4 of fp32's bytes, 1/2 of bf16's. Runs on gloo "
            "(CPU) and NCCL (CUDA kernels)."),
    _stage3(BOOL, "zero_quantized_nontrainable_weights", False, "ZeRO++: the partitioned frozen "
            "(requires_grad False) parameters kept as block-wise int8 (one fp32 scale per 256 values, "
            "about 1 byte per element instead of 2 or 4), gathered as int8 and decoded into each unit's "
            "buffer: a LoRA base model's shard at about half its bf16 bytes, its values rounded once. "
            "Not with offload_param.device \"nvme\"."),
    _stage3(BOOL, "zero_quantized_gradients", False, "ZeRO++ qgZ: gradients reduce-scattered as block-wise "
            "int8 through one all-to-all, summed in fp32 by the receiving rank."),
    unsupported(OBJECT, "zeropp_loco_param", None, "LoCo-ZeRO++ parameters.", nullable=True),
    _stage3(INT, "mics_shard_size", -1, "MiCS (FSDP2's HSDP): parameters, gradients and optimizer state "
            "partitioned within shard groups of this many consecutive ranks (e.g. one node) and "
            "replicated across the groups; each reduced gradient shard is averaged over its replicas "
            "with one all-reduce. -1, or the world size: plain stage 3. Must divide the world size.",
            minimum=-1, maximum=MAX_BUFFERS),
    unsupported(BOOL, "mics_hierarchical_params_gather", False, "MiCS hierarchical gather."),
    _stage3(INT, "dp_shard_size", -1, "zero only, FSDP2 / Accelerate naming of MiCS (HSDP): the ranks "
            "that shard; the same as mics_shard_size. -1: not given.", minimum=-1, maximum=MAX_BUFFERS),
    _stage3(INT, "dp_replicate_size", -1, "zero only, FSDP2 / Accelerate naming of MiCS (HSDP): the "
            "shard groups that replicate; shard size = world size / dp_replicate_size. -1: not given.",
            minimum=-1, maximum=MAX_BUFFERS),
    boolean("memory_efficient_linear", True, "DeepSpeed: at stage 3, swap torch's linear for its own autograd "
            "function. zero always runs torch's own linear (DeepSpeed's false) and lets a gathered weight go "
            "after its forward either way: both values are accepted (DeepSpeed-Chat writes false) and change "
            "nothing."),
    unsupported(BOOL, "pipeline_loading_checkpoint", False, "Stage 3 pipelined checkpoint loading."),
    unsupported(BOOL, "override_module_apply", True, "Stage 3 nn.Module.apply override."),
    unsupported(BOOL, "log_trace_cache_warnings", False, "Stage 3 trace-cache warnings."),
    unsupported(BOOL, "enable_sanity_checks", False, "Internal sanity checks."),
    unsupported(BOOL, "compute_grad_norm", True, "Stage 1/2 global-norm bookkeeping."),
    unsupported(BOOL, "parameter_alignment", False, "Align parameters in flat buffers to 16 bytes."),
    unsupported(BOOL, "save_muon_momentum_buffer_in_memory", False, "Muon with NVMe offload."),
    unsupported(OBJECT, "zenflow", None, "ZenFlow asynchronous offloaded updates.", nullable=True),
))

# --------------------------------------------------------------------------- aio

AIO = Block("aio", "Asynchronous I/O for NVMe offload (libaio). Only meaningful with feature 'nvme'.", (
    integer("block_size", 1_048_576, "Bytes per I/O piece; a multiple of 4096 (O_DIRECT alignment), at most the "
            "largest one a C int holds (DeepSpeed's aio handle takes it as an int).", minimum=4096,
            maximum=MAX_AIO_BLOCK, feature=FEATURE_NVME),
    integer("queue_depth", 8, "Requests in flight per worker (io_uring ring size).", minimum=1, maximum=4096,
            feature=FEATURE_NVME),
    integer("intra_op_parallelism", 1, "I/O worker threads (DeepSpeed's old name: thread_count).", minimum=1,
            maximum=256, feature=FEATURE_NVME),
    boolean("single_submit", False, "libaio submission mode (zero's backends submit per piece; no effect).",
            feature=FEATURE_NVME),
    boolean("overlap_events", True, "libaio completion mode (zero always overlaps; no effect).",
            feature=FEATURE_NVME),
    unsupported(BOOL, "use_gds", False, "Use NVIDIA GPUDirect Storage."),
))

# --------------------------------------------------------------------------- zero's own block

MEMORY_REPORT = Block("memory_report", "zero's own block: periodic memory reports.", (
    Key("path", STR, None, "JSON-lines file the report is appended to (null: no file).", nullable=True),
    integer("every_n_steps", None, "Report every N optimizer steps. Null: steps_per_print (and when that is null "
            "too, no periodic report).", minimum=1, maximum=MAX_INT64, nullable=True, default_doc="steps_per_print"),
))

# --------------------------------------------------------------------------- activation checkpointing

# DeepSpeed 0.19: runtime/activation_checkpointing/config.py. Read by deepspeed.checkpointing's
# configure(deepspeed_config=...) and applied by the engine (zero/activation_checkpointing.py).
ACTIVATION_CHECKPOINTING = Block("activation_checkpointing", "deepspeed.checkpointing.checkpoint's "
                                 "options (zero/activation_checkpointing.py).", (
    boolean("partition_activations", False, "Keep each rank's 1/T of what a checkpointed region saves, T the "
            "tensor ranks of the mpu given to deepspeed.checkpointing.configure (all-gathered back for the "
            "recomputation; a tensor T does not divide stays whole); no effect without one."),
    boolean("cpu_checkpointing", False, "Keep what a checkpointed region saves for backward in host memory "
            "(DeepSpeed: only with partition_activations; zero: on its own too)."),
    boolean("contiguous_memory_optimization", False, "Copy partitioned activations into one buffer (needs "
            "partition_activations and number_checkpoints; accepted, no effect: each share is its own tensor)."),
    integer("number_checkpoints", None, "Checkpointed regions per forward (for "
            "contiguous_memory_optimization).", minimum=1, maximum=10 ** 6, nullable=True),
    boolean("synchronize_checkpoint_boundary", False, "Synchronize the GPU at each region's start and end."),
    boolean("profile", False, "Print each region's forward and recomputation time on rank 0."),
))

# --------------------------------------------------------------------------- pipeline

# Read by zero.pipe's PipelineEngine (docs/PARALLELISM.md). DeepSpeed 0.19's pipeline keys
# (runtime/config.py get_pipeline_config, runtime/pipe/engine.py) as its engine reads them.
_MODULE_DECIDES = "DeepSpeed's engine does not read it either: the PipelineModule's argument "
PIPELINE = Block("pipeline", "Pipeline parallelism (zero.pipe.PipelineModule models; "
                 "docs/PARALLELISM.md).", (
    choice("schedule", "1f1b", ("1f1b", "gpipe"), "zero only: the order of a batch's micro-batches "
            "on each stage: \"1f1b\" (DeepSpeed's TrainSchedule: at most stages - stage_id "
            "micro-batches of activations held) or \"gpipe\" (every forward, then every backward: "
            "all of them held). Both give the same result. Case-insensitive.", ignore_case=True),
    integer("activation_checkpoint_interval", 0, "Layers per recomputed chunk; above 0 it is "
            "set on the PipelineModule when the engine is built (as DeepSpeed's engine does), "
            "0 keeps the module's own.", minimum=0, maximum=10 ** 6),
    boolean("use_reentrant", None, "DeepSpeed's choice of reentrant or non-reentrant "
            "recomputation. zero's pipeline recomputes through torch's non-reentrant checkpoint "
            "either way (the same gradients; the reentrant form gives none to a chunk whose input "
            "needs none), unless the module was given its own activation_checkpoint_func, which "
            "stays (DeepSpeed replaces even that by its non_reentrant_checkpoint for false).",
            nullable=True),
    integer("stages", None, _MODULE_DECIDES + "num_stages decides. Accepted, no effect.",
            minimum=1, maximum=10 ** 6, nullable=True, auto="the module's", default_doc='"auto"'),
    Key("partition", STR, "best", _MODULE_DECIDES + "partition_method decides. Accepted, "
        "no effect."),
    boolean("seed_layers", False, _MODULE_DECIDES + "seed_layers decides. Accepted, no effect."),
    boolean("pipe_partitioned", True, "DeepSpeed: with tensor parallelism, each tensor rank "
            "sends its 1/T of the activations between stages. zero sends them whole (the same "
            "result). Accepted, no effect."),
    boolean("grad_partitioned", True, "The same for the gradients sent back. Accepted, no "
            "effect."),
))

# --------------------------------------------------------------------------- tensor_parallel

# DeepSpeed 0.19: runtime/tensor_parallel/config.py (TPTrainingConfig). Read by zero.initialize
# (zero/tp/setup.py, docs/PARALLELISM.md).
TENSOR_PARALLEL = Block("tensor_parallel", "AutoTP tensor parallelism (zero.tp; "
                        "docs/PARALLELISM.md).", (
    integer("autotp_size", 0, "Tensor-parallel size: initialize() splits the model's attention and "
            "MLP linears over this many ranks (zero.tp.auto_tp) and runs ZeRO stage 0-2 over the "
            "world / autotp_size data-parallel ranks. 0 or 1: off. Must divide the world size. With a "
            "PipelineModule the topology's tensor (model) size sets it: leave it out or equal.",
            minimum=0, maximum=MAX_BUFFERS),
    unsupported(BOOL, "tp_overlap_comm", False, "Overlap the tensor-parallel all-reduces with "
                 "compute."),
    unsupported(OBJECT, "partition_config", None, "Custom AutoTP partition rules "
                 "(layer_specs).", nullable=True),
    unsupported(STR, "preset_model", None, "A built-in AutoTP preset (llama, bloom, ...).",
                 nullable=True),
    unsupported(OBJECT, "tp", None, "Inference tensor-parallel settings (tp_size, "
                 "tp_grain_size, mpu, tp_group).", nullable=True),
    unsupported(BOOL, "keep_module_on_host", False, "Keep checkpoint tensors on the host while "
                 "loading."),
    unsupported(BOOL, "replace_with_kernel_inject", False, "Inject inference kernels."),
))

_AUTOEP_ROUTING = "AutoEP here keeps the model's own router (its softmax, top-k and " \
    "normalisation): only the default, which takes them from the model, is accepted."
EXPERT_PARALLEL = Block("expert_parallel", "AutoEP, DeepSpeed's automatic expert parallelism "
                        "for Hugging Face MoE models (zero/moe/auto_ep.py; docs/PARALLELISM.md).", (
    boolean("enabled", False, "Split the experts of each Hugging Face sparse MoE block (Mixtral, "
            "Qwen2-MoE, Qwen3-MoE: stacked gate_up_proj / down_proj experts) over autoep_size ranks "
            "when the engine is built; the tokens go to their experts' ranks by all-to-all."),
    integer("autoep_size", 1, "Expert-parallel size: each rank holds num_experts / autoep_size of "
            "every block's experts. Must divide the world size and each block's expert count; 1 "
            "keeps every expert on every rank.", minimum=1, maximum=MAX_BUFFERS),
    choice("preset_model", None, ("mixtral", "qwen3_moe"), "The model family (DeepSpeed's "
            "presets; qwen3_moe covers Qwen2-MoE too). Null: from the model's config.model_type.",
            nullable=True, unsupported_choices=("qwen3_5_moe", "deepseek_v2", "deepseek_v3",
                                                "minimax_m3")),
    Key("moe_layer_pattern", STR, None, "A regular expression the MoE blocks' module names match "
        "whole (default: model\\.layers\\.\\d+\\.mlp); a block is a module with a `gate` "
        "router and `experts` holding 3-D gate_up_proj and down_proj.", nullable=True),
    boolean("use_grouped_mm", True, "DeepSpeed's grouped GEMM for the experts. zero runs each "
            "local expert's matmuls in turn, as Hugging Face's own loop does: accepted, no effect."),
    boolean("disable_triton_grouped_mm", False, "DeepSpeed's Triton grouped GEMM switch: "
            "accepted, no effect."),
    unsupported(INT, "expert_tensor_parallel_size", 1, "Expert tensor parallelism."),
    unsupported(BOOL, "validate_folding_routing", False, "AutoEP + AutoTP folding checks."),
    unsupported(BOOL, "async_split_plan", False, "Asynchronous all-to-all split planning."),
    unsupported(STR, "expert_pattern", None, "The experts' attribute name.", nullable=True),
    unsupported(STR, "router_pattern", None, "The router's attribute name.", nullable=True),
    unsupported(BOOL, "route_norm", None, _AUTOEP_ROUTING, nullable=True),
    unsupported(FLOAT, "route_scale", 1.0, _AUTOEP_ROUTING),
    unsupported(CHOICE, "score_apply", "auto", "Weights applied before or after the experts.",
                 choices=("auto", "pre", "post")),
    unsupported(CHOICE, "combine_impl", "auto", "DeepSpeed's combine kernel.",
                 choices=("auto", "weighted_sum", "fused_weighted_sum", "legacy_bmm")),
    unsupported(CHOICE, "row_weighting_impl", "auto", "DeepSpeed's row weighting kernel.",
                 choices=("auto", "eager", "fused")),
    unsupported(CHOICE, "gate_up_impl", "separate", "DeepSpeed's gate/up matmul layout.",
                 choices=("separate", "fused")),
    unsupported(CHOICE, "comm_backend", "comm", "DeepEP dispatch.", choices=("comm", "deepep")),
    unsupported(INT, "comm_num_sm", 12, "DeepEP's SMs."),
    unsupported(INT, "comm_qp_margin", 4, "DeepEP's queue pairs."),
    unsupported(INT, "comm_max_tokens_per_rank", 0, "DeepEP's buffer size."),
    unsupported(INT, "num_expert_groups", None, "Group-limited routing.", nullable=True),
    unsupported(INT, "num_limited_groups", None, "Group-limited routing.", nullable=True),
    unsupported(CHOICE, "score_func", "auto", _AUTOEP_ROUTING,
                 choices=("auto", "softmax", "sigmoid")),
    unsupported(STR, "top_k", "auto", _AUTOEP_ROUTING),
    unsupported(FLOAT, "load_balance_coeff", None, "Bias-based load balancing.", nullable=True),
    unsupported(STR, "routed_scaling_factor", "auto", _AUTOEP_ROUTING),
    unsupported(STR, "expert_w1", None, "Custom expert weight names.", nullable=True),
    unsupported(STR, "expert_w2", None, "Custom expert weight names.", nullable=True),
    unsupported(STR, "expert_w3", None, "Custom expert weight names.", nullable=True),
    unsupported(STR, "num_experts_attr", None, "The config attribute of the expert count.",
                 nullable=True),
    unsupported(STR, "top_k_attr", None, "The config attribute of top-k.", nullable=True),
    unsupported(BOOL, "has_shared_experts", None, "Shared experts are the model's own block's "
                 "(kept as they are).", nullable=True),
    unsupported(STR, "shared_experts_pattern", None, "Shared experts' attribute name.",
                 nullable=True),
    unsupported(STR, "shared_experts_gate_pattern", None, "Shared experts' gate name.",
                 nullable=True),
    unsupported(STR, "expert_activation", None, "The experts' activation is the model's own.",
                 nullable=True),
))

# --------------------------------------------------------------------------- monitoring

# DeepSpeed 0.19: monitor/config.py, profiling/constants.py, comm/constants.py. zero/monitor/
# writes what each block asks for (docs/MONITORING.md).
_JOB_NAME = "DeepSpeedJobName"


def _monitor_dir_keys(what):
    return (
        boolean("enabled", False, f"Write {what}."),
        Key("output_path", STR, "", "Folder of the job folder (\"\": the working directory).",
            default_doc="\"\""),
        Key("job_name", STR, _JOB_NAME, "Name of the folder inside output_path the files go to."),
    )


TENSORBOARD = Block("tensorboard", "DeepSpeed's TensorBoard monitor: rank 0 writes event files to "
                    "output_path/job_name (needs the tensorboard package).",
                    _monitor_dir_keys("TensorBoard event files"))
CSV_MONITOR = Block("csv_monitor", "DeepSpeed's CSV monitor: rank 0 writes one file per scalar to "
                    "output_path/job_name.", _monitor_dir_keys("CSV files"))
WANDB = Block("wandb", "DeepSpeed's Weights & Biases monitor (needs the wandb package; WANDB_MODE=offline "
              "writes locally).", (
    boolean("enabled", False, "Log to Weights & Biases from rank 0."),
    Key("group", STR, None, "Run group.", nullable=True),
    Key("team", STR, None, "Team (wandb's entity).", nullable=True),
    Key("project", STR, "deepspeed", "Project."),
))
COMET = Block("comet", "DeepSpeed's Comet monitor (needs comet_ml >= 3.41.0; online false writes an "
              "offline experiment).", (
    boolean("enabled", False, "Log to Comet from rank 0."),
    integer("samples_log_interval", 100, "Log a scalar again only after this many more samples.", minimum=1,
            maximum=MAX_INT64),
    Key("project", STR, None, "Comet project (else COMET_PROJECT_NAME or .comet.config).", nullable=True),
    Key("workspace", STR, None, "Comet workspace (else COMET_WORKSPACE).", nullable=True),
    Key("api_key", STR, None, "Comet API key (else COMET_API_KEY).", nullable=True),
    Key("experiment_name", STR, None, "Experiment name.", nullable=True),
    Key("experiment_key", STR, None, "Key of the experiment to log to.", nullable=True),
    Key("online", BOOL, None, "false: an offline experiment on disk (null: comet_ml's default, online).",
        nullable=True),
    choice("mode", None, ("get", "create", "get_or_create"), "How the experiment is started (null: "
            "comet_ml's default, get_or_create).", nullable=True),
))
COMM_OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast")
TIMERS_THROUGHPUT = Block("timers.throughput", "engine.tput_timer, DeepSpeed's ThroughputTimer: samples per "
                          "second, printed every steps_per_print steps (zero/monitor/throughput.py).", (
    boolean("enabled", True, "Time the steps; false: the timer counts nothing and avg_samples_per_sec() is -inf, "
            "as DeepSpeed's."),
    boolean("synchronized", True, "Synchronize the GPU before reading the clock (exact step times; false saves "
            "the synchronization)."),
))
TIMERS = Block("timers", "DeepSpeed's timers.", (
    nested("throughput", TIMERS_THROUGHPUT, "The throughput timer (table below)."),
))

COMMS_LOGGER = Block("comms_logger", "DeepSpeed's communication logger: every collective the engine "
                     "issues, with size, latency and bandwidth; the summary at the end "
                     "(deepspeed.comm.log_summary()).", (
    boolean("enabled", False, "Record the engine's collectives."),
    boolean("verbose", False, "Print each collective as it completes (rank 0)."),
    boolean("prof_all", True, "Record every kind of collective (false: only those in prof_ops)."),
    Key("prof_ops", STRINGS, (), "With prof_all false: the collectives to record.", choices=COMM_OPS,
        default_doc="[]"),
    boolean("debug", False, "Name each record after what the engine was doing (forward, backward, step, "
            "control) as well as the collective."),
))
FLOPS_PROFILER = Block("flops_profiler", "DeepSpeed's FLOPs profiler (counts from "
                       "torch.utils.flop_counter): one forward profiled on rank 0, printed at the "
                       "end of that step.", (
    boolean("enabled", False, "Profile one step."),
    number("recompute_fwd_factor", 0.0, "Fraction of the forward recomputed in the backward (activation "
           "checkpointing), for the backward FLOPs.", minimum=0, maximum=1),
    integer("profile_step", 1, "The step whose forward is profiled (counted from 0: 1 is the second step).",
            minimum=0, maximum=MAX_STEPS),
    integer("module_depth", -1, "Depth of the module tree printed (-1: all).", minimum=-1, maximum=1000),
    integer("top_modules", 1, "Modules listed per depth in the aggregated profile.", minimum=1, maximum=10 ** 6),
    boolean("detailed", True, "Print the per-module tree."),
    Key("output_file", STR, None, "File the profile is written to (null: standard output).", nullable=True),
))

HYBRID_ENGINE = Block("hybrid_engine", "DeepSpeed's hybrid engine (RLHF: one actor that trains and "
                     "generates; DeepSpeed-Chat's --enable_hybrid_engine). zero builds what it does for "
                     "generation: at stage 3 the model's generate runs with every parameter gathered once, "
                     "not layer by layer for every token (zero/hybrid_engine.py). DeepSpeed's inference "
                     "kernels and tensor-parallel generation are not built: the model's own generate runs.", (
    boolean("enabled", False, "Take over the model's generate (engine.module.generate), as DeepSpeed does."),
    integer("max_out_tokens", 512, "DeepSpeed: its inference kernels' workspace, in tokens (zero runs the "
            "model's own generate: no workspace, no effect).", minimum=1, maximum=MAX_ELEMENTS),
    unsupported(INT, "inference_tp_size", 1, "Tensor-parallel generation over this many ranks."),
    boolean("release_inference_cache", False, "DeepSpeed: free its inference workspace after each generate "
            "(zero keeps none: no effect)."),
    boolean("pin_parameters", True, "At stage 3: gather every parameter once for a whole generate (true), or "
            "layer by layer at every forward, ZeRO-3's usual way (false)."),
    integer("tp_gather_partition_size", 8, "DeepSpeed: layers gathered at once for tensor-parallel generation "
            "(only with inference_tp_size > 1: no effect).", minimum=1, maximum=MAX_BUFFERS),
    unsupported(BOOL, "enable_cuda_graph", False, "CUDA graphs for the decode steps."),
))

# DeepSpeed 0.19: runtime/torch_autocast.py, read by zero/autocast.py.
# DeepSpeed's DtypeEnum spellings of each training dtype
FP32_DTYPES = ("torch.float32", "fp32", "float32", "float")
BF16_DTYPES = ("torch.bfloat16", "bf16", "bfloat16")
FP16_AUTOCAST_DTYPES = ("torch.float16", "fp16", "float16", "half")
DTYPE_SPELLINGS = {"fp32": FP32_DTYPES, "bf16": BF16_DTYPES, "fp16": FP16_AUTOCAST_DTYPES}
DEEPSPEED_DTYPES = FP32_DTYPES + BF16_DTYPES + FP16_AUTOCAST_DTYPES
AUTOCAST_DTYPES = BF16_DTYPES + FP16_AUTOCAST_DTYPES
DEFAULT_LOWER_PRECISION_SAFE_MODULES = ("torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d",
                                        "torch.nn.Conv3d")

DATA_TYPES = Block("data_types", "DeepSpeed's data types block.", (
    choice("grad_accum_dtype", None, DEEPSPEED_DTYPES,
            "The dtype gradients accumulate in (DeepSpeed's spellings). Null: the training dtype. "
            "\"fp32\" under bf16/fp16 training: the gradient buffers (stages 0-1 the whole gradients, "
            "stages 2-3 each rank's shard) are fp32; each micro-step's 16-bit gradient is added in, "
            "reductions still go in the training dtype (or communication_data_type). Any other dtype "
            "than these is refused.", nullable=True),
    unsupported(CHOICE, "param_dtype", None, "The dtype the module's parameters are cast to.",
                 choices=DEEPSPEED_DTYPES, nullable=True),
    choice("buffer_dtype", None, DEEPSPEED_DTYPES,
           "The dtype every floating-point buffer of the model is cast to, as DeepSpeed's. Null: "
           "buffers keep their dtype (a rotary inv_freq stays fp32 under bf16), but for batch and "
           "instance norms' running statistics, which follow their weights. Set it to the "
           "training dtype for a model that adds a buffer to its activations (a positional "
           "encoding `x + self.pe`), whose forward otherwise mixes dtypes.", nullable=True),
    unsupported(STR, "keep_in_fp32_modules", "auto", "Modules whose parameters stay fp32."),
))

TORCH_AUTOCAST = Block("torch_autocast", "torch.autocast mixed precision, DeepSpeed's: the engine's "
                       "forward runs under torch.autocast, the parameters keep their dtype (fp32 "
                       "unless bf16/fp16 is enabled too), and the optimizer steps them directly "
                       "(zero/autocast.py).", (
    boolean("enabled", False, "Run the forward under torch.autocast. A torch.autocast the script opens "
            "around the forward gives way to this block, as in DeepSpeed (and is switched off inside the "
            "forward when this is false)."),
    choice("dtype", None, AUTOCAST_DTYPES, "The autocast dtype (DeepSpeed's spellings). Null: the "
            "device's autocast default (bf16 on a CPU, fp16 on a GPU). fp16 scales the loss dynamically, "
            "with the fp16 block's loss-scale keys.", nullable=True),
    Key("lower_precision_safe_modules", STRINGS, DEFAULT_LOWER_PRECISION_SAFE_MODULES,
        "Module classes by import path whose parameters' gradients DeepSpeed reduces in the autocast "
        "dtype. zero checks that each imports and reduces every gradient in communication_data_type "
        "(default: the parameters' own dtype, so more exact sums and twice the bytes of DeepSpeed's for "
        "these; set communication_data_type to \"bf16\" to halve all of them)."),
))

# --------------------------------------------------------------------------- checkpoint

CHECKPOINT = Block("checkpoint", "DeepSpeed's checkpoint options (zero's checkpoint files: "
                   "docs/ARCHITECTURE.md, zero/checkpoint.py).", (
    choice("tag_validation", "Warn", ("Ignore", "Warn", "Fail"), "What save_checkpoint does when the "
            "ranks were given different tags (every rank's tag is compared first): \"Warn\" logs the "
            "ranks' tags on rank 0 and saves under rank 0's tag; \"Fail\" raises CheckpointError on every "
            "rank and saves nothing; \"Ignore\" saves under rank 0's tag without a word (zero writes one "
            "directory per tag, so the ranks always agree on one). Case-insensitive, as in DeepSpeed.",
            ignore_case=True),
    boolean("load_universal", False, "DeepSpeed: load a universal checkpoint (converted by "
            "ds_to_universal.py): without a tag, load_checkpoint reads it from `latest_universal`, as "
            "DeepSpeed does, and resumes it at this world size and stage (fp32 master, Adam's moments "
            "and step, scheduler, counters; of one model part: a tensor- or pipeline-split one is "
            "refused). zero's own checkpoints load at any world size and stage already: where there "
            "is no latest_universal, true loads through `latest` as usual."),
    boolean("use_node_local_storage", False, "save_dir is storage local to each node, not shared: as in "
            "DeepSpeed, the local rank 0 of every node writes model_states.pt (and here also the manifest, "
            "`latest` and zero_to_fp32.py) into its node's copy, every rank its own shard file; each node then "
            "loads from its own copy (the same world size and rank placement). A save_dir that two nodes see "
            "is an error at save naming the ranks. Loading at another world size, or exporting, needs every "
            "rank's zero_rank*_optim_states.pt in one directory: copy the nodes' files together. Not built "
            "with pipeline stages or tensor parallelism (an error at save)."),
    unsupported(BOOL, "checkpoint_serialization", True, "DeepSpeed: torch.save's zipfile format (false: "
                 "its legacy format); zero always writes the zipfile format."),
    Key("writer", SECTION, None, "DeepSpeed's FastPersist checkpoint writer.", supported=False, nullable=True),
    Key("parallel_write", SECTION, None, "DeepSpeed: pipeline stages write in parallel.", supported=False,
        nullable=True),
))

# --------------------------------------------------------------------------- top level

_BATCH_AUTO = "derive it from the other two batch keys (same as leaving it out)"

TOP = Block("", "Top-level keys.", (
    integer("train_batch_size", None, "Samples per optimizer step, over all ranks = micro batch * accumulation "
            "steps * world size.", minimum=1, maximum=MAX_SAMPLES, nullable=True, auto=_BATCH_AUTO, default_doc="derived"),
    integer("train_micro_batch_size_per_gpu", None, "Samples per rank per forward/backward.", minimum=1,
            maximum=MAX_SAMPLES, nullable=True, auto=_BATCH_AUTO, default_doc="derived"),
    integer("gradient_accumulation_steps", None, "Micro batches accumulated per optimizer step.", minimum=1,
            maximum=MAX_SAMPLES, nullable=True, auto=_BATCH_AUTO, default_doc="derived"),
    integer("data_parallel_size", None, "The data-parallel ranks (world / tensor size, or the mpu's data "
            "group), as DeepSpeed's AutoTP example writes it: checked against the run, never set. DeepSpeed "
            "reads it only beside sequence_parallel_size (its sequence mesh) and otherwise ignores it; zero "
            "refuses a value that is not the run's.",
            minimum=1, maximum=MAX_SAMPLES, nullable=True),
    nested("optimizer", OPTIMIZER, "Optimizer (table below). Absent or null: client optimizer.", optional=True),
    nested("scheduler", SCHEDULER, "Learning-rate schedule (table below). Absent or null: none.",
           optional=True),
    nested("fp16", FP16, "fp16 mixed precision (table below)."),
    nested("bf16", BF16, "bf16 mixed precision (table below)."),
    number("gradient_clipping", 1.0, "Clip the global gradient norm to this value; 0 disables clipping "
           "(DeepSpeed 0.19.8's default, as its docs say; older DeepSpeed releases defaulted to 0).",
           minimum=0, maximum=1e6),
    nested("zero_optimization", ZERO_OPTIMIZATION, "ZeRO settings (table below)."),
    nested("aio", AIO, "Asynchronous I/O (table below)."),
    integer("steps_per_print", None, "Log progress every N steps. Null (DeepSpeed's current code default; its docs "
            "say 10) or Infinity: never (so is any huge value; up to 2**63-1).", minimum=1, maximum=MAX_INT64,
            nullable=True),
    boolean("memory_breakdown", False, "As DeepSpeed: rank 0 prints see_memory_usage (the device allocator's "
            "bytes, the host's used memory) before and after each forward, backward and step. zero's own, per "
            "category: memory_report."),
    boolean("wall_clock_breakdown", False, "Time forward, backward (and its gradient reduction) and step, and "
            "print the breakdown on rank 0 every steps_per_print steps (every step when that is null)."),
    boolean("dataloader_drop_last", False, "The loader initialize() builds from training_data (and "
            "engine.deepspeed_io's) drops each rank's last micro-batch when it is short, as DeepSpeed's."),
    boolean("prescale_gradients", False, "DeepSpeed: divide the gradients before the all-reduce instead of "
            "after. Accepted; no effect in zero: its reductions average (NCCL's ReduceOp AVG; on gloo "
            "a sum, then a division), the same mean either way."),
    number("gradient_predivide_factor", 1.0, "DeepSpeed: divide the gradients by this before the all-reduce "
           "(the rest after). Accepted; no effect in zero (see prescale_gradients).",
           minimum=0, minimum_exclusive=True),
    choice("communication_data_type", None, ("fp16", "bf16", "fp32"), "dtype the gradients are reduced "
            "in (null: the training dtype). Another dtype reduces a copy of each unit in a bucket of it "
            "(e.g. fp32 sums of bf16 gradients: twice the buckets and the gradient traffic) and casts the "
            "result back, at every stage. Case-insensitive.", nullable=True, ignore_case=True),
    boolean("use_data_before_expert_parallelism", False, "DeepSpeed-MoE's rank layout (zero.moe, "
            "docs/PARALLELISM.md): false, expert-parallel groups of consecutive ranks and each expert "
            "data-parallel group strided (\"E + D\"); true, the reverse (\"D + E\")."),
    integer("sequence_parallel_size", 1, "DeepSpeed-Ulysses: the ranks that split each sample's sequence, groups "
            "of consecutive ranks (docs/PARALLELISM.md). Their attention layers exchange heads for sequence "
            "(deepspeed.sequence.layer.DistributedAttention); ZeRO shards over every rank and averages the "
            "gradients over every rank, as DeepSpeed's ZeRO-3 does (its stages 0-2 take size times that); the "
            "batch keys count the world / size replicas. "
            "DeepSpeed builds the groups from this key only beside data_parallel_size (or from an mpu, as "
            "Ulysses for Hugging Face passes one); zero builds them from it alone too. Not with pipeline or "
            "tensor parallelism.", minimum=1, maximum=MAX_SAMPLES),
    choice("seq_parallel_communication_data_type", "fp32", ("fp16", "bf16", "fp32"), "With sequence "
            "parallelism, the dtype the gradients are reduced in, in place of communication_data_type "
            "(as in DeepSpeed, whose default sums 16-bit gradients in fp32 then; a different "
            "communication_data_type beside it is refused).", ignore_case=True),
    boolean("zero_allow_untested_optimizer", False, "As in DeepSpeed: ZeRO stages 1-3 run a client optimizer "
            "zero does not build itself (not Adam, AdamW, SGD, Adagrad, Lion or Lamb: torch's RMSprop, NAdam, ..., "
            "transformers' Adafactor) only when this is true; the HF Trainer sets it when it builds its optimizer."),
    boolean("zero_force_ds_cpu_optimizer", True, "Accepted for compatibility; no effect in zero (there is no "
            "DeepSpeed CPU optimizer to force)."),
    nested("memory_report", MEMORY_REPORT, "zero's memory report (table below)."),
    choice("nonfinite_gradients", "skip", ("skip", "raise"), "zero only: what a step whose gradients "
            "(or their global norm) are not finite does, in every precision: \"skip\" skips it on every "
            "rank and counts it (as fp16's loss scaler does), \"raise\" stops training with "
            "FloatingPointError on every rank. The weights never take a NaN or Inf."),
    nested("checkpoint", CHECKPOINT, "Checkpoint options (table below)."),
    nested("activation_checkpointing", ACTIVATION_CHECKPOINTING, "deepspeed.checkpointing's options "
           "(table below)."),
    nested("pipeline", PIPELINE, "Pipeline parallelism (table below)."),
    nested("tensor_parallel", TENSOR_PARALLEL, "AutoTP tensor parallelism (table below)."),
    nested("expert_parallel", EXPERT_PARALLEL, "AutoEP expert parallelism for Hugging Face MoE "
           "models (table below)."),
    nested("tensorboard", TENSORBOARD, "TensorBoard monitor (table below)."),
    nested("csv_monitor", CSV_MONITOR, "CSV monitor (table below)."),
    nested("wandb", WANDB, "Weights & Biases monitor (table below)."),
    nested("comet", COMET, "Comet monitor (table below)."),
    nested("comms_logger", COMMS_LOGGER, "Communication logger (table below)."),
    nested("flops_profiler", FLOPS_PROFILER, "FLOPs profiler (table below)."),
    nested("timers", TIMERS, "DeepSpeed's timers (table below)."),
    nested("data_types", DATA_TYPES, "DeepSpeed's data types (table below)."),
    nested("hybrid_engine", HYBRID_ENGINE, "RLHF hybrid engine: generate at stage 3 (table below)."),
    nested("torch_autocast", TORCH_AUTOCAST, "torch.autocast mixed precision (table below)."),
    # DeepSpeed scalar keys zero does not implement: only their defaults are accepted.
    unsupported(BOOL, "sparse_gradients", False, "CSR gradients for sparse embeddings."),
    unsupported(BOOL, "disable_allgather", False, "Disable all-gather."),
    unsupported(BOOL, "dump_state", False, "Dump DeepSpeed state at init."),
    unsupported(BOOL, "graph_harvesting", False, "CUDA graph harvesting."),
    unsupported(INT, "vocabulary_size", None, "Only used by DeepSpeed for an alignment warning.", nullable=True),
    unsupported(CHOICE, "gradient_allreduce_op", "mean", "Average or sum gradients.", choices=("mean", "sum")),
    unsupported(BOOL, "managed_gradient_accumulation", True, "Engine-managed accumulation boundaries."),
    # DeepSpeed sections zero does not implement: accepted only while inert.
    section("sparse_attention", "Sparse attention kernels."),
    section("amp", "NVIDIA Apex AMP."),
    section("compression_training", "Compression (quantization/pruning) training."),
    section("quantize_training", "MoQ quantized training."),
    section("data_efficiency", "Data efficiency library."),
    section("curriculum_learning", "Legacy curriculum learning."),
    section("progressive_layer_drop", "Progressive layer drop."),
    section("eigenvalue", "Eigenvalue computation."),
    section("autotuning", "Autotuner."),
    section("elasticity", "Elastic training."),
    section("compile", "torch.compile / DeepCompile."),
    section("nebula", "Nebula checkpointing."),
    section("weight_quantization", "Weight quantization."),
))

# --------------------------------------------------------------------------- renamed keys

# Old names of top-level blocks that DeepSpeed reads, silently, when the new name is absent
# (its get_bfloat16_config); DeepSpeed-Chat still writes "bfloat16". zero reads them the same
# way, and refuses a config that gives both names.
ALIASES = {"bfloat16": "bf16"}

# Spellings DeepSpeed still accepts (with a deprecation warning) or that belong
# elsewhere: zero rejects them with the fix instead of guessing.
RENAMED = {
    "zero_optimization.cpu_offload": "deprecated in DeepSpeed; use \"offload_optimizer\": {\"device\": \"cpu\"}",
    "zero_optimization.cpu_offload_param": "deprecated in DeepSpeed; use \"offload_param\": {\"device\": \"cpu\"}",
    "zero_optimization.cpu_offload_use_pin_memory": "deprecated in DeepSpeed; set \"pin_memory\" inside "
                                                    "offload_optimizer / offload_param",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "deprecated in DeepSpeed; rename to "
                                                                  "\"stage3_gather_16bit_weights_on_model_save\"",
    "aio.thread_count": "DeepSpeed's old name; rename to \"intra_op_parallelism\"",
    "optimizer.params.max_grad_norm": "not an optimizer parameter (DeepSpeed rejects it too); use the top-level "
                                      "\"gradient_clipping\"",
}
# DeepSpeed's zero_optimization fields whose documented names carry "stage3_" (its pydantic
# aliases) are read under the field name too (populate_by_name): DeepSpeedExamples' HF AutoTP
# config writes "gather_16bit_weights_on_model_save". zero reads both names, and refuses a config
# that gives both. zero's own stage-3 keys keep the prefix.
ZERO_OWN_STAGE3_KEYS = ("stage3_max_inflight_gathers",)
ZERO_OPTIMIZATION_ALIASES = {
    key.name[len("stage3_"):]: key.name for key in ZERO_OPTIMIZATION.keys
    if key.name.startswith("stage3_") and key.name not in ZERO_OWN_STAGE3_KEYS}
RENAMED["zero_optimization.max_inflight_gathers"] = "rename to \"stage3_max_inflight_gathers\""


# --------------------------------------------------------------------------- walking the schema


def iter_blocks(block=TOP):
    """Yield every Block reachable from `block` (itself first), each variant once."""
    yield block
    for key in block.keys:
        if key.block is not None:
            yield from iter_blocks(key.block)
        if key.variants is not None:
            seen = set()
            for variant in key.variants.values():
                if id(variant) not in seen:
                    seen.add(id(variant))
                    yield from iter_blocks(variant)


def auto_keys():
    """Dotted paths of the keys that accept "auto"."""
    paths = []
    for block in iter_blocks():
        for key in block.keys:
            if key.auto is not None:
                paths.append(f"{block.path}.{key.name}" if block.path else key.name)
    return paths
