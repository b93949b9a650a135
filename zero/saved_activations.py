"""Activation memory, measured: the bytes autograd keeps for backward during a forward.

While counting, a saved-tensors hook sees every tensor autograd saves; the distinct storages
among them, parameters excluded, are what one micro-batch's forward leaves alive for its
backward. Activation checkpointing shows here as the bytes it did not keep: a checkpointed
region saves only its inputs. The estimator (`zero/reports/activations.py`) counts the same
on fake tensors, the engine on the real forward when memory reports are on.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


_THREAD = threading.local()  # .counts: this thread's counts in progress (autograd's hooks
#                              are per thread too), innermost last


def _counts() -> list:
    if not hasattr(_THREAD, "counts"):
        _THREAD.counts = []
    return _THREAD.counts


def record(tensor: torch.Tensor) -> None:
    """What an inner saved-tensors hook keeps on the device in a tensor's place (activation
    checkpointing's partition_activations share): the count in progress does not see it
    otherwise, since only the innermost hook runs."""
    counts = _counts()
    if counts:
        counts[-1](tensor)


class SavedActivations:
    """Counts what autograd saves inside `counting()`; `bytes` is the last count."""

    def __init__(self, model: nn.Module):
        self._model = model
        self.bytes = 0

    @contextlib.contextmanager
    def counting(self):
        # Parameters are not activations: not the model's storages at entry (stages 0-2), nor
        # a Parameter saved as it is. Stage 3 gathers into buffers of its own, which autograd
        # saves views of (a linear's weight.t()): they are measured when the count ends, by
        # then freed in place (0 bytes) or, kept gathered for backward, a parameter's storage.
        # The entry storages are held, so that no new storage takes one's address (stage 3
        # swaps its parameters' empty storages for the gathered buffers during forward).
        params = {storage_key(p): p.untyped_storage() for p in self._model.parameters()}
        saved: dict[int, torch.UntypedStorage] = {}

        def pack(tensor):
            key = storage_key(tensor)
            if key not in params and not isinstance(tensor, nn.Parameter):
                saved[key] = tensor.untyped_storage()
            return tensor

        _counts().append(pack)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                yield self
        finally:
            _counts().remove(pack)
            gathered = {storage_key(p) for p in self._model.parameters()}
            self.bytes = sum(storage.nbytes() for key, storage in saved.items()
                             if key not in gathered)
