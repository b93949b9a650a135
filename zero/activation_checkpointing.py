"""DeepSpeed's activation checkpointing API (`deepspeed.checkpointing`): configure, checkpoint,
is_configured, reset, and the `activation_checkpointing` config block.

`checkpoint(function, *args)` runs `function` without keeping its activations and runs it
again in backward (torch.utils.checkpoint, reentrant as DeepSpeed's own CheckpointFunction, with
the RNG state restored so dropout draws the same, the model-parallel tracker's states too:
rng_tracker.py). Under every ZeRO stage, tied weights
included: the engine adds up the gradient a shared weight receives from each recomputed region
before reducing it (GroupOptions::shared_params).

The options, as DeepSpeed reads them:

* cpu_checkpointing (configure's checkpoint_in_cpu): what a region keeps for backward (its
  inputs) waits in host memory, pinned on a GPU machine, and comes back for the recomputation.
  DeepSpeed applies it only together with partition_activations; zero applies it on its own.
* partition_activations: with configure's mpu (Megatron's tensor group: the ranks that hold
  the same inputs), each floating tensor a region keeps is kept as this rank's 1/T of it and
  all-gathered back for the recomputation (with cpu_checkpointing the slice waits in host
  memory); a tensor T does not divide is kept whole (DeepSpeed asserts). Without an mpu, or
  with one tensor rank, nothing is split, as in DeepSpeed.
* contiguous_memory_optimization (with number_checkpoints): DeepSpeed copies partitioned
  inputs into one preallocated buffer; it needs partition_activations, as in DeepSpeed, and has
  no effect here (each slice is its own tensor).
* synchronize_checkpoint_boundary: synchronizes the GPU at every region's start and end.
* profile: prints each region's forward and backward time on rank 0.

Like DeepSpeed's, the settings are the module's: one set per process, changed by configure().
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from . import rng_tracker, saved_activations
from .config.model import ActivationCheckpointingConfig as Settings
from .config.schema import ACTIVATION_CHECKPOINTING
from .parallel.mpu_grid import TensorSlice, tensor_slice

DEFAULTS = Settings(**{key.name: key.default for key in ACTIVATION_CHECKPOINTING.keys})
_settings: Settings | None = None  # None until configure(): DeepSpeed's is_configured()
_tensor: TensorSlice | None = None  # configure's mpu: its tensor group, rank and size


def configure(mpu_=None, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None) -> None:
    """DeepSpeed's configure: the config's `activation_checkpointing` block (a path, a dict or a
    zero config), then the arguments given. `mpu_`: the script's model-parallel unit, whose
    tensor group partition_activations splits over and whose tensor rank
    model_parallel_cuda_manual_seed seeds by (kept from an earlier call when None)."""
    global _settings, _tensor
    if mpu_ is not None:
        _tensor = tensor_slice(mpu_)
    given = {"partition_activations": partition_activations,
             "contiguous_memory_optimization": contiguous_checkpointing,
             "number_checkpoints": num_checkpoints, "cpu_checkpointing": checkpoint_in_cpu,
             "synchronize_checkpoint_boundary": synchronize, "profile": profile}
    base = settings_from_config(deepspeed_config) if deepspeed_config is not None else DEFAULTS
    chosen = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if chosen.contiguous_memory_optimization and not chosen.partition_activations:
        raise ValueError("zero: activation_checkpointing.contiguous_memory_optimization needs "
                         "partition_activations true (as in DeepSpeed); set both or neither")
    if chosen.contiguous_memory_optimization and chosen.number_checkpoints is None:
        raise ValueError("zero: activation_checkpointing.contiguous_memory_optimization needs "
                         "number_checkpoints (the number of checkpointed regions per forward)")
    _settings = chosen


def is_configured() -> bool:
    return _settings is not None


def settings() -> Settings:
    """The settings checkpoint() uses: configure()'s, or the defaults (schema.py's)."""
    return _settings or DEFAULTS


def reset() -> None:
    """DeepSpeed frees its contiguous buffers here (after forwards without backward); zero
    keeps none, so there is nothing to free."""


def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    global _settings
    _settings = dataclasses.replace(settings(), partition_activations=bool(partition_activation))


def set_num_layers(nlayers: int) -> None:
    global _settings
    _settings = dataclasses.replace(settings(), number_checkpoints=nlayers)


def tensor_rank() -> int:
    """configure's mpu's tensor rank (0 without one, as DeepSpeed's bwc helper)."""
    return _tensor.rank if _tensor is not None else 0


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """DeepSpeed's (rng_tracker.py), by configure's mpu's tensor rank."""
    rng_tracker.model_parallel_cuda_manual_seed(seed, tensor_rank())


def model_parallel_reconfigure_tp_seed(seed: int) -> None:
    rng_tracker.model_parallel_reconfigure_tp_seed(seed, tensor_rank())


def checkpoint(function, *args, **kwargs):
    """Runs function(*args, **kwargs) keeping only its inputs for backward, where it runs again."""
    current = settings()
    if kwargs:
        names, count = tuple(kwargs), len(args)
        plain = function

        def function(*all_args):  # noqa: F811 -- keyword arguments passed positionally
            return plain(*all_args[:count], **dict(zip(names, all_args[count:])))
        args = args + tuple(kwargs.values())
    with _boundary(current, "forward"), saved_inputs_hooks(current):
        return torch_checkpoint(_timed_backward(_tracker_replayed(function), current), *args,
                                use_reentrant=True)


def non_reentrant_checkpoint(function, *args):
    """DeepSpeed's: checkpoint() through torch's non-reentrant checkpoint, so a region whose
    inputs need no gradient still gives its weights theirs (DeepSpeed's pipeline engine uses
    it with `"pipeline": {"use_reentrant": false}`). The recomputation replays dropout and the
    model-parallel tracker's states as checkpoint() does. cpu_checkpointing and
    partition_activations keep a region's inputs, which this form does not keep apart: they
    are refused here."""
    current = settings()
    partitioned = current.partition_activations and _tensor is not None and _tensor.size > 1
    if current.cpu_checkpointing or partitioned:
        raise NotImplementedError(
            "zero: non_reentrant_checkpoint keeps what its region saves as torch does; the "
            "activation_checkpointing options cpu_checkpointing and partition_activations "
            "work with deepspeed.checkpointing.checkpoint: use it, or turn them off")
    tracker = rng_tracker.get_cuda_rng_tracker()

    def contexts():  # at the forward: what its recomputation restores
        return contextlib.nullcontext(), _Recomputing(current, tracker, tracker.get_states())
    with _boundary(current, "forward"):
        return torch_checkpoint(function, *args, use_reentrant=False, context_fn=contexts)


class _Recomputing:
    """Around each recomputation of a non-reentrant region (one per backward through it):
    the tracker's states as at its forward, the ones of the moment put back after."""

    def __init__(self, current: Settings, tracker, at_forward: dict):
        self._current, self._tracker, self._at_forward = current, tracker, at_forward
        self._entered: list = []  # (tracker states, boundary) of each entry not yet left

    def __enter__(self):
        boundary = _boundary(self._current, "recompute")
        now = self._tracker.get_states()
        self._tracker.set_states(dict(self._at_forward))
        try:
            boundary.__enter__()
        except BaseException:
            self._tracker.set_states(now)
            raise
        self._entered.append((now, boundary))

    def __exit__(self, *error):
        now, boundary = self._entered.pop()
        try:
            boundary.__exit__(*error)
        finally:
            self._tracker.set_states(now)


def detach_variable(inputs: tuple, device=None) -> tuple:
    """DeepSpeed's helper (torch's former checkpoint one): each tensor of `inputs` detached
    (moved to `device` when given), keeping whether it requires grad; anything else as is."""
    if not isinstance(inputs, tuple):
        raise RuntimeError(f"zero: detach_variable takes a tuple of tensors, not "
                           f"{type(inputs).__name__}")
    detached = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            moved = item if device is None else item.to(device=device)
            item = moved.detach()
            item.requires_grad = moved.requires_grad
        detached.append(item)
    return tuple(detached)


def saved_inputs_hooks(current: Settings):
    """Where a region's kept inputs wait for backward: this rank's share of each
    (partition_activations over configure's tensor group), host memory (cpu_checkpointing),
    or as they are."""
    if current.partition_activations and _tensor is not None and _tensor.size > 1:
        return PartitionedInputs(_tensor, to_host=current.cpu_checkpointing)
    if current.cpu_checkpointing:
        return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
    return contextlib.nullcontext()


class PartitionedInputs(torch.autograd.graph.saved_tensors_hooks):
    """partition_activations: the tensor ranks hold the same inputs, so each keeps its 1/T of
    every floating tensor a region saves (on the host with to_host) and the recomputation
    all-gathers it back; a tensor T does not divide is kept whole (on the host with to_host).
    What stays on the device is recorded into the memory report's activation count
    (saved_activations.record), which an inner hook hides otherwise."""

    def __init__(self, tensor: TensorSlice, to_host: bool):
        def pack(saved):
            whole = not saved.is_floating_point() or saved.numel() % tensor.size
            if to_host:
                kept = saved.to("cpu") if whole else \
                    saved.detach().reshape(-1).chunk(tensor.size)[tensor.rank].to("cpu")
            else:
                kept = saved if whole else \
                    saved.detach().reshape(-1).chunk(tensor.size)[tensor.rank].clone()
                saved_activations.record(kept)  # what stays on the device, for the report
            return (kept, saved.device) if whole else (kept, saved.shape, saved.device)

        def unpack(packed):
            if len(packed) == 2:  # whole (in host memory with to_host)
                return packed[0].to(packed[1])
            share, shape, device = packed
            share = share.to(device)
            whole = torch.empty(share.numel() * tensor.size, dtype=share.dtype, device=device)
            dist.all_gather_into_tensor(whole, share, group=tensor.group)
            return whole.view(shape)

        super().__init__(pack, unpack)


def settings_from_config(config) -> Settings:
    """The `activation_checkpointing` block of a config: zero's validated config, or a
    DeepSpeed config as a dict or a JSON path (validated here, for this world's data ranks)."""
    if not hasattr(config, "activation_checkpointing"):
        from .config import load_config, read_config
        from .tp import setup as tp_setup

        data, every = 1, None  # the batch keys count data ranks, as initialize's
        if dist.is_initialized():
            data, every = tp_setup.batch_ranks(dist.get_world_size(),
                                               tp_setup.requested_size(read_config(config), None))
        config = load_config(config, world_size=data, all_ranks=every)
    return config.activation_checkpointing


@contextlib.contextmanager
def _boundary(current: Settings, phase: str):
    """synchronize_checkpoint_boundary and profile around one region's forward or backward."""
    if current.synchronize_checkpoint_boundary and torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if current.synchronize_checkpoint_boundary and torch.cuda.is_available():
            torch.cuda.synchronize()
        if current.profile and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"time (ms) | checkpoint {phase}: {1000 * (time.perf_counter() - start):.2f}",
                  flush=True)


def _tracker_replayed(function):
    """function, whose recomputation in backward draws from the model-parallel tracker's
    states as they were at its forward (DeepSpeed's CheckpointFunction); the tracker is put
    back after it."""
    tracker = rng_tracker.get_cuda_rng_tracker()
    at_forward = tracker.get_states()

    def run(*args):
        if not torch.is_grad_enabled():  # the forward itself
            return function(*args)
        now = tracker.get_states()
        tracker.set_states(dict(at_forward))
        try:
            return function(*args)
        finally:
            tracker.set_states(now)
    return run


def _timed_backward(function, current: Settings):
    """function, with its recomputation in backward under _boundary (torch's reentrant
    checkpoint calls it again with grad enabled)."""
    if not (current.profile or current.synchronize_checkpoint_boundary):
        return function

    def run(*args):
        if not torch.is_grad_enabled():  # the forward: timed by checkpoint() itself
            return function(*args)
        with _boundary(current, "recompute"):
            return function(*args)
    return run
