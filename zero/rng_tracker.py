"""DeepSpeed's model-parallel RNG tracker (`deepspeed.checkpointing.get_cuda_rng_tracker`,
`model_parallel_cuda_manual_seed`), as Megatron-style tensor-parallel layers use it: named
random-number states kept apart from the default one, so that dropout inside a tensor-parallel
region draws differently on each tensor rank while dropout outside draws alike.

The states are the accelerator's generator's: the current CUDA device's on a GPU machine,
torch's CPU generator otherwise (DeepSpeed's CPU accelerator does the same). `fork(name)`
swaps a named state in for the region and keeps where it got to; checkpoint()
(activation_checkpointing.py) puts every named state back for the recomputation, as
DeepSpeed's CheckpointFunction does.
"""
from __future__ import annotations

import contextlib
import copy

import torch

MODEL_PARALLEL_RNG = "model-parallel-rng"  # DeepSpeed's _MODEL_PARALLEL_RNG_TRACKER_NAME
SEED_OFFSET = 2718  # DeepSpeed's: the tensor-parallel seed is seed + 2718 + tensor rank


def get_rng_state(device_index: int | None = None) -> torch.Tensor:
    """The accelerator generator's state: a CUDA device's (the current one by default), else
    the CPU's. (The compat get_accelerator() answers with these too.)"""
    if torch.cuda.is_available():
        return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device_index: int | None = None) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state, "cuda" if device_index is None else device_index)
    else:
        torch.set_rng_state(state)


def manual_seed(seed: int) -> None:
    """Seeds the accelerator's generator only (DeepSpeed's get_accelerator().manual_seed)."""
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


class RngStatesTracker:
    """DeepSpeed's CudaRNGStatesTracker: name -> generator state, each seeded once."""

    def __init__(self):
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A copy of the mapping (fork replaces a state rather than changing it, so the copy
        keeps the states as they are now)."""
        return copy.copy(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        """A state named `name`, the generator's after manual_seed(seed); the generator itself
        is left as it was."""
        if seed in self.seeds_:
            raise ValueError(f"zero: RNG seed {seed} is already tracked; give each state its "
                             "own seed")
        if name in self.states_:
            raise ValueError(f"zero: RNG state {name!r} is already tracked; reset() the "
                             "tracker first, or use another name")
        self.seeds_.add(seed)
        outer = get_rng_state()
        manual_seed(seed)
        self.states_[name] = get_rng_state()
        set_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG):
        """Draws from state `name` inside the block; the generator's own state is back after
        it, and `name` keeps where the block left it."""
        if name not in self.states_:
            raise KeyError(f"zero: RNG state {name!r} is not tracked; call "
                           "model_parallel_cuda_manual_seed(seed) or add() it first")
        outer = get_rng_state()
        set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = get_rng_state()
            set_rng_state(outer)


_TRACKER = RngStatesTracker()


def get_cuda_rng_tracker() -> RngStatesTracker:
    """The process's tracker (DeepSpeed keeps one per process too)."""
    return _TRACKER


def model_parallel_cuda_manual_seed(seed: int, tensor_rank: int) -> None:
    """DeepSpeed's: the generator seeded with `seed` (alike on a data-parallel group's tensor
    ranks) and the tracker's model-parallel state with seed + 2718 + tensor rank (different
    on every tensor rank)."""
    _TRACKER.reset()
    manual_seed(seed)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + SEED_OFFSET + tensor_rank)


def model_parallel_reconfigure_tp_seed(seed: int, tensor_rank: int) -> None:
    """DeepSpeed's: re-seeds the model-parallel state alone."""
    with _TRACKER.fork():
        manual_seed(seed + SEED_OFFSET + tensor_rank)
