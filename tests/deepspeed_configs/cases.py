"""DeepSpeed JSON configs whose resolved values tests/test_config_deepspeed.py compares: each
config at a data-parallel world size, and the values read back, named by their config keys.
Shared by make.py (the real DeepSpeed's DeepSpeedConfig writes expected.json) and the test
(zero.config.load_config on the same)."""

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}
CASES = {
    # the batch trio: DeepSpeed infers the missing one, or checks the three agree
    "micro-and-gas": ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 4),
    "batch-and-micro": ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2),
    "batch-and-gas": ({"train_batch_size": 24, "gradient_accumulation_steps": 2}, 3),
    "batch-only": ({"train_batch_size": 16}, 4),
    "micro-only": ({"train_micro_batch_size_per_gpu": 3}, 2),
    "all-three": ({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3,
                   "gradient_accumulation_steps": 2}, 2),
    # every default, at each stage and precision
    "stage0-fp32": ({"train_micro_batch_size_per_gpu": 1, "optimizer": ADAMW}, 2),
    "stage1-bf16": ({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                     "zero_optimization": {"stage": 1}}, 2),
    "stage2-fp16": ({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                     "zero_optimization": {"stage": 2}}, 2),
    "stage2-offload": ({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
                       2),
    "stage3": ({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                "zero_optimization": {"stage": 3}}, 2),
    "stage3-offload": ({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                              "offload_param": {"device": "cpu"}}}, 2),
    "fp16-static": ({"train_micro_batch_size_per_gpu": 1,
                     "fp16": {"enabled": True, "loss_scale": 128}}, 1),
    "explicit": ({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
                  "steps_per_print": 7, "prescale_gradients": True,
                  "communication_data_type": "fp32", "bf16": {"enabled": True},
                  "zero_optimization": {"stage": 2, "overlap_comm": True,
                                        "reduce_bucket_size": 1000, "allgather_bucket_size": 2000,
                                        "contiguous_gradients": False}}, 2),
}

# block path -> DeepSpeed's pydantic model of it (module, class): make.py writes every field's
# default, and zero's schema default of the same key must equal it
MODELS = {
    "zero_optimization": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    "zero_optimization.offload_optimizer": ("deepspeed.runtime.zero.offload_config",
                                            "DeepSpeedZeroOffloadOptimizerConfig"),
    "zero_optimization.offload_param": ("deepspeed.runtime.zero.offload_config",
                                        "DeepSpeedZeroOffloadParamConfig"),
    "zero_optimization.leaf_module": ("deepspeed.runtime.zero.leaf_module_config",
                                      "DeepSpeedZeroLeafModuleConfig"),
    "bf16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "fp16": ("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    "tensorboard": ("deepspeed.monitor.config", "TensorBoardConfig"),
    "wandb": ("deepspeed.monitor.config", "WandbConfig"),
    "csv_monitor": ("deepspeed.monitor.config", "CSVConfig"),
    "comet": ("deepspeed.monitor.config", "CometConfig"),
    "comms_logger": ("deepspeed.comm.config", "CommsLoggerConfig"),
}

# config key -> how DeepSpeed's DeepSpeedConfig holds it
DEEPSPEED = {
    "train_batch_size": lambda c: c.train_batch_size,
    "train_micro_batch_size_per_gpu": lambda c: c.train_micro_batch_size_per_gpu,
    "gradient_accumulation_steps": lambda c: c.gradient_accumulation_steps,
    "gradient_clipping": lambda c: c.gradient_clipping,
    "steps_per_print": lambda c: c.steps_per_print,
    "prescale_gradients": lambda c: c.prescale_gradients,
    "gradient_predivide_factor": lambda c: c.gradient_predivide_factor,
    "communication_data_type": lambda c: _dtype_key(c.communication_data_type),
    "wall_clock_breakdown": lambda c: c.wall_clock_breakdown,
    "zero_allow_untested_optimizer": lambda c: c.zero_allow_untested_optimizer,
    "fp16.enabled": lambda c: c.float16_config.enabled,
    "fp16.loss_scale": lambda c: c.float16_config.loss_scale,
    "fp16.initial_scale_power": lambda c: c.float16_config.initial_scale_power,
    "fp16.loss_scale_window": lambda c: c.float16_config.loss_scale_window,
    "fp16.hysteresis": lambda c: c.float16_config.hysteresis,
    "fp16.consecutive_hysteresis": lambda c: c.float16_config.consecutive_hysteresis,
    "fp16.min_loss_scale": lambda c: c.float16_config.min_loss_scale,
    "bf16.enabled": lambda c: c.bfloat16_config.enabled,
    "zero_optimization.stage": lambda c: c.zero_config.stage,
    "zero_optimization.contiguous_gradients": lambda c: c.zero_config.contiguous_gradients,
    "zero_optimization.reduce_scatter": lambda c: c.zero_config.reduce_scatter,
    "zero_optimization.reduce_bucket_size": lambda c: c.zero_config.reduce_bucket_size,
    "zero_optimization.allgather_bucket_size": lambda c: c.zero_config.allgather_bucket_size,
    "zero_optimization.overlap_comm": lambda c: c.zero_config.overlap_comm,
    "zero_optimization.round_robin_gradients": lambda c: c.zero_config.round_robin_gradients,
    "zero_optimization.sub_group_size": lambda c: c.zero_config.sub_group_size,
    "zero_optimization.stage3_prefetch_bucket_size": lambda c: c.zero_config.prefetch_bucket_size,
    "zero_optimization.stage3_param_persistence_threshold":
        lambda c: c.zero_config.param_persistence_threshold,
    "zero_optimization.stage3_model_persistence_threshold":
        lambda c: c.zero_config.model_persistence_threshold,
    "zero_optimization.stage3_max_live_parameters": lambda c: c.zero_config.max_live_parameters,
    "zero_optimization.stage3_max_reuse_distance": lambda c: c.zero_config.max_reuse_distance,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save":
        lambda c: c.zero_config.gather_16bit_weights_on_model_save,
    "zero_optimization.zero_hpz_partition_size": lambda c: c.zero_config.zero_hpz_partition_size,
    "zero_optimization.offload_optimizer.device":
        lambda c: _device(c.zero_config.offload_optimizer),
    "zero_optimization.offload_optimizer.pin_memory":
        lambda c: _field(c.zero_config.offload_optimizer, "pin_memory"),
    "zero_optimization.offload_optimizer.buffer_count":
        lambda c: _field(c.zero_config.offload_optimizer, "buffer_count"),
    "zero_optimization.offload_optimizer.ratio":
        lambda c: _field(c.zero_config.offload_optimizer, "ratio"),
    "zero_optimization.offload_param.device": lambda c: _device(c.zero_config.offload_param),
    "zero_optimization.offload_param.pin_memory":
        lambda c: _field(c.zero_config.offload_param, "pin_memory"),
    "zero_optimization.offload_param.buffer_count":
        lambda c: _field(c.zero_config.offload_param, "buffer_count"),
    "zero_optimization.offload_param.buffer_size":
        lambda c: _field(c.zero_config.offload_param, "buffer_size"),
    "zero_optimization.offload_param.max_in_cpu":
        lambda c: _field(c.zero_config.offload_param, "max_in_cpu"),
}


def _dtype_key(dtype):
    """DeepSpeed holds a torch dtype; the config key's spelling."""
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    return None if dtype is None else names[str(dtype)]


def _device(block):
    return "none" if block is None else str(getattr(block.device, "value", block.device))


def _field(block, name):
    return None if block is None else getattr(block, name)


class DataParallel:
    """The stand-in mpu that says a case's data-parallel world size."""

    def __init__(self, world):
        self.world = world

    def get_data_parallel_world_size(self):
        return self.world


def read_all(config_class) -> dict:
    """{case: {key: value}}: each case parsed by `config_class` (DeepSpeed's DeepSpeedConfig,
    or zero's stand-in) at its data-parallel size, read back through DEEPSPEED (an enum as its
    value). Run in a process group: DeepSpeed's asks it for the rank."""
    found = {}
    for name, (config, data_parallel) in CASES.items():
        resolved = config_class(dict(config), mpu=DataParallel(data_parallel))
        values = {}
        for key, read in DEEPSPEED.items():
            value = read(resolved)
            values[key] = getattr(value, "value", value) if value is not None else None
        found[name] = values
    return found
