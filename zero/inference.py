"""`deepspeed.init_inference(model, config=None, **kwargs)`: DeepSpeed 0.19.8's inference entry,
for scripts that train with zero and then serve or evaluate the model. The InferenceEngine
casts the model's floating-point tensors to the config's dtype (DeepSpeed's default: fp16),
moves it to the current device and runs the model's own forward and generate.

With `tensor_parallel.tp_size` N > 1 (or DeepSpeed's older `mp_size`) it starts
torch.distributed from the launcher's environment when the script has not, sets the GPU to
LOCAL_RANK, and splits the model's linears over groups of N consecutive ranks with zero's
AutoTP (zero/tp/auto_tp.py: every rank holds the whole model first and keeps its slice); the
random generators are global rank 0's everywhere, as DeepSpeed broadcasts them, so sampled
generation picks the same tokens on every slice. A `tensor_parallel.mpu` or `tp_group`
names the group instead (a `tp_group` alone splits over it).

Accepted and without effect: `replace_with_kernel_inject` (no fused kernels are injected: the
model's own modules compute the same function, and generate has none of DeepSpeed's kernel
checks), the kernels' workspace and MoE-kernel keys. Not built, each an error naming its key
and the fix: CUDA graphs, Triton, int8, loading or saving checkpoints, injection policies,
expert parallelism, and the `zero` block (ZeRO-3 inference is `deepspeed.initialize` at
stage 3, whose model's generate gathers each layer). Values "auto" take the default, as in
DeepSpeed."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from zero.config import schema

# DeepSpeed's DtypeEnum spellings of the dtypes it builds here, and its `dtype` default
_DTYPES = {**dict.fromkeys((torch.float16, *schema.FP16_AUTOCAST_DTYPES), torch.float16),
           **dict.fromkeys((torch.bfloat16, *schema.BF16_DTYPES), torch.bfloat16),
           **dict.fromkeys((torch.float32, *schema.FP32_DTYPES), torch.float32)}
_CASTS = {torch.float16: nn.Module.half, torch.bfloat16: nn.Module.bfloat16,
          torch.float32: nn.Module.float}  # floating-point tensors only, as DeepSpeed's
_ALIASES = {"kernel_inject": "replace_with_kernel_inject", "tp": "tensor_parallel",
            "max_tokens": "max_out_tokens", "min_tokens": "min_out_tokens",
            "tm": "triangular_masking", "args": "config", "injection_dict": "injection_policy",
            "ckpt_config": "checkpoint_config", "expert_group": "ep_group",
            "expert_mp_group": "ep_mp_group"}
# Keys that change nothing here (DeepSpeed's kernels' workspace and options, its MoE kernels'
# groups; `quant` acts only with dtype int8, which is refused): any value is accepted.
_NO_EFFECT = {"replace_with_kernel_inject", "max_out_tokens", "min_out_tokens", "return_tuple",
              "triangular_masking", "transposed_mode", "training_mp_size", "replace_method",
              "config", "base_dir", "set_empty_params", "checkpoint_config", "quant",
              "moe_experts", "moe_type", "ep_group", "ep_mp_group", "injection_policy_tuple"}


def _off(value) -> bool:
    return value is None or value is False or (isinstance(value, (str, dict, list)) and
                                               not value)


def _one_expert_rank(value) -> bool:
    return isinstance(value, bool) or _off(value) or (
        isinstance(value, dict) and value.get("ep_size", 1) == 1)


# Keys whose other values need what is not built: key -> (is the value fine, the fix)
_NOT_BUILT = {
    "enable_cuda_graph": (_off, "CUDA graphs are not built; remove it"),
    "use_triton": (_off, "Triton kernels are not built; remove it"),
    "triton_autotune": (_off, "Triton kernels are not built; remove it"),
    "checkpoint": (_off, "load the weights into the model first (from_pretrained, "
                         "load_state_dict), then call init_inference"),
    "save_mp_checkpoint_path": (_off, "saving tensor-parallel checkpoints is not built; save "
                                      "the whole model before init_inference"),
    "injection_policy": (_off, "injection policies are not built; tensor_parallel.tp_size "
                               "splits the linears automatically (AutoTP)"),
    "moe": (_one_expert_rank, "expert parallelism at inference is not built; remove it"),
    "ep_size": (lambda value: value == 1, "expert parallelism at inference is not built"),
    "zero": (lambda value: _off(value) or (isinstance(value, dict) and
                                           value.get("stage", 0) == 0),
             "ZeRO-3 inference is deepspeed.initialize with zero_optimization.stage 3 (the "
             "model's generate gathers each layer); remove it here"),
}
_TP_KEYS = {"enabled", "tp_size", "tp_grain_size", "mpu", "tp_group"}


@dataclass
class InferenceConfig:
    dtype: torch.dtype = torch.float16
    tp_size: int = 1
    tp_group: object = None  # a process group, or None: made from consecutive ranks
    keep_module_on_host: bool = False


def parse_config(config=None, **kwargs) -> InferenceConfig:
    """DeepSpeed's merge: `config` (a dict or a JSON path) updated with `kwargs`, a key given
    in both with different values an error; "auto" values dropped; then every key checked."""
    if config is None:
        config = {}
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as handle:
            config = json.load(handle)
    if not isinstance(config, dict):
        raise ValueError(f"'config' argument expected string or dictionary, got {type(config)}")
    merged = dict(config)
    for key in set(merged) & set(kwargs):
        if merged[key] != kwargs[key]:
            raise ValueError(f"Conflicting argument '{key}' in 'config':{merged[key]} and "
                             f"kwargs:{kwargs[key]}")
    merged.update(kwargs)
    return _checked({_ALIASES.get(key, key): value for key, value in _set(merged).items()})


def _set(values: dict) -> dict:
    """`values` without those given as "auto": DeepSpeed's config models take their defaults."""
    return {key: value for key, value in values.items()
            if not (isinstance(value, str) and value == "auto")}


def _checked(values: dict) -> InferenceConfig:
    parsed = InferenceConfig()
    tp = _tensor_parallel_block(values)
    for key, value in values.items():
        if key == "dtype":
            if not isinstance(value, (str, torch.dtype)) or value not in _DTYPES:
                raise ValueError(f"zero: init_inference dtype {value!r} is not one of "
                                 f"{sorted(k for k in _DTYPES if isinstance(k, str))} or their "
                                 "torch dtypes (int8 quantization is not built)")
            parsed.dtype = _DTYPES[value]
        elif key == "keep_module_on_host":
            parsed.keep_module_on_host = _boolean(key, value)
        elif key in _NOT_BUILT:
            fine, fix = _NOT_BUILT[key]
            if not fine(value):
                raise ValueError(f"zero: init_inference {key}={value!r} is not supported: {fix}")
        elif key not in _NO_EFFECT:
            known = sorted({"dtype", "keep_module_on_host", "tensor_parallel", "mp_size", "mpu",
                            *_NOT_BUILT, *_NO_EFFECT, *_ALIASES})
            raise ValueError(f"zero: unknown init_inference key {key!r}; known: {known}")
    enabled = _boolean("tensor_parallel.enabled", tp.get("enabled", True))
    parsed.tp_size = tp.get("tp_size", 1) if enabled else 1
    if isinstance(parsed.tp_size, bool) or not isinstance(parsed.tp_size, int) or \
            parsed.tp_size < 1:
        raise ValueError(f"zero: init_inference tensor_parallel.tp_size must be an integer >= 1, "
                         f"got {parsed.tp_size!r}")
    if enabled and tp.get("mpu") is not None:
        parsed.tp_group = tp["mpu"].get_model_parallel_group()
    elif enabled and tp.get("tp_group") is not None:
        parsed.tp_group = tp["tp_group"]
    return parsed


def _tensor_parallel_block(values: dict) -> dict:
    """tensor_parallel's keys (removed from `values`), with DeepSpeed's deprecated top-level
    `mp_size` and `mpu` moved in; giving both spellings is an error, as in DeepSpeed."""
    tp = values.pop("tensor_parallel", None) or {}
    if not isinstance(tp, dict):
        raise ValueError(f"zero: init_inference tensor_parallel must be a dict such as "
                         f"{{'tp_size': 2}}, got {tp!r}")
    tp = _set(tp)
    unknown = set(tp) - _TP_KEYS
    if unknown:
        raise ValueError(f"zero: unknown init_inference tensor_parallel key(s) {sorted(unknown)}; "
                         f"known: {sorted(_TP_KEYS)}")
    for old, new in (("mp_size", "tp_size"), ("mpu", "mpu")):
        if old in values:
            if new in tp:
                raise ValueError(f"zero: init_inference got both the deprecated {old} and "
                                 f"tensor_parallel.{new}; keep tensor_parallel.{new}")
            tp[new] = values.pop(old)
    return tp


def _boolean(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"zero: init_inference {key} must be true or false, got {value!r}")
    return value


class InferenceEngine(nn.Module):
    """The model for inference: `engine(...)` is its forward, `engine.generate(...)` its
    generate (when it has one), `engine.module` the model itself, `engine.config` its config
    (a Hugging Face model's; None without one), `engine.mp_group` the tensor-parallel group
    (None without one)."""

    def __init__(self, model: nn.Module, config: InferenceConfig):
        super().__init__()
        if any(p.is_meta for p in model.parameters()):
            raise ValueError("zero: init_inference got a model on the meta device, and loading "
                             "checkpoints is not built: load the weights into the model first "
                             "(from_pretrained, load_state_dict), then call init_inference")
        self.module = model
        self._config = config
        self.config = getattr(model, "config", None)  # DeepSpeed's, for HF pipelines
        if hasattr(model, "generate"):
            self.generate = self._generate
        _CASTS[config.dtype](model)
        self.mp_group = _split(model, config)
        if not config.keep_module_on_host:
            model.to(_current_device())

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _generate(self, *inputs, **kwargs):
        return self.module.generate(*inputs, **kwargs)


def init_inference(model: nn.Module, config=None, **kwargs) -> InferenceEngine:
    """DeepSpeed's `init_inference`: `config` (a dict or a JSON path) and keyword arguments
    (they win; the same key with another value in both is an error)."""
    return InferenceEngine(model, parse_config(config, **kwargs))


def _split(model: nn.Module, config: InferenceConfig):
    """Splits `model` over its tensor-parallel group (made from consecutive ranks, or the
    config's); returns the group, None without tensor parallelism."""
    if config.tp_size == 1 and config.tp_group is None:
        return None
    from zero.tp import TensorParallelSplitError, auto_tp

    group = config.tp_group or _consecutive_group(config.tp_size)
    config.tp_size = dist.get_world_size(group)
    if config.tp_size == 1:
        return group
    try:
        split = auto_tp(model, group)
    except TensorParallelSplitError as error:  # it names the training key
        raise TensorParallelSplitError(str(error).replace(
            "tensor_parallel.autotp_size", "init_inference's tensor_parallel.tp_size")) from None
    if not split:
        raise ValueError(f"zero: init_inference tensor_parallel.tp_size {config.tp_size}: the "
                         "model has no layer AutoTP can split (attention and MLP blocks of "
                         "input and output linears); use tp_size 1")
    _share_rng_states()
    return group


def _consecutive_group(size: int):
    """This rank's group of `size` consecutive ranks (zero.parallel's tensor groups), after
    starting torch.distributed and choosing LOCAL_RANK's GPU as DeepSpeed does."""
    from zero.distributed import init_distributed
    from zero.parallel.grid import grid_for

    if not dist.is_initialized():
        init_distributed()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return grid_for(tensor=size).get_tensor_model_parallel_group()


def _share_rng_states() -> None:
    """Every rank samples with global rank 0's generators (the CPU's, and the GPU's where there
    is one), sent over the world as DeepSpeed sends them."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    state = torch.get_rng_state().to(device)
    dist.broadcast(state, 0)
    torch.set_rng_state(state.cpu())
    if torch.cuda.is_available():
        state = torch.cuda.get_rng_state().to(device)
        dist.broadcast(state, 0)
        torch.cuda.set_rng_state(state.cpu())


def _current_device() -> torch.device:
    """DeepSpeed's get_accelerator().current_device_name(): the current GPU, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
