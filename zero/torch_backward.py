"""DeepSpeed's PyTorch-style backward (0.18 and later): `loss.backward()` on a loss computed
from the engine's forward, then `engine.step()`, as a plain PyTorch loop does; with a loss
scale (fp16) `engine.scale(loss).backward()`.

The engine's forward puts a gradient hook on each output tensor that needs a gradient. The
first hook a backward reaches opens the engine's backward (what `engine.backward` does before
autograd: the accumulation boundary, the C++ `prepare_backward`) and queues its close at the
end of autograd's pass (`finish_backward`: the units not yet reduced are launched, and every
reduction waited for). Each hook divides its gradient by gradient_accumulation_steps, where
`engine.backward` divides the loss. A backward `engine.backward` runs itself passes the hooks
untouched. A part of the loss that does not come through the forward's outputs is not
divided, as in DeepSpeed.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Mapping

import torch


def output_tensors(outputs):
    """The tensors in `outputs` (nested tuples, lists, dicts, HF ModelOutputs) that backward
    can reach."""
    if isinstance(outputs, torch.Tensor):
        if outputs.requires_grad:
            yield outputs
    elif isinstance(outputs, Mapping):
        for value in outputs.values():
            yield from output_tensors(value)
    elif isinstance(outputs, (tuple, list)):
        for value in outputs:
            yield from output_tensors(value)


class TorchStyleBackward:
    """One engine's hooks. `open_backward()` returns the boundary flag it opened with;
    `close_backward(boundary)` finishes it; `accumulation_steps()` and `needs_scale()` (a loss
    scaler is on) are read at each backward."""

    def __init__(self, open_backward, close_backward, accumulation_steps, needs_scale):
        # weak: the hooks live on tensors that may outlive the engine
        self._open = weakref.WeakMethod(open_backward)
        self._close = weakref.WeakMethod(close_backward)
        self._accumulation_steps = weakref.WeakMethod(accumulation_steps)
        self._needs_scale = weakref.WeakMethod(needs_scale)
        self._engine_backward = False  # engine.backward runs autograd itself
        self._open_boundary = None     # the boundary of the open torch-style backward
        self._scaled = False           # engine.scale(loss) was called for the next one

    def attach(self, outputs) -> None:
        """Hooks the forward's outputs (nothing when no gradient can flow)."""
        if not torch.is_grad_enabled():
            return
        for tensor in output_tensors(outputs):
            tensor.register_hook(functools.partial(TorchStyleBackward._on_grad,
                                                   weakref.ref(self)))

    @contextlib.contextmanager
    def engine_backward(self):
        """Around engine.backward's own autograd call: the hooks let gradients pass."""
        self._engine_backward = True
        try:
            yield
        finally:
            self._engine_backward = False

    def expect_scaled(self) -> None:
        """engine.scale(loss): the next torch-style backward carries the loss scale."""
        self._scaled = True

    @staticmethod
    def _on_grad(ref, grad):
        self = ref()
        if self is None or self._engine_backward or self._open() is None:
            return grad
        if self._open_boundary is None:
            self._begin()
        return grad / self._accumulation_steps()()

    def _begin(self) -> None:
        if self._needs_scale()() and not self._scaled:
            raise RuntimeError(
                "zero: this config scales the loss (fp16), and loss.backward() was called on an "
                "unscaled loss: call engine.backward(loss), or engine.scale(loss).backward()")
        self._scaled = False
        self._open_boundary = self._open()()
        torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _end(self) -> None:
        boundary, self._open_boundary = self._open_boundary, None
        close = self._close()
        if close is not None:
            close(boundary)
