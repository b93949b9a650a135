"""The typed options the C++ engine takes, built here from the validated config and nowhere else;
and, the other way, what it reports back (bound read-only structs, csrc/bindings/reports.cpp),
turned into plain dicts where a report needs one (as_dict).

Each is a plain C++ struct bound field by field (csrc/bindings/options.cpp). `typed()` fills
one by name: a name the struct does not have is an AttributeError naming it, so a misspelled
option can never fall back to a default. The values come from the schema-validated config,
whose defaults are the only ones written down (tests/test_boundary.py checks that the C++
structs' own defaults agree with the schema's).

The path of a config key, e.g. zero_optimization.offload_optimizer.pin_memory:
JSON -> zero.config (schema check, defaults) -> offload.offload_options() -> typed() ->
_C.OffloadOptions.pin_memory -> GroupOptions.offload -> EngineCore.add_group (C++)."""
from __future__ import annotations

import functools

import torch

from zero import _C
from zero.config.schema import FP32_DTYPES


def typed(cls, **fields):
    """An instance of the bound struct `cls` with `fields` set."""
    value = cls()
    for name, field in fields.items():
        if not hasattr(value, name):
            raise AttributeError(f"zero: {cls.__name__} has no field '{name}'; its fields: "
                                 f"{', '.join(_fields(cls))}")
        setattr(value, name, field)
    return value


def as_dict(value) -> dict:
    """A bound struct the engine reported back (_C.CommStats, OffloadInfo, ScheduleStats, ...)
    as a plain dict of its fields, for JSON reports and for results passed between processes."""
    return {name: getattr(value, name) for name in _fields(type(value))}


def _fields(cls) -> list[str]:
    return sorted(name for name, member in vars(cls).items()
                  if isinstance(member, property))


# communication_data_type -> the engine's dtype; null: the gradients' own (None)
_COMM_DTYPES = {"fp32": _C.DType.float32, "bf16": _C.DType.bfloat16, "fp16": _C.DType.float16}


def group_options(config, *, stage: int, alignment: int, optimizer_kind: str,
                  sgd_momentum: bool, offload, offload_param=None, shared_params=(),
                  stage3_groups=None, external_states=(), fp32_optimizer_states=None,
                  data_group=None):
    """One parameter group's options. A unit (the grain of one reduce-scatter / all-gather)
    is reduce_bucket_size elements at stages 0-2; stage 3 units are the model's modules.
    `stage3_groups` (a partitioned group's, process_groups.Stage3Groups): hpZ's and MiCS's
    groups; such a group also takes ZeRO++'s quantized communication where the config asks.
    `fp32_optimizer_states`: a client DeepSpeedCPUAdam's (sixteen_bit_states).
    `data_group` (stages 0-2, MoE's experts: zero.moe.ExpertDataGroup): the group sharded and
    reduced over instead of the engine's, and the count its gradient mean divides by."""
    zero_cfg = config.zero_optimization
    stage3 = stage3_groups is not None
    return typed(_C.GroupOptions, stage=stage, alignment=alignment,
                 unit_numel=1 if stage == 3 else int(zero_cfg.reduce_bucket_size),
                 overlap_comm=bool(zero_cfg.overlap_comm),
                 shard_grads=stage == 1 and grads_sharded(zero_cfg.stage,
                                                          config.gradient_accumulation_steps),
                 optimizer=_C.OptimizerKind.__members__[optimizer_kind],
                 sgd_momentum=sgd_momentum, external_states=list(external_states),
                 offload=offload,
                 offload_param=offload_param or _C.ParamOffloadOptions(),
                 shared_params=list(shared_params),
                 quantized_weights=stage3 and bool(zero_cfg.zero_quantized_weights),
                 quantized_gradients=stage3 and bool(zero_cfg.zero_quantized_gradients),
                 all_reduce_fetch=stage3 and bool(zero_cfg.stage3_use_all_reduce_for_fetch_params),
                 master_in_model_dtype=sixteen_bit_master(config),
                 states_in_model_dtype=sixteen_bit_states(config, fp32_optimizer_states),
                 grads_in_fp32=fp32_grads(config),
                 communication_dtype=_COMM_DTYPES.get(config.communication_data_type),
                 hpz_group=stage3_groups.hpz if stage3 else "",
                 mics_shard_group=stage3_groups.mics_shard if stage3 else "",
                 mics_replicate_group=stage3_groups.mics_replicate if stage3 else "",
                 data_group=data_group.name if data_group else "",
                 average_over=data_group.average_over if data_group else 0)


def sixteen_bit_master(config) -> bool:
    """DeepSpeed's bf16_master_weights_and_grads / fp16_master_weights_and_grads: the master
    weights in the parameters' 16-bit dtype (GroupOptions::master_in_model_dtype)."""
    return bool(config.bf16.bf16_master_weights_and_grads
                or config.fp16.fp16_master_weights_and_grads)


def sixteen_bit_states(config, fp32_optimizer_states=None) -> bool:
    """The optimizer's arrays in the 16-bit dtype (GroupOptions::states_in_model_dtype), by
    states_rule: `fp32_optimizer_states` is a client optimizer's when given, else the
    config's optimizer.params'."""
    if fp32_optimizer_states is None and config.optimizer is not None:
        fp32_optimizer_states = config.optimizer.params.get("fp32_optimizer_states")
    return states_rule(bool(config.bf16.bf16_optimizer_states), fp32_optimizer_states,
                       sixteen_bit_master(config),
                       config.zero_optimization.offload_optimizer.device != "none")


def states_rule(bf16_optimizer_states: bool, fp32_optimizer_states, sixteen_bit_master: bool,
                offloaded: bool) -> bool:
    """bf16_optimizer_states; or, as DeepSpeedCPUAdam's fp32_optimizer_states=False keeps its
    moments in the master's dtype, that switch with a 16-bit master offloaded. (The estimator
    applies it per offload option.)"""
    return bf16_optimizer_states or (fp32_optimizer_states is False and sixteen_bit_master
                                     and offloaded)


def fp32_grads(config) -> bool:
    """DeepSpeed's data_types.grad_accum_dtype fp32 under bf16/fp16 training: the gradients
    accumulate in fp32 buffers (GroupOptions::grads_in_fp32). The config check admits no
    other mix."""
    return config.precision != "fp32" and config.data_types.grad_accum_dtype in FP32_DTYPES


@functools.cache
def _ns_dtype(method: str):
    """The dtype DeepSpeed runs Muon's Newton-Schulz in: "gram" fp16, "standard" bf16, each
    where the accelerator supports it (fp16 on a GPU of compute capability 7 or more, on a
    CPU only with oneDNN's fp16), else fp32."""
    if method == "gram":
        if torch.cuda.is_available():
            fp16 = torch.cuda.get_device_capability()[0] >= 7
        else:
            fp16 = torch.ops.mkldnn._is_mkldnn_fp16_supported()
        return _C.DType.float16 if fp16 else _C.DType.float32
    bf16 = not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
    return _C.DType.bfloat16 if bf16 else _C.DType.float32


def grads_sharded(stage: int, gradient_accumulation_steps: int) -> bool:
    """Whether an engine of this ZeRO stage (0-2) keeps only each rank's shard of the
    gradients: stage 2, and stage 1 when every step is one micro-step (nothing to accumulate,
    so no full gradient buffer; GroupOptions::shard_grads). The estimator asks the same."""
    return stage == 2 or (stage == 1 and int(gradient_accumulation_steps) == 1)


def schedule_options(config, device: torch.device):
    """Stage 3's gather schedule (prefetch, live and reuse bounds, gathers in flight)."""
    zero_cfg = config.zero_optimization
    return typed(_C.ScheduleOptions,
                 prefetch_numel=int(zero_cfg.stage3_prefetch_bucket_size),
                 max_live_numel=int(zero_cfg.stage3_max_live_parameters),
                 max_reuse_distance=int(zero_cfg.stage3_max_reuse_distance),
                 max_inflight=int(zero_cfg.stage3_max_inflight_gathers), device=device)


def optimizer_hyper(kind: str, group: dict, decoupled_weight_decay: bool, external=None):
    """One optimizer group's hyperparameters for this step (read fresh each step); `external`:
    an external optimizer's update of the engine group (external_optimizer.py)."""
    if kind == "external":  # its hyperparameters are its own (Adafactor's lr may be None)
        return typed(_C.OptimizerHyper, kind=_C.OptimizerKind.external, external=external)
    common = dict(kind=_C.OptimizerKind.__members__[kind], lr=float(group["lr"]),
                  weight_decay=float(group.get("weight_decay", 0.0)))
    if kind == "adam":
        beta1, beta2 = (float(b) for b in group["betas"])
        return typed(_C.OptimizerHyper, beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                     decoupled_weight_decay=decoupled_weight_decay,
                     bias_correction=bool(group.get("bias_correction", True)), **common)
    if kind == "lion":
        beta1, beta2 = (float(b) for b in group["betas"])
        return typed(_C.OptimizerHyper, beta1=beta1, beta2=beta2, **common)
    if kind == "lamb":  # (every group's is built before any group steps)
        if float(group["min_coeff"]) > float(group["max_coeff"]):
            raise ValueError(f"zero: a Lamb parameter group's min_coeff {group['min_coeff']} is "
                             f"above its max_coeff {group['max_coeff']}: the trust ratio is "
                             "clamped to [min_coeff, max_coeff]; fix the group's values")
        beta1, beta2 = (float(b) for b in group["betas"])
        return typed(_C.OptimizerHyper, beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                     bias_correction=bool(group["bias_correction"]),
                     max_coeff=float(group["max_coeff"]), min_coeff=float(group["min_coeff"]),
                     eps_inside_sqrt=bool(group["eps_inside_sqrt"]), **common)
    if kind == "muon":  # (zero/muon.py: Nesterov, 5 steps, as DeepSpeed's muon_update)
        return typed(_C.OptimizerHyper, momentum=float(group["momentum"]), nesterov=True,
                     ns_method=_C.NsMethod.__members__[group["ns_method"]],
                     ns_dtype=_ns_dtype(group["ns_method"]), **common)
    if kind == "adagrad":
        return typed(_C.OptimizerHyper, eps=float(group["eps"]),
                     lr_decay=float(group.get("lr_decay", 0.0)), decoupled_weight_decay=False,
                     **common)
    return typed(_C.OptimizerHyper, momentum=float(group.get("momentum", 0.0)),
                 dampening=float(group.get("dampening", 0.0)),
                 nesterov=bool(group.get("nesterov", False)), **common)
