"""`deepspeed.init_inference(model, config=None, **kwargs)`: DeepSpeed 0.19.8's inference entry,
for scripts that train with zero and then serve or evaluate the model. The InferenceEngine
casts the model to the config's dtype (DeepSpeed's default: fp16), moves it to this rank's
device, splits its linears over `tensor_parallel.tp_size` ranks with zero's AutoTP
(zero/tp/auto_tp.py: every rank holds the whole model first and keeps its slice; the
sampling RNG is rank 0's on every rank, as DeepSpeed broadcasts it) and runs the model's own
forward and generate.

Not built, each an error naming its key: DeepSpeed's fused inference kernels are not
injected (`replace_with_kernel_inject` is accepted and runs the model's own modules, which
compute the same function), CUDA graphs, Triton, int8 quantization, injection policies,
loading or saving tensor-parallel checkpoints, expert parallelism and ZeRO-Inference."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

# DeepSpeed's DtypeEnum spellings, and its `dtype` default
_DTYPES = {**dict.fromkeys((torch.float16, "torch.float16", "fp16", "float16", "half"),
                           torch.float16),
           **dict.fromkeys((torch.bfloat16, "torch.bfloat16", "bf16", "bfloat16"),
                           torch.bfloat16),
           **dict.fromkeys((torch.float32, "torch.float32", "fp32", "float32", "float"),
                           torch.float32)}
_ALIASES = {"kernel_inject": "replace_with_kernel_inject", "tp": "tensor_parallel",
            "max_tokens": "max_out_tokens", "min_tokens": "min_out_tokens",
            "tm": "triangular_masking", "args": "config", "injection_dict": "injection_policy",
            "ckpt_config": "checkpoint_config"}
# Keys that change nothing here (DeepSpeed's kernels' workspace and options; `quant` acts
# only with dtype int8, which is refused); any value is accepted.
_NO_EFFECT = {"replace_with_kernel_inject", "max_out_tokens", "min_out_tokens", "return_tuple",
              "triangular_masking", "transposed_mode", "training_mp_size", "replace_method",
              "config", "base_dir", "set_empty_params", "checkpoint_config", "quant"}


def _off(value) -> bool:
    return value in (None, False, "", {}, [])


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
             "ZeRO-Inference is not built; remove it"),
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
    in both with different values an error; then every key checked."""
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
    return _checked({_ALIASES.get(key, key): value for key, value in merged.items()})


def _checked(values: dict) -> InferenceConfig:
    parsed = InferenceConfig()
    tp = dict(values.pop("tensor_parallel", None) or {})
    for deprecated, key in (("mp_size", "tp_size"), ("mpu", "mpu")):  # DeepSpeed's old names
        if deprecated in values:
            tp.setdefault(key, values.pop(deprecated))
    for key, value in values.items():
        if key == "dtype":
            if value not in _DTYPES:
                raise ValueError(f"zero: init_inference dtype {value!r} is not one of fp16, bf16, "
                                 "fp32 (int8 quantization is not built)")
            parsed.dtype = _DTYPES[value]
        elif key == "keep_module_on_host":
            parsed.keep_module_on_host = bool(value)
        elif key in _NOT_BUILT:
            fine, fix = _NOT_BUILT[key]
            if not fine(value):
                raise ValueError(f"zero: init_inference {key}={value!r} is not supported: {fix}")
        elif key not in _NO_EFFECT:
            known = sorted({"dtype", "keep_module_on_host", "tensor_parallel", "mp_size", "mpu",
                            *_NOT_BUILT, *_NO_EFFECT, *_ALIASES})
            raise ValueError(f"zero: unknown init_inference key {key!r}; known: {known}")
    unknown = set(tp) - _TP_KEYS
    if unknown:
        raise ValueError(f"zero: unknown init_inference tensor_parallel key(s) {sorted(unknown)}; "
                         f"known: {sorted(_TP_KEYS)}")
    parsed.tp_size = int(tp.get("tp_size", 1)) if tp.get("enabled", True) else 1
    if tp.get("mpu") is not None:
        parsed.tp_group = tp["mpu"].get_model_parallel_group()
    elif tp.get("tp_group") is not None:
        parsed.tp_group = tp["tp_group"]
    if parsed.tp_size < 1:
        raise ValueError(f"zero: init_inference tensor_parallel.tp_size must be >= 1, got "
                         f"{parsed.tp_size}")
    return parsed


class InferenceEngine(nn.Module):
    """The model for inference: `engine(...)` is its forward, `engine.generate(...)` its
    generate (when it has one), `engine.module` the model itself."""

    def __init__(self, model: nn.Module, config: InferenceConfig):
        super().__init__()
        self.module = model
        self._config = config
        if hasattr(model, "generate"):
            self.generate = self._generate
        model.to(config.dtype)
        self.mp_group = None
        if config.tp_size > 1 or config.tp_group is not None:
            self.mp_group = config.tp_group or _tensor_parallel_group(config.tp_size)
            config.tp_size = dist.get_world_size(self.mp_group)
        if self.mp_group is not None and config.tp_size > 1:
            from zero.tp import auto_tp

            auto_tp(self.module, self.mp_group)
            _share_rng_state(self.mp_group)
        device = _device()
        if any(p.is_meta for p in model.parameters()):
            model.to_empty(device=device)
        elif not config.keep_module_on_host:
            model.to(device)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _generate(self, *inputs, **kwargs):
        return self.module.generate(*inputs, **kwargs)


def init_inference(model: nn.Module, config=None, **kwargs) -> InferenceEngine:
    """DeepSpeed's `init_inference`: `config` (a dict or a JSON path) and keyword arguments
    (they win; the same key with another value in both is an error)."""
    return InferenceEngine(model, parse_config(config, **kwargs))


def _tensor_parallel_group(size: int):
    """This rank's group of `size` consecutive ranks (every rank makes every group, as
    torch.distributed asks)."""
    if not dist.is_initialized():
        raise RuntimeError(f"zero: init_inference with tensor_parallel.tp_size {size} needs "
                           "torch.distributed initialized first (deepspeed.init_distributed())")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"zero: init_inference tensor_parallel.tp_size {size} does not divide "
                         f"the {world} ranks")
    mine = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = group
    return mine


def _share_rng_state(group) -> None:
    """Every rank of the group samples with the first rank's generator (the device's, as
    DeepSpeed's accelerator RNG), so that sampled generation picks the same tokens on every
    slice."""
    source = dist.get_global_rank(group, 0)
    if torch.cuda.is_available():
        state = torch.cuda.get_rng_state().cuda()
        dist.broadcast(state, source, group=group)
        torch.cuda.set_rng_state(state.cpu())
    else:
        state = torch.get_rng_state()
        dist.broadcast(state, source, group=group)
        torch.set_rng_state(state)


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
