"""DeepSpeed's PyTorch-style backward (0.18 and later): `loss.backward()` on a loss computed
from the engine's forward, then `engine.step()`, as a plain PyTorch loop does; with a loss
scale (fp16) `engine.scale(loss).backward()`.

Each autograd pass (`torch._C._current_graph_task_id()`) is the engine's or not:

  - The engine's forward puts a gradient hook on each output tensor autograd made. The first
    one a pass reaches, in a pass the engine has not opened itself, opens the engine's
    backward for it (the accumulation boundary, the C++ `prepare_backward`) and queues its
    close at the pass's end (`finish_backward`: the units not yet reduced are launched, and
    every reduction waited for).
  - Each trainable parameter's gradient hook divides what it receives by
    gradient_accumulation_steps in a pass opened that way, where `engine.backward` divides
    the loss. Dividing at the parameters, not at the outputs, divides once however the
    outputs feed each other (an HF output's loss computed from its logits).
  - A pass `engine.backward` runs is marked by a hook on its scaled loss, the first gradient
    of the pass: for that engine nothing more happens; another engine whose outputs the pass
    reaches opens its own backward but divides nothing (the loss already was), as DeepSpeed's
    graph tracker does.

A pass that raised leaves the C++ backward open: the next one is refused there, naming it. A
part of the loss that does not come through the forward's outputs is divided all the same.
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping

import torch

_DIVIDED_PASSES: set[int] = set()  # passes whose loss an engine.backward divided already


def current_pass() -> int:
    return torch._C._current_graph_task_id()


def output_tensors(outputs):
    """The tensors in `outputs` (nested tuples, lists, dicts, HF ModelOutputs) that autograd
    made in this forward (not parameters or inputs handed back)."""
    if isinstance(outputs, torch.Tensor):
        if outputs.grad_fn is not None:
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
    scaler is on) are read at each pass."""

    def __init__(self, params, open_backward, close_backward, accumulation_steps, needs_scale):
        # weak: the hooks live on tensors and parameters that may outlive the engine
        self._open = weakref.WeakMethod(open_backward)
        self._close = weakref.WeakMethod(close_backward)
        self._accumulation_steps = weakref.WeakMethod(accumulation_steps)
        self._needs_scale = weakref.WeakMethod(needs_scale)
        self._open_pass = None       # the pass this engine's backward is open for
        self._in_engine_backward = False  # engine.backward runs, its pass not yet seen
        self._scaled_pass = None     # the pass engine.scale(loss)'s tensor started
        this = weakref.ref(self)
        self._param_hooks = [p.register_hook(functools.partial(_divide, this)) for p in params]

    def attach(self, outputs) -> None:
        """Hooks the forward's outputs (nothing when no gradient can flow)."""
        if not torch.is_grad_enabled():
            return
        this = weakref.ref(self)
        for tensor in output_tensors(outputs):
            tensor.register_hook(functools.partial(_output_reached, this))

    def mark_engine_backward(self, loss: torch.Tensor) -> None:
        """Before engine.backward runs autograd from `loss` (scaled, divided): its pass is this
        engine's own, its loss divided. The hook on `loss` marks the pass for other engines;
        this engine's own output hooks may run first (when `loss` is the forward's output
        itself), so they claim the pass too."""
        self._in_engine_backward = True
        loss.register_hook(functools.partial(_engine_pass_starts, weakref.ref(self)))

    def engine_backward_done(self) -> None:
        _DIVIDED_PASSES.discard(self._open_pass)
        self._open_pass, self._in_engine_backward = None, False

    def _claim_engine_pass(self, task: int) -> None:
        self._open_pass = task
        _DIVIDED_PASSES.add(task)

    def mark_scaled(self, scaled: torch.Tensor) -> None:
        """engine.scale(loss): a pass started from `scaled` carries the loss scale."""
        scaled.register_hook(functools.partial(_scaled_pass_starts, weakref.ref(self)))

    def detach(self) -> None:
        for handle in self._param_hooks:
            handle.remove()
        self._param_hooks = []

    def _begin(self, task: int) -> None:
        if self._needs_scale()() and self._scaled_pass != task:
            raise RuntimeError(
                "zero: this config scales the loss (fp16), and loss.backward() was called on an "
                "unscaled loss: call engine.backward(loss), or engine.scale(loss).backward()")
        boundary = self._open()()
        self._open_pass = task
        torch.autograd.Variable._execution_engine.queue_callback(
            functools.partial(self._end, boundary))

    def _end(self, boundary: bool) -> None:
        self._open_pass = self._scaled_pass = None
        close = self._close()
        if close is not None:
            close(boundary)


def _output_reached(ref, grad):
    self = ref()
    if self is not None and self._open() is not None:
        task = current_pass()
        if self._in_engine_backward and self._open_pass is None:
            self._claim_engine_pass(task)
        elif self._open_pass != task:
            self._begin(task)
    return grad


def _divide(ref, grad):
    """In a pass this engine opened torch-style, whose loss no engine.backward divided."""
    self = ref()
    task = current_pass()
    # (None: a custom autograd function gave this output no gradient)
    if grad is None or self is None or self._open_pass != task or task in _DIVIDED_PASSES:
        return grad
    return grad / self._accumulation_steps()()


def _engine_pass_starts(ref, grad):
    self = ref()
    if self is not None:
        self._claim_engine_pass(current_pass())
    return grad


def _scaled_pass_starts(ref, grad):
    self = ref()
    if self is not None:
        self._scaled_pass = current_pass()
    return grad
