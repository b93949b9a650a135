"""DeepSpeed's activation checkpointing API (`deepspeed.checkpointing`): configure, checkpoint,
is_configured, reset, and the `activation_checkpointing` config block.

`checkpoint(function, *args)` runs `function` without keeping its activations and runs it
again in backward (torch.utils.checkpoint, reentrant as DeepSpeed's own CheckpointFunction, with
the RNG state restored so dropout draws the same). Under every ZeRO stage, tied weights
included: the engine adds up the gradient a shared weight receives from each recomputed region
before reducing it (GroupOptions::shared_params).

The options, as DeepSpeed reads them:

* cpu_checkpointing (configure's checkpoint_in_cpu): what a region keeps for backward (its
  inputs) waits in host memory, pinned on a GPU machine, and comes back for the recomputation.
  DeepSpeed applies it only together with partition_activations; zero applies it on its own.
* partition_activations: DeepSpeed splits each kept input over the model-parallel group.
  zero has no model parallelism yet (one model-parallel rank), so there is nothing to split:
  accepted, no effect, as in DeepSpeed without an mpu.
* contiguous_memory_optimization (with number_checkpoints): DeepSpeed copies partitioned
  inputs into one preallocated buffer; it needs partition_activations, as in DeepSpeed, and has
  no effect here (nothing is partitioned).
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

from .config.model import ActivationCheckpointingConfig as Settings
from .config.schema import ACTIVATION_CHECKPOINTING

DEFAULTS = Settings(**{key.name: key.default for key in ACTIVATION_CHECKPOINTING.keys})
_settings: Settings | None = None  # None until configure(): DeepSpeed's is_configured()


def configure(mpu_=None, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None) -> None:
    """DeepSpeed's configure: the config's `activation_checkpointing` block (a path, a dict or a
    zero config), then the arguments given. `mpu_` (model parallelism) must be None or report a
    model-parallel world size of 1."""
    global _settings
    _check_mpu(mpu_)
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


def checkpoint(function, *args, **kwargs):
    """Runs function(*args, **kwargs) keeping only its inputs for backward, where it runs again."""
    current = settings()
    if kwargs:
        names, count = tuple(kwargs), len(args)
        plain = function

        def function(*all_args):  # noqa: F811 -- keyword arguments passed positionally
            return plain(*all_args[:count], **dict(zip(names, all_args[count:])))
        args = args + tuple(kwargs.values())
    keep = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) \
        if current.cpu_checkpointing else contextlib.nullcontext()
    with _boundary(current, "forward"), keep:
        return torch_checkpoint(_timed_backward(function, current), *args, use_reentrant=True)


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


def _check_mpu(mpu) -> None:
    if mpu is None:
        return
    size = getattr(mpu, "get_model_parallel_world_size", None) or \
        getattr(mpu, "get_tensor_model_parallel_world_size", None)
    if size is not None and size() != 1:
        raise NotImplementedError(
            f"zero: deepspeed.checkpointing.configure got an mpu with model-parallel world size "
            f"{size()}; zero does not implement model parallelism yet (issue #22), so activations "
            "cannot be partitioned over it. Pass mpu_=None")


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
