"""Tests for zero.config: the strict, DeepSpeed-compatible JSON config."""

import copy
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from zero.config import ConfigError, ZeroConfig, load_config
from zero.config import docs, model, schema
from zero.config.validate import _describe_range, _show

ROOT = Path(__file__).resolve().parents[1]
BASE = {"train_micro_batch_size_per_gpu": 2}
ALL = set(schema.ALL_FEATURES)


def merged(base, patch):
    """Deep-merge `patch` into a copy of `base` (dicts merge, other values replace)."""
    out = copy.deepcopy(base)
    for name, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = merged(out[name], value)
        else:
            out[name] = copy.deepcopy(value)
    return out


def with_(**patch):
    return merged(BASE, patch)


def errors_of(config, world_size=2, **kwargs):
    with pytest.raises(ConfigError) as info:
        load_config(config, world_size, **kwargs)
    return list(info.value.errors)


def errors_at(errors, path):
    return [e for e in errors if e.startswith(path + " = ") or e.startswith(path + ":")]


# --------------------------------------------------------------------------- bad configs

ADAM = {"type": "Adam", "params": {"lr": 1e-3}}

# (id, config, key path the error must name, fragment of the message / fix)
BAD = [
    ("top-level typo", with_(steps_per_prnt=10), "steps_per_prnt", "did you mean 'steps_per_print'?"),
    ("nested typo", with_(zero_optimization={"reduce_bucket_sise": 2e5}),
     "zero_optimization.reduce_bucket_sise", "did you mean 'reduce_bucket_size'?"),
    ("typo of a key from another block", with_(reduce_bucket_sise=2e5), "reduce_bucket_sise",
     "did you mean 'zero_optimization.reduce_bucket_size'?"),
    ("stage3 key at top level", with_(stage3_max_live_parameters=1e9), "stage3_max_live_parameters",
     "belongs under zero_optimization"),
    ("zero key at top level", with_(reduce_bucket_size=2e5), "reduce_bucket_size", "belongs under zero_optimization"),
    ("adam_w_mode beside params", with_(optimizer={"type": "Adam", "adam_w_mode": True}), "optimizer.adam_w_mode",
     "belongs under optimizer.params"),
    ("unknown optimizer", with_(optimizer={"type": "Adamm"}), "optimizer.type", "did you mean 'Adam'?"),
    ("optimizer not built", with_(optimizer={"type": "OneBitAdam"}), "optimizer.type", "not supported yet"),
    ("optimizer type missing", with_(optimizer={"params": {"lr": 1e-3}}), "optimizer.type",
     "required key is missing"),
    ("scheduler wrong case", with_(scheduler={"type": "warmuplr"}), "scheduler.type", "did you mean 'WarmupLR'?"),
    ("range test step size", with_(scheduler={"type": "LRRangeTest",
                                              "params": {"lr_range_test_step_size": 0}}),
     "scheduler.params.lr_range_test_step_size", "must be >= 1"),
    ("scheduler required param", with_(scheduler={"type": "WarmupDecayLR"}), "scheduler.params.total_num_steps",
     "required key is missing"),
    ("scheduler param typo", with_(scheduler={"type": "WarmupLR", "params": {"warmup_steps": 10}}),
     "scheduler.params.warmup_steps", "did you mean 'warmup_num_steps'?"),
    ("warmup_type", with_(scheduler={"type": "WarmupLR", "params": {"warmup_type": "cosine"}}),
     "scheduler.params.warmup_type", "must be one of \"log\", \"linear\""),
    ("fp16 and bf16", with_(fp16={"enabled": True}, bf16={"enabled": True}), "bf16.enabled",
     "cannot both be enabled"),
    ("stage out of range", with_(zero_optimization={"stage": 4}), "zero_optimization.stage", ">= 0 and <= 3"),
    ("param offload below stage 3", with_(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}),
     "zero_optimization.offload_param.device", "parameter offload needs stage 3"),
    ("delayed update with partial offload", with_(zero_optimization={"stage": 2, "offload_optimizer": {
        "device": "cpu", "ratio": 0.5, "delayed_update": True}}),
     "zero_optimization.offload_optimizer.delayed_update", "needs the whole step on the host"),
    ("gradients on the device without offload", with_(zero_optimization={"stage": 2, "offload_optimizer": {
        "grads_on_device": True}}),
     "zero_optimization.offload_optimizer.grads_on_device", "set device to \"cpu\" or \"nvme\""),
    ("cpu offload at stage 0", with_(zero_optimization={"offload_optimizer": {"device": "cpu"}}),
     "zero_optimization.offload_optimizer.device", "optimizer offload needs ZeRO stage 1, 2 or 3"),
    ("nvme params with one buffer", with_(zero_optimization={"stage": 3, "offload_param": {
        "device": "nvme", "nvme_path": "/x", "buffer_count": 1}}),
     "zero_optimization.offload_param.buffer_count", "at least 2 host buffers"),
    ("nvme params without a path", with_(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}),
     "zero_optimization.offload_param.nvme_path", "required when device is \"nvme\""),
    ("aio block not O_DIRECT aligned", with_(aio={"block_size": 5000}), "aio.block_size", "multiple of 4096"),
    ("aio queue too deep", with_(aio={"queue_depth": 5000}), "aio.queue_depth", "<= 4096"),
    ("gpudirect storage", with_(aio={"use_gds": True}), "aio.use_gds", "not supported"),
    ("offload device typo", with_(zero_optimization={"offload_optimizer": {"device": "gpu"}}),
     "zero_optimization.offload_optimizer.device", "must be one of \"none\", \"cpu\", \"nvme\""),

    ("stage3 in-flight gathers", with_(zero_optimization={"stage": 3, "stage3_max_inflight_gathers": 0}),
     "zero_optimization.stage3_max_inflight_gathers", "must be >= 1"),
    ("bool for int", with_(train_micro_batch_size_per_gpu=True), "train_micro_batch_size_per_gpu",
     "expected an integer, got boolean"),
    ("fractional int", with_(zero_optimization={"reduce_bucket_size": 2.5}), "zero_optimization.reduce_bucket_size",
     "fractional part"),
    ("quoted number", with_(zero_optimization={"reduce_bucket_size": "5e8"}),
     "zero_optimization.reduce_bucket_size", "write the number without quotes: 5e8"),
    ("quoted bool", with_(zero_optimization={"overlap_comm": "true"}), "zero_optimization.overlap_comm",
     "write true without quotes"),
    ("int for bool", with_(wall_clock_breakdown=1), "wall_clock_breakdown", "expected true or false"),
    ("negative clipping", with_(gradient_clipping=-1.0), "gradient_clipping", "must be >= 0"),
    ("null not allowed", with_(gradient_clipping=None), "gradient_clipping", "null is not allowed"),
    ("non-finite", with_(optimizer={"type": "Adam", "params": {"lr": math.nan}}), "optimizer.params.lr",
     "finite"),
    ("auto where not accepted", with_(gradient_clipping="auto"), "gradient_clipping",
     "keys that accept \"auto\": train_batch_size"),
    ("auto optimizer param", with_(optimizer={"type": "AdamW", "params": {"lr": "auto"}}), "optimizer.params.lr",
     "\"auto\" is not accepted here"),
    ("auto enabled", with_(fp16={"enabled": "auto"}), "fp16.enabled", "\"auto\" is not accepted here"),
    ("one beta", with_(optimizer={"type": "Adam", "params": {"betas": [0.9]}}), "optimizer.params.betas",
     "two numbers"),
    ("beta of 1", with_(optimizer={"type": "Adam", "params": {"betas": [0.9, 1.0]}}), "optimizer.params.betas",
     "< 1"),
    ("active unsupported section", with_(amp={"enabled": True}), "amp", "not supported yet"),
    ("unknown pipeline schedule", with_(pipeline={"schedule": "zb"}), "pipeline.schedule", "1f1b"),
    ("checkpointing key misspelled", with_(activation_checkpointing={"cpu_checkpoint": True}),
     "activation_checkpointing.cpu_checkpoint", "cpu_checkpointing"),
    ("monitor key misspelled", with_(tensorboard={"enabled": True, "output_dir": "tb"}),
     "tensorboard.output_dir", "output_path"),
    ("unknown collective", with_(comms_logger={"enabled": True, "prof_ops": ["allreduce"]}),
     "comms_logger.prof_ops", "\"all_reduce\""),
    ("profile step negative", with_(flops_profiler={"enabled": True, "profile_step": -1}),
     "flops_profiler.profile_step", ">= 0"),
    ("unsupported scalar", with_(sparse_gradients=True), "sparse_gradients", "DeepSpeed's default false"),
    ("unsupported zero key", with_(zero_optimization={"mics_hierarchical_params_gather": True}),
     "zero_optimization.mics_hierarchical_params_gather", "not supported yet"),
    ("bf16 under both names", with_(bfloat16={"enabled": True}, bf16={"enabled": True}), "bfloat16",
     "keep one block"),
    ("deprecated cpu_offload", with_(zero_optimization={"cpu_offload": True}), "zero_optimization.cpu_offload",
     "\"offload_optimizer\": {\"device\": \"cpu\"}"),
    ("stage3 key under both names", with_(zero_optimization={
        "max_live_parameters": 1e9, "stage3_max_live_parameters": 1e9}),
     "zero_optimization.max_live_parameters", "keep one of the two"),
    ("zero's own stage3 key unprefixed", with_(zero_optimization={"max_inflight_gathers": 2}),
     "zero_optimization.max_inflight_gathers", "rename to \"stage3_max_inflight_gathers\""),
    ("aio thread_count", with_(aio={"thread_count": 1}), "aio.thread_count", "intra_op_parallelism"),
    ("max_grad_norm", with_(optimizer={"type": "AdamW", "params": {"max_grad_norm": 1.0}}),
     "optimizer.params.max_grad_norm", "gradient_clipping"),
    ("AdamW without w mode", with_(optimizer={"type": "AdamW", "params": {"adam_w_mode": False}}),
     "optimizer.params.adam_w_mode", "contradicts type \"AdamW\""),
    ("nesterov without momentum", with_(optimizer={"type": "SGD", "params": {"nesterov": True}}),
     "optimizer.params.nesterov", "momentum > 0"),
    ("batch not divisible", {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, "train_batch_size",
     "not divisible by train_micro_batch_size_per_gpu (4) * world_size (2) = 8; use a multiple of 8 (e.g. 24 or 32)"),
    ("batch trio disagrees", {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2}, "train_batch_size", "= 16"),
    ("no batch size", {"gradient_accumulation_steps": 4}, "train_batch_size", "no batch size given"),
    ("batch zero", {"train_batch_size": 0}, "train_batch_size", "must be >= 1"),
    ("comm dtype", with_(communication_data_type="fp8"), "communication_data_type", "must be one of"),
    ("memory report interval", with_(memory_report={"every_n_steps": 0}), "memory_report.every_n_steps",
     "must be >= 1"),
    ("memory report typo", with_(memory_report={"pth": "m.jsonl"}), "memory_report.pth", "did you mean 'path'?"),
    ("legacy zero bool", with_(zero_optimization=True), "zero_optimization", "expected an object"),
    ("min loss scale above initial", with_(fp16={"enabled": True, "initial_scale_power": 2, "min_loss_scale": 8}),
     "fp16.min_loss_scale", "larger than the initial dynamic loss scale"),
    ("steps_per_print zero", with_(steps_per_print=0), "steps_per_print", "must be >= 1"),
    ("Adam key under SGD", with_(optimizer={"type": "SGD", "params": {"betas": [0.9, 0.99]}}),
     "optimizer.params.betas", "not a parameter of this type; valid keys here: lr, momentum"),
    ("misplaced optimizer param", with_(lr=1e-3), "lr", "belongs under optimizer.params"),
    ("non-string key", with_(zero_optimization={1: 2}), "zero_optimization.1", "keys must be strings"),
    ("params not an object", with_(optimizer={"type": "Adam", "params": [1e-3]}), "optimizer.params",
     "expected an object"),
]


@pytest.mark.parametrize("config,path,fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_config_names_path_and_fix(config, path, fragment):
    errors = errors_of(config)
    at_path = errors_at(errors, path)
    assert at_path, f"no error at {path!r}: {errors}"
    assert any(fragment in e for e in at_path), f"{fragment!r} not in {at_path}"


def test_error_line_shows_value():
    (line,) = errors_of(with_(zero_optimization={"reduce_bucket_sise": 200000}))
    assert line == "zero_optimization.reduce_bucket_sise = 200000: unknown key; did you mean 'reduce_bucket_size'?"


def test_auto_key_list_is_printed_once():
    errors = errors_of(with_(gradient_clipping="auto", optimizer={"type": "AdamW", "params": {"lr": "auto"}}))
    first, second = errors_at(errors, "optimizer.params.lr")[0], errors_at(errors, "gradient_clipping")[0]
    assert "keys that accept \"auto\": train_batch_size" in first
    assert "accepted only by the keys listed above" in second


def test_all_errors_reported_together():
    config = {
        "train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
        "steps_per_prnt": 10,
        "zero_optimization": {"stage": 5, "reduce_bucket_sise": 1},
        "fp16": {"enabled": True, "hysteresis": 0},
        "bf16": {"enabled": True},
    }
    with pytest.raises(ConfigError) as info:
        load_config(config, 2)
    errors = info.value.errors
    for path in ("steps_per_prnt", "zero_optimization.stage", "zero_optimization.reduce_bucket_sise",
                 "fp16.hysteresis", "bf16.enabled", "train_batch_size"):
        assert errors_at(errors, path), f"{path} missing from {errors}"
    text = str(info.value).splitlines()
    assert text[0] == f"invalid zero config: {len(errors)} errors"
    assert len(text) == len(errors) + 1


def test_features_enable_gated_values_and_cross_checks():
    config = with_(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"},
                                      "stage3_max_live_parameters": 1e8,
                                      "offload_optimizer": {"device": "nvme"}})
    errors = errors_of(config, enabled_features=ALL)
    assert "parameter offload needs stage 3" in errors_at(errors, "zero_optimization.offload_param.device")[0]
    assert not errors_at(errors, "zero_optimization.stage3_max_live_parameters")  # ignored, see below
    assert not errors_at(errors, "zero_optimization.offload_optimizer.device")  # NVMe at stage 2 is fine
    assert "required when device is \"nvme\"" in errors_at(errors, "zero_optimization.offload_optimizer.nvme_path")[0]


# --------------------------------------------------------------------------- good configs


@pytest.mark.parametrize("batch,world_size,expected", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 1, (32, 4, 8)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (32, 4, 4)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 1, (32, 16, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 2, (24, 4, 3)),
    ({"train_batch_size": 16}, 4, (16, 4, 1)),
    ({"train_batch_size": 16}, 1, (16, 16, 1)),
    ({"train_micro_batch_size_per_gpu": 8}, 2, (16, 8, 1)),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2, (16, 4, 2)),
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"}, 2,
     (8, 4, 1)),
    ({"train_batch_size": 6.4e1, "train_micro_batch_size_per_gpu": 8}, 4, (64, 8, 2)),
])
def test_batch_trio(batch, world_size, expected):
    cfg = load_config(batch, world_size)
    got = (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)
    assert got == expected
    assert all(type(v) is int for v in got)


def test_defaults_are_deepspeed_code_defaults():
    cfg = load_config(BASE, 1)
    assert isinstance(cfg, ZeroConfig)
    assert cfg.optimizer is None and cfg.scheduler is None
    assert cfg.gradient_clipping == 1.0  # DeepSpeed 0.19.8 (tests/deepspeed_getters)
    assert cfg.steps_per_print is None
    assert cfg.wall_clock_breakdown is False and cfg.prescale_gradients is False
    assert cfg.gradient_predivide_factor == 1.0 and cfg.communication_data_type is None
    assert cfg.precision == "fp32"
    fp16 = cfg.fp16
    assert (fp16.enabled, fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis,
            fp16.consecutive_hysteresis, fp16.min_loss_scale) == (False, 0.0, 16, 1000, 2, False, 1.0)
    assert fp16.dynamic_loss_scale and fp16.initial_dynamic_scale == 65536.0
    assert cfg.bf16.enabled is False
    zero = cfg.zero_optimization
    assert zero.stage == 0
    assert zero.reduce_bucket_size == 500_000_000 and zero.allgather_bucket_size == 500_000_000
    assert zero.contiguous_gradients is True and zero.reduce_scatter is True
    assert zero.overlap_comm is False and zero.round_robin_gradients is False
    assert zero.stage3_prefetch_bucket_size == 50_000_000
    assert zero.stage3_param_persistence_threshold == 100_000
    assert zero.stage3_max_live_parameters == 1_000_000_000
    assert zero.stage3_max_reuse_distance == 1_000_000_000
    assert zero.stage3_gather_16bit_weights_on_model_save is False
    assert zero.sub_group_size == 1_000_000_000
    assert zero.offload_optimizer.device == "none" and not zero.offload_optimizer.enabled
    assert zero.offload_optimizer.buffer_count == 4 and zero.offload_optimizer.ratio == 1.0
    assert zero.offload_param.device == "none" and zero.offload_param.buffer_count == 5
    assert zero.offload_param.buffer_size == 100_000_000
    # The one deliberate difference: DeepSpeed's 1e9 would keep every shard below 1e9 elements
    # in host memory under zero's reading of max_in_cpu, i.e. treat "nvme" as "cpu".
    assert zero.offload_param.max_in_cpu == 0
    assert zero.offload_param.pin_memory is True and zero.offload_optimizer.pin_memory is True
    aio = cfg.aio
    assert (aio.block_size, aio.queue_depth, aio.intra_op_parallelism, aio.single_submit, aio.overlap_events) == \
        (1_048_576, 8, 1, False, True)
    assert cfg.memory_report.path is None and cfg.memory_report.every_n_steps is None
    assert cfg.zero_allow_untested_optimizer is False and cfg.zero_force_ds_cpu_optimizer is True
    assert cfg.enabled_features == schema.BUILT_FEATURES and cfg.world_size == 1


def test_overlap_comm_default_depends_on_stage():
    assert load_config(with_(zero_optimization={"stage": 2}), 2).zero_optimization.overlap_comm is False
    cfg = load_config(with_(zero_optimization={"stage": 3}), 2, enabled_features={"stage3"})
    assert cfg.zero_optimization.overlap_comm is True
    explicit = load_config(with_(zero_optimization={"stage": 3, "overlap_comm": False}), 2,
                           enabled_features={"stage3"})
    assert explicit.zero_optimization.overlap_comm is False


def test_auto_means_default_for_sizes():
    cfg = load_config(with_(zero_optimization={"reduce_bucket_size": "auto", "allgather_bucket_size": "auto",
                                               "stage3_prefetch_bucket_size": "auto", "overlap_comm": "auto"},
                            fp16={"loss_scale_window": "auto"}), 2)
    zero = cfg.zero_optimization
    assert zero.reduce_bucket_size == zero.allgather_bucket_size == 500_000_000
    assert zero.stage3_prefetch_bucket_size == 50_000_000 and zero.overlap_comm is False
    assert cfg.fp16.loss_scale_window == 1000


def test_integral_floats_become_ints():
    cfg = load_config(with_(zero_optimization={"reduce_bucket_size": 2e5, "allgather_bucket_size": 5e8}), 2)
    assert type(cfg.zero_optimization.reduce_bucket_size) is int
    assert cfg.zero_optimization.reduce_bucket_size == 200_000
    assert cfg.zero_optimization.allgather_bucket_size == 500_000_000


@pytest.mark.parametrize("optimizer,kind,decoupled,weight_decay", [
    ({"type": "adam"}, "Adam", True, 0.0),  # DeepSpeed: "Adam" with adam_w_mode (default true) is AdamW
    ({"type": "Adam", "params": {"adam_w_mode": False, "weight_decay": 0.1}}, "Adam", False, 0.1),
    ({"type": "ADAMW"}, "AdamW", True, 0.0),
    ({"type": "AdamW", "params": {"torch_adam": True}}, "AdamW", True, 0.01),  # torch.optim.AdamW default
    ({"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False}}, "Adam", False, 0.0),
    ({"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}}, "SGD", False, 0.0),
])
def test_optimizer_resolution(optimizer, kind, decoupled, weight_decay):
    opt = load_config(with_(optimizer=optimizer), 2).optimizer
    assert opt.type == kind
    assert opt.decoupled_weight_decay is decoupled
    assert opt.params["weight_decay"] == weight_decay


def test_adam_params_filled():
    opt = load_config(with_(optimizer={"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.99]}}), 2).optimizer
    assert dict(opt.params) == {"lr": 3e-4, "betas": (0.8, 0.99), "eps": 1e-8, "weight_decay": 0.0,
                                "adam_w_mode": True, "torch_adam": False, "fp32_optimizer_states": None,
                                "bias_correction": True}


def test_deepspeed_chats_config_is_read_as_deepspeed_reads_it():
    """DeepSpeed-Chat's get_train_ds_config writes the "bfloat16" block (DeepSpeed reads it when
    "bf16" is absent, without a word) and memory_efficient_linear false (zero runs torch's
    linear whatever the value), beside switched-off hybrid_engine and tensorboard blocks."""
    config = with_(bfloat16={"enabled": True},
                   zero_optimization={"stage": 2, "memory_efficient_linear": False,
                                      "stage3_param_persistence_threshold": 1e4},
                   hybrid_engine={"enabled": False, "max_out_tokens": 512, "inference_tp_size": 1},
                   tensorboard={"enabled": False, "output_path": "tb/", "job_name": "step1"})
    cfg = load_config(config, 2)
    assert cfg.bf16.enabled and cfg.precision == "bf16"
    assert load_config(with_(bfloat16={"enabled": False}), 2).precision == "fp32"
    with pytest.raises(ConfigError, match=r"bf16\.enable = true: unknown key"):
        load_config(with_(bfloat16={"enable": True}), 2)  # checked as the bf16 block


def test_autotp_hf_config_is_read_as_deepspeed_reads_it():
    """DeepSpeedExamples' HF AutoTP config (training/tensor_parallel/hf_integration): the stage-3
    field names DeepSpeed reads beside its documented ones, and a train_batch_size the HF
    Trainer filled in over every rank (DeepSpeed's check counts them under AutoTP alone)."""
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
              "gradient_accumulation_steps": 2, "tensor_parallel": {"autotp_size": 2},
              "zero_optimization": {"stage": 2, "gather_16bit_weights_on_model_save": True,
                                    "prefetch_bucket_size": 100}}
    cfg = load_config(config, 1, all_ranks=2)  # world 2, tensor 2: one data rank
    assert cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save
    assert cfg.zero_optimization.stage3_prefetch_bucket_size == 100
    assert cfg.train_batch_size == 16 and cfg.gradient_accumulation_steps == 2
    with pytest.raises(ConfigError, match=r"train_batch_size must equal"):
        load_config({**config, "train_batch_size": 12}, 1, all_ranks=2)
    with pytest.raises(ConfigError, match=r"train_batch_size must equal"):
        load_config(config, 1)  # counted over the data ranks only: 8
    # a missing key is derived over the data ranks, zero's rule (DeepSpeed's would give 2)
    derived = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
    assert load_config(derived, 1, all_ranks=2).gradient_accumulation_steps == 4


def test_unsupported_keys_at_default_are_accepted():
    config = with_(optimizer={"type": "Adam", "params": {"bias_correction": True, "amsgrad": False}},
                   zero_optimization={"allgather_partitions": True, "ignore_unused_parameters": True,
                                      "load_from_fp32_weights": True, "sub_group_size": 1e9},
                   zero_allow_untested_optimizer=True, zero_force_ds_cpu_optimizer=False,
                   tensorboard={"enabled": False, "output_path": "tb"}, flops_profiler={},
                   activation_checkpointing={"partition_activations": False, "number_checkpoints": None},
                   wandb=None)
    cfg = load_config(config, 2)
    assert "amsgrad" not in cfg.optimizer.params  # accepted at its default, then dropped
    assert cfg.zero_allow_untested_optimizer is True


def test_scheduler_defaults():
    cfg = load_config(with_(optimizer={"type": "AdamW", "params": {"lr": 2e-4}}, scheduler={"type": "WarmupLR"}), 2)
    # None: each parameter group's own lr (DeepSpeed 0.19.8; tests/deepspeed_schedules)
    assert dict(cfg.scheduler.params) == {"warmup_min_lr": 0.0, "warmup_max_lr": None, "warmup_num_steps": 1000,
                                          "warmup_type": "log", "last_batch_iteration": -1}
    decay = load_config(with_(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": 100}}), 2)
    assert decay.scheduler.params["warmup_max_lr"] == 0.001
    cosine = load_config(with_(scheduler={"type": "WarmupCosineLR", "params": {"total_num_steps": 100}}), 2)
    assert cosine.scheduler.params["cos_min_ratio"] == 0.0001 and cosine.scheduler.params["warmup_min_ratio"] == 0
    cycle = load_config(with_(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}),
                        2).scheduler.params
    assert (cycle["cycle_first_step_size"], cycle["cycle_second_step_size"], cycle["decay_step_size"]) == \
        (2000, None, 0)
    assert (cycle["cycle_momentum"], cycle["cycle_min_mom"], cycle["cycle_max_mom"]) == (True, 0.8, 0.9)


def test_memory_report_defaults_to_steps_per_print():
    cfg = load_config(with_(steps_per_print=25, memory_report={"path": "mem.jsonl"}), 2)
    assert cfg.memory_report.path == "mem.jsonl" and cfg.memory_report.every_n_steps == 25
    assert load_config(with_(steps_per_print=25, memory_report={"every_n_steps": 5}), 2).memory_report.every_n_steps \
        == 5


def test_communication_data_type_is_canonicalised():
    assert load_config(with_(communication_data_type="BF16"), 2).communication_data_type == "bf16"


def test_stage3_is_built_but_can_be_switched_off():
    assert load_config(with_(zero_optimization={"stage": 3}), 2).zero_optimization.stage == 3
    errors = errors_of(with_(zero_optimization={"stage": 3}), enabled_features=set())
    assert "needs engine feature 'stage3'" in errors_at(errors, "zero_optimization.stage")[0]


def test_enabled_features_unlock_stage3_and_offload():
    config = with_(zero_optimization={"stage": 3, "stage3_max_live_parameters": 1e8,
                                      "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                      "offload_param": {"device": "cpu"}})
    cfg = load_config(config, 2, enabled_features={"stage3", "offload", "offload_param"})
    zero = cfg.zero_optimization
    assert zero.stage == 3 and zero.stage3_max_live_parameters == 100_000_000
    assert zero.offload_optimizer.enabled and zero.offload_optimizer.pin_memory is True
    assert cfg.enabled_features == {"stage3", "offload", "offload_param"}


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown engine feature"):
        load_config(BASE, 2, enabled_features={"stage4"})
    with pytest.raises(ValueError, match="world_size"):
        load_config(BASE, 0)
    with pytest.raises(ValueError, match="world_size"):
        load_config(BASE, True)
    with pytest.raises(TypeError):
        load_config(42, 2)


def test_result_is_frozen_and_raw_is_a_copy():
    original = with_(optimizer={"type": "Adam"})
    cfg = load_config(original, 2)
    original["train_micro_batch_size_per_gpu"] = 99
    assert cfg.raw["train_micro_batch_size_per_gpu"] == 2
    assert cfg.raw["optimizer"] == {"type": "Adam"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train_batch_size = 1
    with pytest.raises(TypeError):
        cfg.optimizer.params["lr"] = 1.0


# --------------------------------------------------------------------------- files


def test_load_from_json_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(with_(zero_optimization={"stage": 1})))
    for source in (path, str(path)):
        cfg = load_config(source, 2)
        assert cfg.zero_optimization.stage == 1 and cfg.train_batch_size == 4


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(with_(steps_per_prnt=1)))
    with pytest.raises(ConfigError) as info:
        load_config(path, 2)
    assert str(info.value).startswith(f"invalid zero config {path}: 1 error")


def test_invalid_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "train_batch_size": 8,\n}\n')
    with pytest.raises(ConfigError, match="not valid JSON at line 3"):
        load_config(path, 1)


def test_duplicate_keys_in_file(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ConfigError, match="duplicate key"):
        load_config(path, 1)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.json", 1)


EXAMPLES = sorted((ROOT / "configs").glob("*.json"))


def test_expected_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"stage0.json", "stage1.json", "stage2.json", "stage2_bf16.json", "stage1_fp16.json"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_validate(path):
    cfg = load_config(path, 2)
    assert cfg.optimizer is not None and cfg.optimizer.type == "AdamW"
    assert cfg.gradient_clipping == 1.0


# --------------------------------------------------------------------------- schema, model and docs stay in sync


def test_docs_are_up_to_date():
    assert docs.DOCS_PATH.read_text(encoding="utf-8") == docs.render(), \
        "docs/CONFIG.md is stale: run `python -m zero.config.docs`"


@pytest.mark.parametrize("path,cls", sorted(model.DATACLASS_FOR_BLOCK.items()))
def test_dataclasses_match_schema(path, cls):
    block = next(b for b in schema.iter_blocks() if b.path == path)
    supported = [k.name for k in block.keys if k.supported]
    extra = ["world_size", "enabled_features", "raw"] if path == "" else []
    assert [f.name for f in dataclasses.fields(cls)] == supported + extra


def test_schema_is_consistent():
    assert schema.BUILT_FEATURES <= schema.ALL_FEATURES
    for block in schema.iter_blocks():
        assert len(set(block.names)) == len(block.names), block.path
        for key in block.keys:
            assert key.doc, f"{block.path}.{key.name} has no doc"
            features = [key.feature] + [f for _, f in key.value_features]
            assert {f for f in features if f} <= schema.ALL_FEATURES
            assert key.kind in (schema.BOOL, schema.INT, schema.FLOAT, schema.STR, schema.CHOICE, schema.BETAS,
                                schema.BLOCK, schema.PARAMS, schema.SECTION, schema.OBJECT,
                                schema.STRINGS)


def test_stage3_keys_below_stage_3_are_ignored_with_a_warning(caplog):
    # DeepSpeed ignores them, and Accelerate writes stage3_prefetch_bucket_size and
    # stage3_param_persistence_threshold at every stage.
    config = with_(zero_optimization={"stage": 2, "stage3_prefetch_bucket_size": 921,
                                      "stage3_param_persistence_threshold": 320})
    with caplog.at_level("WARNING", logger="zero"):
        resolved = load_config(config, world_size=2)
    assert resolved.zero_optimization.stage == 2
    assert "stage3_prefetch_bucket_size = 921 only applies to stage 3 (stage is 2): ignored" in caplog.text


def test_dotted_top_level_keys_are_ignored_as_deepspeed_ignores_them(caplog):
    """TRL's prepare_deepspeed adds "zero_optimization.reduce_bucket_size" and two more at the
    top level; DeepSpeed 0.19.8 reads no dotted paths and ignores unknown top-level keys."""
    config = with_(zero_optimization={"stage": 3},
                   **{"zero_optimization.reduce_bucket_size": 64,
                      "zero_optimization.stage3_prefetch_bucket_size": 57.6})
    with caplog.at_level("WARNING", logger="zero"):
        resolved = load_config(config, world_size=2)
    assert resolved.zero_optimization.reduce_bucket_size == 500_000_000  # the default, unchanged
    assert "top-level keys zero_optimization.reduce_bucket_size, " \
        "zero_optimization.stage3_prefetch_bucket_size ignored, as DeepSpeed ignores them" \
        in caplog.text
    # a dotted key under no known block is still an unknown key
    with pytest.raises(ConfigError, match=r"zero_optimisation\.stage = 3: unknown key"):
        load_config(with_(**{"zero_optimisation.stage": 3}), world_size=2)


@pytest.mark.parametrize("value", [float("inf"), None])
def test_steps_per_print_infinity_means_never(value):
    # Accelerate's DeepSpeedPlugin always sets "steps_per_print": inf.
    assert load_config(with_(steps_per_print=value), world_size=2).steps_per_print is None
    assert errors_at(errors_of(with_(steps_per_print=float("-inf"))), "steps_per_print")


# --------------------------------------------------------------------------- upper bounds (#14)

# Supported numeric keys with no upper bound, on purpose: a new INT/FLOAT key must get a `maximum`
# in schema.py or a line here saying why none is sane (test_every_number_has_an_upper_bound_or_a_reason).
UNBOUNDED = {
    # torch.optim and DeepSpeed reject only negative values here, and a useful size depends on the
    # loss's scale (SGD lr 30 in AWD-LSTM, Adam eps 1.0 in TensorFlow's Inception recipe): any cap
    # would be a guess that can reject a real run.
    "optimizer.params.lr": "no cap in torch.optim or DeepSpeed; scale-dependent",
    "optimizer.params.muon_lr": "Muon's lr: no cap in DeepSpeed; scale-dependent",
    "optimizer.params.adam_lr": "Muon's Adam half's lr: no cap in DeepSpeed; scale-dependent",
    "optimizer.params.eps": "no cap in torch.optim or DeepSpeed; scale-dependent",
    "optimizer.params.weight_decay": "no cap in torch.optim or DeepSpeed; scale-dependent",
    # Adagrad's (torch.optim.Adagrad checks only >= 0): the lr's divisor grows by lr_decay per
    # step, and the accumulator's start is in squared-gradient units: both scale-dependent.
    "optimizer.params.lr_decay": "no cap in torch.optim; scale-dependent",
    "optimizer.params.initial_accumulator_value": "no cap in torch.optim; scale-dependent",
    # LAMB's trust-ratio bounds (DeepSpeed's FusedLamb checks nothing): ||w|| / ||update|| is
    # scale-free but unbounded, and min_coeff <= max_coeff is checked
    "optimizer.params.max_coeff": "a ratio of norms; FusedLamb caps nothing",
    "optimizer.params.min_coeff": "a ratio of norms; FusedLamb caps nothing",
    # NAdam's momentum decay (torch.optim.NAdam checks only >= 0): a rate per step
    "optimizer.params.momentum_decay": "no cap in torch.optim; any rate >= 0 is a schedule",
    # The schedules' learning rates are the optimizer's lr at some step: the same reasoning.
    "scheduler.params.warmup_min_lr": "an lr",
    "scheduler.params.warmup_max_lr": "an lr",
    "scheduler.params.cycle_min_lr": "an lr",
    "scheduler.params.cycle_max_lr": "an lr",
    "scheduler.params.lr_range_test_min_lr": "an lr",
    # LRRangeTest grows the lr by this per step_size steps; the test's point is to find where
    # training breaks, so DeepSpeed bounds nothing
    "scheduler.params.lr_range_test_step_rate": "any rate >= 0 is a valid range test",
    # OneCycle's post-cycle decay: lr / (1 + rate * intervals), momentum * (1 + rate * intervals);
    # DeepSpeed checks nothing and any rate >= 0 is a valid (if odd) schedule.
    "scheduler.params.decay_lr_rate": "any rate >= 0 is a valid schedule",
    "scheduler.params.decay_mom_rate": "any rate >= 0 is a valid schedule",
    # A divisor applied before the all-reduce and undone after it: its useful range is 1..world_size,
    # and a config written for a large world must still load on a small one.
    "gradient_predivide_factor": "its natural bound is the world size, which a config does not know",
}

# Valid values of the required keys, to reach a key inside a "type"-dependent params block.
REQUIRED_VALUES = {"total_num_steps": 100, "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}


def _numeric_keys():
    """(dotted path, Key, make(value) -> a config holding value at that path) for every INT/FLOAT key."""
    found = []

    def walk(block, wrap, prefix):
        for key in block.keys:
            path = prefix + key.name
            if key.kind in (schema.INT, schema.FLOAT):
                found.append((path, key, lambda value, name=key.name, wrap=wrap: wrap({name: value})))
            elif key.kind == schema.BLOCK:
                walk(key.block, lambda d, name=key.name, wrap=wrap: wrap({name: d}), path + ".")
            elif key.kind == schema.PARAMS:
                seen = set()
                for type_name, variant in key.variants.items():
                    if id(variant) in seen:  # Adam and AdamW share one block
                        continue
                    seen.add(id(variant))
                    required = {k.name: REQUIRED_VALUES[k.name] for k in variant.keys if k.required}
                    walk(variant, lambda d, t=type_name, r=required, name=key.name, wrap=wrap:
                         wrap({"type": t, name: {**r, **d}}), path + ".")

    walk(schema.TOP, lambda d: d, "")
    return found


NUMERIC = _numeric_keys()
BOUNDED = [(path, key, make) for path, key, make in NUMERIC if key.supported and key.maximum is not None]
# One base that reaches every key at world size 1 (the batch trio is then derivable at any bound).
BOUNDS_BASE = {"train_micro_batch_size_per_gpu": 1}


def _above(key):
    """A value just past the key's maximum, of the key's own kind."""
    if key.kind == schema.INT:
        return int(key.maximum) + 1
    return float(key.maximum * 2 if key.maximum > 0 else key.maximum + 1)


def test_every_number_has_an_upper_bound_or_a_reason():
    assert {path for path, _, _ in NUMERIC} >= set(UNBOUNDED), "UNBOUNDED names a key the schema lacks"
    unbounded = {path for path, key, _ in NUMERIC if key.supported and key.maximum is None}
    assert unbounded - set(UNBOUNDED) == set(), \
        "give these keys a maximum in zero/config/schema.py, or say in UNBOUNDED why none is sane"
    assert set(UNBOUNDED) - unbounded == set(), "these keys have a maximum now: drop them from UNBOUNDED"
    for path, key, _ in NUMERIC:  # every default lies inside its own range
        if key.maximum is not None and key.default is not None and not key.required:
            assert key.minimum is None or key.default >= key.minimum, path
            assert key.default <= key.maximum, path


@pytest.mark.parametrize("path,key,make", BOUNDED, ids=[path for path, _, _ in BOUNDED])
def test_a_value_above_the_maximum_names_key_value_and_range(path, key, make):
    value = _above(key)
    errors = errors_of(merged(BOUNDS_BASE, make(value)), world_size=1, enabled_features=ALL)
    assert errors == [f"{path} = {_show(value)}: out of range: must be {_describe_range(key)}"]
    assert f"<= {_show(key.maximum)}" in errors[0]


@pytest.mark.parametrize("path,key,make", BOUNDED, ids=[path for path, _, _ in BOUNDED])
def test_the_maximum_itself_is_accepted(path, key, make):
    # data_parallel_size must say the run's data ranks: a run of that many
    world_size = key.maximum if path == "data_parallel_size" else 1
    load_config(merged(BOUNDS_BASE, make(key.maximum)), world_size=world_size,
                enabled_features=ALL)


@pytest.mark.parametrize("path,key,make", [c for c in NUMERIC if not c[1].supported],
                         ids=[path for path, key, _ in NUMERIC if not key.supported])
def test_unsupported_numbers_need_no_bound_only_their_default_is_accepted(path, key, make):
    errors = errors_of(merged(BOUNDS_BASE, make(10**15)), world_size=1, enabled_features=ALL)
    assert errors_at(errors, path) and "not supported yet" in errors[0], errors


@pytest.mark.parametrize("patch,path", [
    ({"zero_optimization": {"reduce_bucket_size": 1e15}}, "zero_optimization.reduce_bucket_size"),
    ({"zero_optimization": {"allgather_bucket_size": 10**15}}, "zero_optimization.allgather_bucket_size"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1e15}},
     "zero_optimization.stage3_prefetch_bucket_size"),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e15}},
     "zero_optimization.stage3_max_live_parameters"),
    ({"zero_optimization": {"stage": 3, "stage3_max_inflight_gathers": 1e6}},
     "zero_optimization.stage3_max_inflight_gathers"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme",
                                                          "buffer_count": 1e6}}},
     "zero_optimization.offload_param.buffer_count"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme",
                                                          "max_in_cpu": 1e15}}},
     "zero_optimization.offload_param.max_in_cpu"),
    ({"aio": {"block_size": 4096 * 10**9}}, "aio.block_size"),
    ({"train_micro_batch_size_per_gpu": 1e12}, "train_micro_batch_size_per_gpu"),
    ({"gradient_clipping": 1e30}, "gradient_clipping"),
    ({"fp16": {"enabled": True, "loss_scale": 1e39}}, "fp16.loss_scale"),
    ({"fp16": {"enabled": True, "loss_scale_window": 1e15}}, "fp16.loss_scale_window"),
    ({"fp16": {"enabled": True, "hysteresis": 1e15}}, "fp16.hysteresis"),
    ({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 9}}}, "optimizer.params.momentum"),
    ({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1e15}}},
     "scheduler.params.total_num_steps"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e15}}},
     "scheduler.params.warmup_num_steps"),
    ({"steps_per_print": 1e30}, "steps_per_print"),
])
def test_absurd_values_are_named_with_the_range(patch, path):
    errors = errors_of(with_(**patch), world_size=2)
    [line] = errors_at(errors, path)
    assert "out of range: must be" in line and "<=" in line, line


# Values real DeepSpeed configs use (DeepSpeed's code defaults and docs, the HF DeepSpeed docs,
# DeepSpeedExamples, public training scripts): the bounds must leave every one of them accepted.
DEEPSPEED_IN_THE_WILD = {
    "train_batch_size": 2048, "train_micro_batch_size_per_gpu": 16, "gradient_clipping": 1.0,
    "steps_per_print": 2000, "prescale_gradients": False, "gradient_predivide_factor": 8.0,
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 10000,
             "hysteresis": 10, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10_000_000, "warmup_num_steps": 375_000,
                                                      "warmup_min_lr": 0, "warmup_max_lr": 6e-4,
                                                      "last_batch_iteration": -1}},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
        "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,  # DeepSpeed's defaults
        "sub_group_size": 1e12,  # DeepSpeed's ZERO_FORMAT sample
        "stage3_prefetch_bucket_size": int(0.9 * 8192 * 8192), "stage3_param_persistence_threshold": 10 * 8192,
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_model_persistence_threshold": sys.maxsize,  # DeepSpeed's default, written out
        "stage3_gather_16bit_weights_on_model_save": True,
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True,
                          "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},  # DeepSpeed's defaults
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True,
                              "buffer_count": 4, "ratio": 1.0},
    },
    "aio": {"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 1, "single_submit": False,
            "overlap_events": True},  # the HF DeepSpeed docs' NVMe sample
    "memory_report": {"every_n_steps": 1e12},
}

ONE_CYCLE = {"type": "OneCycle", "params": {  # DeepSpeed's 1Cycle tutorial
    "cycle_first_step_size": 1000, "cycle_first_stair_count": 500, "cycle_second_step_size": 1000,
    "cycle_second_stair_count": 500, "decay_step_size": 1000, "cycle_min_lr": 0.0001, "cycle_max_lr": 0.0010,
    "decay_lr_rate": 0.001, "cycle_min_mom": 0.85, "cycle_max_mom": 0.99, "decay_mom_rate": 0.0}}


def test_deepspeed_configs_in_the_wild_stay_accepted():
    cfg = load_config(DEEPSPEED_IN_THE_WILD, world_size=128)
    assert cfg.zero_optimization.sub_group_size == 10**12 and cfg.fp16.loss_scale_window == 10000
    load_config(with_(scheduler=ONE_CYCLE, optimizer={"type": "SGD", "params": {"lr": 30, "momentum": 0.9,
                                                                                 "nesterov": True}}), 2)
    load_config(with_(optimizer={"type": "Adam", "params": {"lr": 1e-3, "eps": 1.0}},
                      fp16={"enabled": True, "loss_scale": 512}), 2)


# "Never print" as public DeepSpeed configs write it (Accelerate writes inf, tested above).
@pytest.mark.parametrize("value", [1e5, 1e8, 1e10, 1e12, 999999999999, 9999999999, 2**31 - 1, 2**31, 1e18])
def test_steps_per_print_as_never_in_real_configs_is_accepted(value):
    assert load_config(with_(steps_per_print=value), world_size=2).steps_per_print == int(value)


# What the HF Trainer writes for "auto" (hidden size 768) in the shipped examples/huggingface configs.
HF_FILLS = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "train_batch_size": 16,
            "gradient_clipping": 1.0, "enabled": True, "lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": 0.0, "reduce_bucket_size": 768 * 768, "stage3_prefetch_bucket_size": 530841,
            "stage3_param_persistence_threshold": 7680}


def _fill_auto(value, name=None):
    if isinstance(value, dict):
        return {k: _fill_auto(v, k) for k, v in value.items()}
    return HF_FILLS[name] if value == "auto" else value


SHIPPED = sorted((ROOT / "configs").glob("*.json")) + sorted((ROOT / "examples").rglob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_every_shipped_config_loads_within_the_bounds(path):
    raw = _fill_auto(json.loads(path.read_text()))
    raw.pop("train_batch_size", None)  # written for its own world size
    load_config(raw, world_size=2)
