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

from .boundary import fp32_grads

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class EngineGetters:
    """Mixed into ZeroEngine, which sets `config`, `stage`, `dtype` and `optimizer`."""

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
        return _DTYPES[configured] if configured else self.dtype

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

    # ---- optimizer and scheduler ---------------------------------------------------------
    def optimizer_name(self) -> str | None:
        """The client optimizer's class name, else the config's optimizer type in lower case
        (DeepSpeed's "adamw" for "AdamW")."""
        client = self.optimizer.spec.client_name
        if client is not None:
            return client
        return self.config.optimizer.type.lower() if self.config.optimizer is not None else None

    def optimizer_params(self) -> dict | None:
        return dict(self.config.optimizer.params) if self.config.optimizer is not None else None

    def scheduler_name(self) -> str | None:
        return self.config.scheduler.type if self.config.scheduler is not None else None

    def scheduler_params(self) -> dict | None:
        return dict(self.config.scheduler.params) if self.config.scheduler is not None else None

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

    def zero_allow_untested_optimizer(self) -> bool:
        return self.config.zero_allow_untested_optimizer

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self.config.zero_force_ds_cpu_optimizer
