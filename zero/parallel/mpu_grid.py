"""A script's own model-parallel unit (`deepspeed.initialize(mpu=...)`) as zero's grid.

Megatron-LM's `parallel_state`, Megatron-DeepSpeed's `mpu` and DeepSpeed's AutoTP example
build their process groups themselves and hand the engine an object that answers for them.
DeepSpeed reads it by these methods (its `utils/bwc.py` and `utils/groups.py`):

  - `get_data_parallel_group/_rank/_world_size`: the ranks ZeRO shards over;
  - `get_model_parallel_group/_rank/_world_size`: every rank of one model replica (the
    gradient norm is summed over it; checkpoint files are named by its rank);
  - the tensor slice by the first of `get_tensor_model_parallel_*` (Megatron today),
    `get_slice_parallel_*` (DeepSpeed's pipeline grid), `get_model_parallel_*` (older
    Megatron); pipeline stages by `get_pipeline_model_parallel_world_size` or
    `get_pipe_parallel_world_size`.

`MpuGrid` reads those once into a PipelineParallelGrid of one stage (grid.py), whose
accessors zero's engine, norm span and checkpoints read. Pipeline stages come from a
PipelineModule's own topology, so an mpu with more than one is refused. The parameters the
script's layers split say so as Megatron's do (`tensor_model_parallel`, `partition_dim`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from .grid import PipelineParallelGrid

_REQUIRED = ("get_data_parallel_group", "get_data_parallel_rank",
             "get_data_parallel_world_size", "get_model_parallel_group",
             "get_model_parallel_rank", "get_model_parallel_world_size")
_TENSOR_SPELLINGS = ("tensor_model_parallel", "slice_parallel", "model_parallel")
_PIPELINE_SIZES = ("get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size")


class MpuError(ValueError):
    """The mpu passed to initialize() cannot describe this run."""


@dataclass(frozen=True)
class TensorSlice:
    """An mpu's tensor-parallel group, this rank in it and its size."""
    group: object
    rank: int
    size: int


def tensor_slice(mpu) -> TensorSlice:
    """The mpu's tensor group by the first spelling it answers (as DeepSpeed's bwc helpers
    read it)."""
    spelling = next((s for s in _TENSOR_SPELLINGS
                     if all(callable(getattr(mpu, f"get_{s}_{what}", None))
                            for what in ("group", "rank", "world_size"))), None)
    if spelling is None:
        raise MpuError(f"the mpu ({type(mpu).__name__}) answers none of "
                       f"{[f'get_{s}_group/_rank/_world_size' for s in _TENSOR_SPELLINGS]}")
    return TensorSlice(getattr(mpu, f"get_{spelling}_group")(),
                       getattr(mpu, f"get_{spelling}_rank")(),
                       getattr(mpu, f"get_{spelling}_world_size")())


class MpuGrid(PipelineParallelGrid):
    """A PipelineParallelGrid of one stage whose groups and ranks are `mpu`'s (read once, on
    construction; nothing is created). The mesh arithmetic (`stage_to_global`) does not
    apply: the mpu's rank layout is its own."""

    def __init__(self, mpu):  # the base class's __init__ creates groups: not called
        missing = [name for name in _REQUIRED if not callable(getattr(mpu, name, None))]
        if missing:
            raise MpuError(f"zero.initialize: the mpu ({type(mpu).__name__}) has no {missing}; "
                           "a model-parallel unit answers DeepSpeed's get_data_parallel_* and "
                           "get_model_parallel_* (group, rank, world_size) for this rank")
        self.mpu, self.mesh = mpu, None
        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stage_id, self.pipe_parallel_size = 0, 1
        self.is_first_stage = self.is_last_stage = True
        self.prev_stage_rank = self.next_stage_rank = None
        self.dp_proc_group = mpu.get_data_parallel_group()
        self.data_parallel_id = mpu.get_data_parallel_rank()
        self.data_parallel_size = mpu.get_data_parallel_world_size()
        self.mp_proc_group = mpu.get_model_parallel_group()
        self.mp_group = dist.get_process_group_ranks(self.mp_proc_group)
        self.pp_proc_group, self.pp_group = None, [self.global_rank]
        tensor = tensor_slice(mpu)
        self.tp_proc_group, self.tensor_parallel_id = tensor.group, tensor.rank
        self.tensor_parallel_size = tensor.size
        self.tp_group = dist.get_process_group_ranks(self.tp_proc_group)
        self.dp_group = dist.get_process_group_ranks(self.dp_proc_group)
        self._check(mpu.get_model_parallel_rank(), mpu.get_model_parallel_world_size())

    def _check(self, model_rank: int, model_size: int) -> None:
        for name in _PIPELINE_SIZES:
            stages = getattr(self.mpu, name, lambda: 1)()
            if stages != 1:
                raise MpuError(
                    f"zero.initialize: the mpu's {name}() is {stages}; zero takes pipeline "
                    "stages from a PipelineModule's topology (PipeModelDataParallelTopology), "
                    "not from an mpu: pass the PipelineModule without mpu=")
        if self.data_parallel_size * model_size != self.world_size:
            raise MpuError(
                f"zero.initialize: the mpu's data-parallel size {self.data_parallel_size} x "
                f"model-parallel size {model_size} is not the world size "
                f"{self.world_size}; every rank must be in one data group and one model group")
        for what, ranks, size in (("data", self.dp_group, self.data_parallel_size),
                                  ("model", self.mp_group, model_size)):
            if len(ranks) != size:
                raise MpuError(
                    f"zero.initialize: the mpu's get_{what}_parallel_group() has {len(ranks)} "
                    f"ranks but get_{what}_parallel_world_size() says {size}")
        if self.tp_group != self.mp_group or self.tensor_parallel_id != model_rank:
            raise MpuError(
                f"zero.initialize: the mpu's tensor group (ranks {self.tp_group}, this rank "
                f"{self.tensor_parallel_id}) is not its model-parallel group (ranks "
                f"{self.mp_group}, this rank {model_rank}); without pipeline stages the two are "
                "the same ranks in the same order (checkpoint parts are named by the model "
                "rank and joined in tensor order)")

    def stage_to_global(self, stage_id: int, **kwargs) -> int:
        raise NotImplementedError("zero: stage_to_global is a pipeline mesh's; an mpu's grid "
                                  "has one stage and the mpu's own rank layout")

    def __getattr__(self, name):
        # anything else a script asks of engine.mpu is its own mpu's
        mpu = self.__dict__.get("mpu")
        if mpu is None:
            raise AttributeError(name)
        return getattr(mpu, name)
