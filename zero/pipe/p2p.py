"""Activations and their gradients between neighbouring stages, point to point.

An activation (one tensor or a tuple of tensors) goes as a fixed-size int64 header (count;
per tensor: dtype code, requires_grad, rank, shape) and then each tensor's bytes, so the
receiver needs nothing agreed in advance. Gradients go back without a header: the stage that
sent the activation knows the shapes and dtypes of the tensors that need one.

Sends are non-blocking (`dist.isend` on the world group: the returned handles keep the
buffers alive until `wait_all`), receives block. Bytes go as uint8, so every dtype (bf16
too) travels on gloo.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

HEADER = 64
MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32, torch.bool, torch.uint8, torch.int8, torch.int16)


class PendingSends:
    """The non-blocking sends of one batch; `wait_all` before their buffers may change."""

    def __init__(self):
        self._works: list = []

    def add(self, tensor: torch.Tensor, dst: int) -> None:
        self._works.append((dist.isend(tensor, dst), tensor))

    def wait_all(self) -> None:
        for work, _ in self._works:
            work.wait()
        self._works = []


def as_tuple(value) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in value):
        return tuple(value)
    raise TypeError(f"zero: a pipeline stage must return a tensor or a tuple of tensors to the "
                    f"next stage, got {type(value).__name__}")


def _header(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    fields = [len(tensors)]
    for tensor in tensors:
        if tensor.dim() > MAX_DIMS:
            raise ValueError(f"zero: a pipeline activation of {tensor.dim()} dimensions; at "
                             f"most {MAX_DIMS} are sent")
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"zero: a pipeline activation of dtype {tensor.dtype}; sendable: "
                            f"{[str(d) for d in _DTYPES]}")
        fields += [_DTYPES.index(tensor.dtype), int(tensor.requires_grad), tensor.dim(),
                   *tensor.shape]
    if len(fields) > HEADER:
        raise ValueError(f"zero: a pipeline activation of {len(tensors)} tensors is too many "
                         f"to describe in {HEADER} header fields; pack them into fewer tensors")
    return torch.tensor(fields + [0] * (HEADER - len(fields)), dtype=torch.int64)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def send_activation(value, dst: int, sends: PendingSends) -> None:
    tensors = as_tuple(value)
    sends.add(_header(tensors), dst)
    for tensor in tensors:
        sends.add(_raw(tensor), dst)


def recv_activation(src: int, device: torch.device):
    """The tensors the previous stage sent, as leaves; float ones that required grad there
    require grad here. A single tensor comes back as a tensor, several as a tuple."""
    header = torch.empty(HEADER, dtype=torch.int64)
    dist.recv(header, src)
    tensors = _described(header, device)
    for tensor in tensors:
        dist.recv(_raw(tensor), src)
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _described(header: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """Empty tensors as `header` describes them (dtype, requires_grad, shape)."""
    fields, at, tensors = header.tolist(), 1, []
    for _ in range(fields[0]):
        dtype, requires_grad, ndim = _DTYPES[fields[at]], bool(fields[at + 1]), fields[at + 2]
        shape = fields[at + 3:at + 3 + ndim]
        at += 3 + ndim
        tensors.append(torch.empty(shape, dtype=dtype, device=device)
                       .requires_grad_(requires_grad))
    return tensors


def broadcast_value(value, src: int, group, device: torch.device,
                    failure: Exception | None = None):
    """`value` (a tensor or a tuple of tensors, given on rank `src`) on every rank of `group`,
    detached. A value that cannot be sent, or `src`'s `failure` to make it, raises on every
    rank of the group, not only on `src`, so that none of them waits for it."""
    header = torch.full((HEADER,), -1, dtype=torch.int64)
    if dist.get_rank() == src:
        try:
            if failure is not None:
                raise failure
            tensors = tuple(t.detach() for t in as_tuple(value))
            header = _header(tensors)
        except Exception:
            dist.broadcast(header, src, group=group)
            raise
    dist.broadcast(header, src, group=group)
    if header[0].item() < 0:
        raise TypeError(f"zero: the value rank {src} broadcasts cannot be sent (a tensor or a "
                        "tuple of tensors); its error says why")
    if dist.get_rank() != src:
        tensors = tuple(t.requires_grad_(False) for t in _described(header, device))
    for tensor in tensors:
        dist.broadcast(_raw(tensor), src, group=group)
    return tensors[0] if len(tensors) == 1 else tensors


def send_grads(grads: list[torch.Tensor], dst: int, sends: PendingSends) -> None:
    for grad in grads:
        sends.add(_raw(grad), dst)


def recv_grads(like: list[torch.Tensor], src: int) -> list[torch.Tensor]:
    """Gradients for `like` (this stage's outputs that require grad), in their order."""
    grads = []
    for tensor in like:
        grad = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        dist.recv(grad.reshape(-1).view(torch.uint8), src)
        grads.append(grad)
    return grads


def needing_grad(value) -> list[torch.Tensor]:
    return [t for t in as_tuple(value) if t.requires_grad]
