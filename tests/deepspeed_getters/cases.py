"""The engines whose getters tests/test_engine_getters.py compares: each a config, a client
optimizer or none, and the micro-steps to run. Shared by make.py (the real DeepSpeed writes
expected.json) and the test (zero on the same)."""
import torch

GETTERS = [
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "get_batch_info", "bfloat16_enabled", "fp16_enabled", "loss_scale", "dynamic_loss_scale",
    "initial_dynamic_scale", "get_data_types", "communication_data_type", "gradient_clipping",
    "postscale_gradients", "gradient_predivide_factor", "steps_per_print",
    "wall_clock_breakdown", "optimizer_name", "optimizer_params", "get_mom", "scheduler_name",
    "scheduler_params",
    "zero_optimization", "zero_optimization_stage", "zero_optimization_partition_gradients",
    "zero_optimization_partition_weights", "is_first_weights_partition_group",
    "zero_offload_optimizer", "zero_offload_param", "zero_use_cpu_optimizer",
    "zero_cpu_offload", "zero_partial_offload", "zero_sub_group_size",
    "zero_reduce_bucket_size", "zero_allgather_bucket_size", "zero_overlap_comm",
    "zero_contiguous_gradients", "zero_reduce_scatter", "zero_round_robin_gradients",
    "zero_max_live_parameters", "zero_max_reuse_distance", "zero_prefetch_bucket_size",
    "zero_param_persistence_threshold", "zero_model_persistence_threshold",
    "zero_module_granularity_threshold", "zero_gather_16bit_weights_on_model_save",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "get_data_parallel_rank", "get_model_parallel_rank", "get_tensor_parallel_rank",
    "fp16_auto_cast", "dynamic_loss_scale_args", "torch_autocast_enabled",
    "torch_autocast_dtype", "torch_autocast_lower_precision_safe_modules", "memory_breakdown",
    "dump_state", "dataloader_drop_last", "managed_gradient_accumulation",
    "autotuning_enabled", "data_efficiency_enabled", "data_sampling_enabled",
    "curriculum_learning_enabled", "random_ltd_enabled", "checkpoint_tag_validation_enabled",
    "checkpoint_tag_validation_fail", "use_node_local_storage", "checkpoint_writer_enabled",
    "flops_profiler_enabled", "flops_profiler_profile_step", "flops_profiler_module_depth",
    "flops_profiler_top_modules", "flops_profiler_detailed", "flops_profiler_output_file",
    "flops_profiler_recompute_fwd_factor", "autotp_size", "zero_allgather_partitions",
    "zero_allgather_sequential", "zero_elastic_checkpoint", "zero_ignore_unused_parameters",
    "zero_legacy_stage1", "zero_load_from_fp32_weights", "zero_parameter_alignment",
    "zero_quantized_nontrainable_weights", "zero_log_trace_cache_warnings",
    "zero_multi_rank_bucket_allreduce", "zero_compute_grad_norm",
    "zero_save_muon_momentum_buffer_in_memory", "is_sanity_checks_enabled",
    "cpuadam_cores_perc", "super_offload", "load_universal_checkpoint", "aio_config",
]
PROPERTIES = ["communication_data_type"]  # read, not called (a property in DeepSpeed too)
# engine._config (a DeepSpeedConfig), private in DeepSpeed but read by scripts
CONFIG_ATTRIBUTES = [
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "steps_per_print", "zero_enabled", "zero_optimization_stage",
    "optimizer_name", "optimizer_params", "scheduler_name", "scheduler_params",
    "bfloat16_config.enabled", "float16_config.enabled", "zero_config.stage",
    "zero_config.reduce_bucket_size", "zero_config.overlap_comm", "wall_clock_breakdown",
    "dataloader_drop_last", "world_size"]

_ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.8, 0.99], "weight_decay": 0.01}}
CASES = {
    "stage2-bf16-offload": {
        "config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                   "gradient_clipping": 0.5, "bf16": {"enabled": True}, "optimizer": _ADAMW,
                   "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
                   "zero_optimization": {"stage": 2, "reduce_bucket_size": 3000,
                                         "offload_optimizer": {"device": "cpu",
                                                               "pin_memory": True}}},
        "client_optimizer": None, "micro_steps": 4},
    "stage3-fp32": {
        "config": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                   "steps_per_print": 1000, "optimizer": _ADAMW,
                   "checkpoint": {"tag_validation": "Fail", "use_node_local_storage": True,
                                  "load_universal": True},
                   "aio": {"block_size": 262144, "queue_depth": 16, "single_submit": True},
                   "flops_profiler": {"enabled": False, "profile_step": 3, "module_depth": 2,
                                      "top_modules": 2, "detailed": False},
                   "torch_autocast": {"enabled": False, "dtype": "bfloat16"},
                   "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 20000,
                                         "stage3_max_reuse_distance": 500,
                                         "stage3_prefetch_bucket_size": 1000,
                                         "stage3_param_persistence_threshold": 10,
                                         "stage3_gather_16bit_weights_on_model_save": True,
                                         "sub_group_size": 100000}},
        "client_optimizer": None, "micro_steps": 2},
    "stage1-sgd-client": {
        "config": {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
                   "zero_allow_untested_optimizer": True,
                   "fp16": {"enabled": False, "initial_scale_power": 12,
                            "loss_scale_window": 100, "hysteresis": 3, "min_loss_scale": 2},
                   "checkpoint": {"tag_validation": "Ignore"}},
        "client_optimizer": "SGD", "micro_steps": 2},
    # a torch type in the config keeps its spelling in optimizer_name (DeepSpeed lower-cases
    # only its own optimizers' names), and get_mom reads its momentum
    "stage1-sgd-config": {
        "config": {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
                   "zero_allow_untested_optimizer": True,
                   "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}},
        "client_optimizer": None, "micro_steps": 2},
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def client_optimizer(name, model):
    if name == "SGD":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return None


def value(result):
    """A getter's result as JSON: an offload block by its device and pin_memory, a dtype by
    name, tuples as lists, a function by its name (DeepSpeed's get_batch_info returns its
    three getters uncalled)."""
    if result is None or isinstance(result, (bool, int, float, str)):
        return result
    if callable(result):
        return {"function": result.__name__}
    if isinstance(result, torch.dtype):
        return str(result)
    if isinstance(result, (list, tuple)):
        return [value(item) for item in result]
    if isinstance(result, dict):
        return {key: value(item) for key, item in result.items()}
    device = getattr(result, "device", None)
    return {"device": str(getattr(device, "value", device)), "pin_memory": result.pin_memory}


def run(engine, micro_steps):
    """The getters' values, then was_step_applied, global_steps and global_samples after each
    of `micro_steps` steps."""
    values = {}
    for name in GETTERS + PROPERTIES:
        try:
            found = getattr(engine, name)
            values[name] = value(found if name in PROPERTIES else found())
        except Exception as error:  # noqa: BLE001 - DeepSpeed's own getters can fail
            values[name] = {"error": f"{type(error).__name__}: {error}"}
    for name in CONFIG_ATTRIBUTES:
        try:
            found = engine._config
            for part in name.split("."):
                found = getattr(found, part)
            values[f"_config.{name}"] = value(found)
        except Exception as error:  # noqa: BLE001
            values[f"_config.{name}"] = {"error": f"{type(error).__name__}: {error}"}
    applied, counters = [], []
    for step in range(micro_steps):
        torch.manual_seed(step)
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16).to(engine.device)
        out = engine(x.to(next(engine.module.parameters()).dtype))
        engine.backward(out.float().pow(2).mean())
        engine.step()
        applied.append(engine.was_step_applied())
        counters.append([engine.global_steps, engine.global_samples])
    values["was_step_applied"] = applied
    values["global_steps_and_samples"] = counters
    norm = engine.get_global_grad_norm()  # its type (DeepSpeed: a tensor; None at stage 0)
    values["global_grad_norm_type"] = None if norm is None else type(norm).__name__
    return values


def answers(initialize):
    """Every case's values on the engines `initialize` (DeepSpeed's or zero's) builds."""
    found = {}
    for name, case in CASES.items():
        model = make_model()
        engine, _, _, _ = initialize(
            model=model, config=case["config"], model_parameters=model.parameters(),
            optimizer=client_optimizer(case["client_optimizer"], model))
        found[name] = run(engine, case["micro_steps"])
        engine.destroy()
    return found
