"""Activation memory from a sample input, before any run: the model is built and run once on
fake tensors (torch's FakeTensorMode: CPU tensors with shapes, dtypes and strides but no
memory, dispatched to the same kernels a real CPU forward uses) while a saved-tensors hook
records every tensor autograd keeps for backward. Their distinct storages, minus the
parameters', are the activations one micro-batch holds at the end of forward: the peak of
what backward needs, per rank (every rank runs its own micro-batch). Tests check it against
real forwards byte for byte.

    zero-mem estimate --model pkg.mod:factory --sample-input 4x128:int64 --sample-input 4x128:int64

Not included: temporaries freed during forward, autograd's gradient buffers in backward, and
memory a custom kernel allocates outside autograd.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..saved_activations import SavedActivations

_DTYPES = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32,
           "fp32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16, "bool": torch.bool}
_SPEC = re.compile(r"^(?P<shape>\d+(x\d+)*)(:(?P<dtype>\w+))?$")


class ActivationError(ValueError):
    pass


@dataclass(frozen=True)
class SampleInput:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def parse(cls, text: str) -> "SampleInput":
        """'4x128:int64' (dtype defaults to float32)."""
        match = _SPEC.match(text.strip())
        if not match:
            raise ActivationError(f"sample input {text!r}: expected SHAPE[:DTYPE] like "
                                  f"'4x128:int64' (dtypes: {', '.join(sorted(_DTYPES))})")
        dtype = match.group("dtype") or "float32"
        if dtype not in _DTYPES:
            raise ActivationError(f"sample input {text!r}: unknown dtype {dtype!r}; use one of "
                                  f"{', '.join(sorted(_DTYPES))}")
        return cls(tuple(int(n) for n in match.group("shape").split("x")), _DTYPES[dtype])

    def tensor(self, device) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        return torch.zeros(self.shape, dtype=self.dtype, device=device)


def saved_activation_bytes(model: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves for backward during model(*inputs),
    parameters' storages excluded. Works on meta tensors (nothing is allocated) and on real
    ones alike."""
    with torch.enable_grad(), SavedActivations(model).counting() as counter:
        model(*inputs)
    return counter.bytes


def estimate_activations(factory, samples: list[SampleInput], dtype: torch.dtype) -> int:
    """The activations of the model `factory()` builds, for one micro-batch of `samples`, with
    parameters in the training dtype. Nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not samples:
        raise ActivationError("no sample input given")
    previous = torch.get_default_dtype()
    with FakeTensorMode():
        torch.set_default_dtype(dtype)  # the factory's parameters come out in the training dtype
        try:
            model = factory()
        finally:
            torch.set_default_dtype(previous)
        inputs = [s.tensor("cpu") for s in samples]
        try:
            return saved_activation_bytes(model, inputs)
        except Exception as exc:  # the model's own forward failed on these shapes
            raise ActivationError(f"the model's forward failed on the sample input "
                                  f"{[tuple(s.shape) for s in samples]}: {exc}") from exc
