"""The model's tensors in the engine's dtypes, as DeepSpeed 0.19 casts them
(runtime/engine.py _cast_module_mixed_precision): the floating-point parameters in the training
dtype; the buffers in `data_types.buffer_dtype` when set, else as built (a rotary `inv_freq`
stays fp32 in a bf16 model). One exception to "as built": the running statistics of torch's
batch and instance norms follow their weights, which their kernels need (DeepSpeed 0.19.8 fails
there: "expected scalar type BFloat16 but found Float"). A forward that then fails on a dtype
mismatch is told about the buffers kept (mismatch_hint)."""
from __future__ import annotations

import re

import torch
from torch import nn

from .config.schema import DTYPE_SPELLINGS

# the training precisions' dtypes (the engine's, config.precision)
PRECISION_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# torch's messages for operands of two dtypes (matmul, linear, conv, add into an out tensor)
_DTYPE_MISMATCH = re.compile(r"same dtype|scalar type|type \(.*\) should be the same")


def torch_dtype(spelling: str) -> torch.dtype:
    """The torch dtype of a DeepSpeed dtype spelling ("bf16", "torch.float32", "half", ...)."""
    for short, spellings in DTYPE_SPELLINGS.items():
        if spelling in spellings:
            return PRECISION_DTYPES[short]
    raise ValueError(f"zero: {spelling!r} is not one of DeepSpeed's dtype spellings")


def buffer_dtype(config) -> torch.dtype | None:
    """The config's data_types.buffer_dtype as a torch dtype; None: the buffers keep theirs."""
    written = config.data_types.buffer_dtype
    return None if written is None else torch_dtype(written)


def cast(model: nn.Module, dtype: torch.dtype, buffer_dtype: torch.dtype | None) -> None:
    """Floating-point parameters to `dtype`; floating-point buffers to `buffer_dtype` when
    given, else only the norms' running statistics (to their module's `dtype`)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for module in model.modules():
            follows = buffer_dtype or (
                dtype if isinstance(module, nn.modules.batchnorm._NormBase) else None)
            if follows is None:
                continue
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None and buffer.is_floating_point() and buffer.dtype != follows:
                    setattr(module, name, buffer.to(follows))


def mismatch_hint(model: nn.Module, dtype: torch.dtype, error: RuntimeError) -> str | None:
    """What to do when the forward raised `error` on operands of two dtypes while the model
    holds floating-point buffers of another dtype than the training one; None otherwise."""
    if not _DTYPE_MISMATCH.search(str(error)):
        return None
    kept = [name for name, buffer in model.named_buffers()
            if buffer.is_floating_point() and buffer.dtype != dtype]
    if not kept:
        return None
    listed = ", ".join(kept[:4]) + (f" and {len(kept) - 4} more" if len(kept) > 4 else "")
    return (f"{error}\nzero: the model's buffers keep their dtype under mixed precision, as in "
            f"DeepSpeed 0.19 ({listed} not {dtype}): a forward that adds one to activations of "
            f"{dtype} (a positional encoding `x + self.pe`) turns them into its dtype. Cast them "
            f"too with \"data_types\": {{\"buffer_dtype\": \"{_short(dtype)}\"}}, or cast in the "
            f"forward")


def _short(dtype: torch.dtype) -> str:
    return next(short for short, known in PRECISION_DTYPES.items() if known == dtype)
