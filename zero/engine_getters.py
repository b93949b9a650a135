"""DeepSpeed's engine getters over the config, read from zero's validated one
(zero/config/model.py): `engine.zero_optimization_partition_weights()`,
`engine.gradient_clipping()`, `engine.get_batch_info()` and the other configuration questions
scripts, Lightning, Accelerate and RLHF libraries ask a DeepSpeedEngine (the ones about the
run's state, such as was_step_applied(), are the engine's own). Names, arguments and results
are DeepSpeed 0.19.8's (runtime/engine.py); an offload getter returns zero's offload block,
whose fields carry DeepSpeed's key names, or None without offload (DeepSpeed returns a block
with device "none" when the config names one)."""
from __future__ import annotations

import torch

from .autocast import DTYPES as AUTOCAST_DTYPES
from .autocast import module_class
from .boundary import fp32_grads
from .config import schema
from .model_dtype import PRECISION_DTYPES
from .optimizer import deepspeed_optimizer_name


def _only_value(block: schema.Block, name: str):
    """A DeepSpeed key zero accepts at its default alone (schema `supported=False`): what the
    config can hold there."""
    key = block.get(name)
    assert key is not None and not key.supported, name
    return key.default


class EngineGetters:
    """Mixed into ZeroEngine, which sets `config`, `stage`, `dtype` and `optimizer`."""

    @property
    def _config(self):
        """DeepSpeed's `engine._config`, a DeepSpeedConfig, which scripts read although it is
        private (DeepSpeedExamples: `engine._config.train_micro_batch_size_per_gpu`): the
        engine's config as zero.compat's DeepSpeedConfig shows it, built at the first use and
        again after the config changed (set_train_batch_size)."""
        built = self.__dict__.get("_deepspeed_config")
        if built is None or built[0] is not self.config:
            from .compat.deepspeed.runtime.config import of_engine

            try:
                built = self._deepspeed_config = (self.config, of_engine(self))
            except AttributeError as error:  # not the module's attribute (engine __getattr__)
                raise RuntimeError(f"zero: building engine._config failed: {error}") from error
        return built[1]

    # ---- batch and precision -------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def get_batch_info(self) -> tuple[int, int, int]:
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        return (self.train_batch_size(), self.train_micro_batch_size_per_gpu(),
                self.gradient_accumulation_steps())

    def bfloat16_enabled(self) -> bool:
        return self.config.precision == "bf16"

    def fp16_enabled(self) -> bool:
        return self.config.precision == "fp16"

    def fp16_master_weights_and_gradients(self) -> bool:
        return bool(self.config.fp16.fp16_master_weights_and_grads)

    def bf16_master_weights_and_gradients(self) -> bool:
        return bool(self.config.bf16.bf16_master_weights_and_grads)

    def bf16_optimizer_states(self) -> bool:
        return bool(self.config.bf16.bf16_optimizer_states)

    def fp16_auto_cast(self) -> bool:
        return self.config.fp16.auto_cast

    def dynamic_loss_scale_args(self) -> dict:
        """The fp16 block's dynamic-scaling arguments under DeepSpeed's loss-scaler names
        (whether or not fp16 or dynamic scaling is on, as DeepSpeed)."""
        fp16 = self.config.fp16
        return {"init_scale": 2 ** fp16.initial_scale_power,
                "scale_window": fp16.loss_scale_window, "delayed_shift": fp16.hysteresis,
                "consecutive_hysteresis": fp16.consecutive_hysteresis,
                "min_scale": fp16.min_loss_scale}

    def torch_autocast_enabled(self) -> bool:
        return self.config.torch_autocast.enabled

    def torch_autocast_dtype(self) -> torch.dtype | None:
        """The torch_autocast block's dtype as given; None when it names none."""
        dtype = self.config.torch_autocast.dtype
        return AUTOCAST_DTYPES[dtype] if dtype is not None else None

    def torch_autocast_lower_precision_safe_modules(self) -> list[str]:
        """The block's names as given; unset, DeepSpeed's default classes by their defining
        modules' names ("torch.nn.modules.linear.Linear")."""
        given = (self.config.raw.get("torch_autocast") or {}).get("lower_precision_safe_modules")
        if given is not None:
            return list(given)
        defaults = map(module_class, schema.DEFAULT_LOWER_PRECISION_SAFE_MODULES)
        return [f"{cls.__module__}.{cls.__name__}" for cls in defaults]

    def loss_scale(self) -> float:
        """DeepSpeed's: the config's fp16.loss_scale (0: dynamic). The scale in use now is
        engine.optimizer.cur_scale."""
        return self.config.fp16.loss_scale

    def dynamic_loss_scale(self) -> bool:
        return self.config.fp16.loss_scale == 0

    def initial_dynamic_scale(self) -> int:
        return 2 ** self.config.fp16.initial_scale_power

    def get_data_types(self) -> tuple[torch.dtype, torch.dtype]:
        """(model dtype, gradient-accumulation dtype): the model's, or fp32 where
        data_types.grad_accum_dtype asks a 16-bit model for it (boundary.fp32_grads)."""
        return (self.dtype, torch.float32 if fp32_grads(self.config) else self.dtype)

    @property
    def communication_data_type(self) -> torch.dtype:
        """A property, as DeepSpeed's: the configured dtype, else the model's (read-only
        here: the reducers are built with it)."""
        configured = self.config.communication_data_type
        return PRECISION_DTYPES[configured] if configured else self.dtype

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def postscale_gradients(self) -> bool:
        return not self.config.prescale_gradients

    def gradient_predivide_factor(self) -> float:
        return self.config.gradient_predivide_factor

    def steps_per_print(self):
        return self.config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return self.config.wall_clock_breakdown

    def memory_breakdown(self) -> bool:
        return self.config.memory_breakdown

    def get_wall_clock_timers(self) -> dict[str, float]:
        """DeepSpeed's: with wall_clock_breakdown, the last optimizer step's milliseconds by
        timer name (fwd, bwd, bwd_inner, bwd_allreduce, step; DeepSpeed adds its *_microstep
        timers); {} otherwise."""
        return dict(self.watch.wall_clock_ms)

    def dump_state(self) -> bool:
        return _only_value(schema.TOP, "dump_state")

    def dataloader_drop_last(self) -> bool:
        return self.config.dataloader_drop_last

    def managed_gradient_accumulation(self) -> bool:
        return _only_value(schema.TOP, "managed_gradient_accumulation")

    # DeepSpeed's libraries zero does not build: their blocks are accepted only while off
    def autotuning_enabled(self) -> bool:
        return False

    def data_efficiency_enabled(self) -> bool:
        return False

    def data_sampling_enabled(self) -> bool:
        return False

    def curriculum_learning_enabled(self) -> bool:
        return False

    def random_ltd_enabled(self) -> bool:
        return False

    # ---- checkpoints and profiling ---------------------------------------------------------
    def checkpoint_tag_validation_enabled(self) -> bool:
        return self.config.checkpoint.tag_validation != "Ignore"

    def checkpoint_tag_validation_fail(self) -> bool:
        return self.config.checkpoint.tag_validation == "Fail"

    def use_node_local_storage(self) -> bool:
        return self.config.checkpoint.use_node_local_storage

    def load_universal_checkpoint(self) -> bool:
        return self.config.checkpoint.load_universal

    def aio_config(self) -> dict:
        """The aio block's values (NVMe swap I/O) under DeepSpeed's names."""
        aio = self.config.aio
        return {"block_size": aio.block_size, "queue_depth": aio.queue_depth,
                "intra_op_parallelism": aio.intra_op_parallelism,
                "single_submit": aio.single_submit, "overlap_events": aio.overlap_events,
                "use_gds": _only_value(schema.AIO, "use_gds")}

    def checkpoint_writer_enabled(self) -> bool:
        return False  # the checkpoint block's writer (FastPersist) is accepted only unset

    def flops_profiler_enabled(self) -> bool:
        return self.config.flops_profiler.enabled

    def flops_profiler_profile_step(self) -> int:
        return self.config.flops_profiler.profile_step

    def flops_profiler_module_depth(self) -> int:
        return self.config.flops_profiler.module_depth

    def flops_profiler_top_modules(self) -> int:
        return self.config.flops_profiler.top_modules

    def flops_profiler_detailed(self) -> bool:
        return self.config.flops_profiler.detailed

    def flops_profiler_output_file(self) -> str | None:
        return self.config.flops_profiler.output_file

    def flops_profiler_recompute_fwd_factor(self) -> float:
        return self.config.flops_profiler.recompute_fwd_factor

    def autotp_size(self) -> int:
        return self.config.tensor_parallel.autotp_size

    # ---- optimizer and scheduler ---------------------------------------------------------
    def optimizer_name(self) -> str | None:
        """The client optimizer's class name, else the config's optimizer type as DeepSpeed
        names it: its own optimizers' in lower case ("adamw" for "AdamW"), others as written
        ("SGD")."""
        client = self.optimizer.spec.client_name
        if client is not None:
            return client
        return deepspeed_optimizer_name(self.config.written_block("optimizer")[0])

    def optimizer_params(self) -> dict | None:
        """The optimizer block's params as the config writes them (no defaults filled in),
        as DeepSpeed; None without a block or params."""
        params = self.config.written_block("optimizer")[1]
        return None if params is None else dict(params)

    def scheduler_name(self) -> str | None:
        return self.config.scheduler.type if self.config.scheduler is not None else None

    def scheduler_params(self) -> dict | None:
        params = self.config.written_block("scheduler")[1]
        return None if params is None else dict(params)

    def get_mom(self) -> list:
        """Each group's momentum (SGD, RMSprop) or betas (the rest), as DeepSpeed."""
        key = "momentum" if self.optimizer_name() in ("SGD", "RMSprop") else "betas"
        return [group.get(key, 0.0) for group in self.optimizer.param_groups]

    # ---- ZeRO ----------------------------------------------------------------------------
    def zero_optimization(self) -> bool:
        return self.stage > 0

    def zero_optimization_stage(self) -> int:
        return self.stage

    def zero_optimization_partition_gradients(self) -> bool:
        return self.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.stage >= 3

    def is_first_weights_partition_group(self) -> bool:
        return self.zero_optimization_partition_weights()

    def zero_offload_optimizer(self):
        """The offload_optimizer block (`.device`, `.pin_memory`, ...); None without one."""
        block = self.config.zero_optimization.offload_optimizer
        return block if block.enabled else None

    def zero_offload_param(self):
        block = self.config.zero_optimization.offload_param
        return block if block.enabled else None

    def zero_use_cpu_optimizer(self) -> bool:
        return self.config.zero_optimization.offload_optimizer.device in ("cpu", "nvme")

    def zero_cpu_offload(self) -> bool:
        return self.config.zero_optimization.offload_optimizer.device == "cpu"

    def zero_nvme_offload_optimizer(self) -> bool:
        return self.config.zero_optimization.offload_optimizer.device == "nvme"

    def zero_partial_offload(self) -> float:
        return self.config.zero_optimization.offload_optimizer.ratio

    def zero_sub_group_size(self) -> int:
        return self.config.zero_optimization.sub_group_size

    def zero_reduce_bucket_size(self) -> int:
        return self.config.zero_optimization.reduce_bucket_size

    def zero_allgather_bucket_size(self) -> int:
        return self.config.zero_optimization.allgather_bucket_size

    def zero_overlap_comm(self) -> bool:
        return self.config.zero_optimization.overlap_comm

    def zero_contiguous_gradients(self) -> bool:
        return self.config.zero_optimization.contiguous_gradients

    def zero_reduce_scatter(self) -> bool:
        return self.config.zero_optimization.reduce_scatter

    def zero_round_robin_gradients(self) -> bool:
        return self.config.zero_optimization.round_robin_gradients

    def zero_max_live_parameters(self) -> int:
        return self.config.zero_optimization.stage3_max_live_parameters

    def zero_max_reuse_distance(self) -> int:
        return self.config.zero_optimization.stage3_max_reuse_distance

    def zero_prefetch_bucket_size(self) -> int:
        return self.config.zero_optimization.stage3_prefetch_bucket_size

    def zero_param_persistence_threshold(self) -> int:
        return self.config.zero_optimization.stage3_param_persistence_threshold

    def zero_model_persistence_threshold(self) -> int:
        return self.config.zero_optimization.stage3_model_persistence_threshold

    def zero_module_granularity_threshold(self) -> int:
        return self.config.zero_optimization.stage3_module_granularity_threshold

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return bool(self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def zero_hpz_partition_size(self) -> int:
        return self.config.zero_optimization.zero_hpz_partition_size

    def zero_quantized_weights(self) -> bool:
        return self.config.zero_optimization.zero_quantized_weights

    def zero_quantized_gradients(self) -> bool:
        return self.config.zero_optimization.zero_quantized_gradients

    def zero_allgather_partitions(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "allgather_partitions")

    def zero_allgather_sequential(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "stage3_allgather_sequential")

    def zero_elastic_checkpoint(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "elastic_checkpoint")

    def zero_ignore_unused_parameters(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "ignore_unused_parameters")

    def zero_legacy_stage1(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "legacy_stage1")

    def zero_load_from_fp32_weights(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "load_from_fp32_weights")

    def zero_parameter_alignment(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "parameter_alignment")

    def zero_quantized_nontrainable_weights(self) -> bool:
        return bool(self.config.zero_optimization.zero_quantized_nontrainable_weights)

    def zero_log_trace_cache_warnings(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "log_trace_cache_warnings")

    def zero_multi_rank_bucket_allreduce(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "use_multi_rank_bucket_allreduce")

    def zero_compute_grad_norm(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "compute_grad_norm")

    def zero_save_muon_momentum_buffer_in_memory(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "save_muon_momentum_buffer_in_memory")

    def is_sanity_checks_enabled(self) -> bool:
        return _only_value(schema.ZERO_OPTIMIZATION, "enable_sanity_checks")

    def cpuadam_cores_perc(self) -> float:
        """offload_optimizer's (SuperOffload's; accepted at its default alone); without an
        offload_optimizer block DeepSpeed's getter answers 0.9."""
        block = (self.config.raw.get("zero_optimization") or {}).get("offload_optimizer")
        return _only_value(schema.OFFLOAD_OPTIMIZER, "cpuadam_cores_perc") \
            if block is not None else 0.9

    def super_offload(self) -> bool:
        return _only_value(schema.OFFLOAD_OPTIMIZER, "super_offload")

    def zero_allow_untested_optimizer(self) -> bool:
        return self.config.zero_allow_untested_optimizer

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self.config.zero_force_ds_cpu_optimizer
