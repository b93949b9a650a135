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

`MpuGrid` reads those once and answers the accessors zero's engine, norm span and
checkpoints ask of a PipelineParallelGrid (grid.py). Pipeline stages come from a
PipelineModule's own topology, so an mpu with more than one is refused. The parameters the
script's layers split say so as Megatron's do (`tensor_model_parallel`, `partition_dim`).
"""
from __future__ import annotations

import torch.distributed as dist

_REQUIRED = ("get_data_parallel_group", "get_data_parallel_rank",
             "get_data_parallel_world_size", "get_model_parallel_group",
             "get_model_parallel_rank", "get_model_parallel_world_size")
_TENSOR_SPELLINGS = ("tensor_model_parallel", "slice_parallel", "model_parallel")
_PIPELINE_SIZES = ("get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size")


class MpuError(ValueError):
    """The mpu passed to initialize() cannot describe this run."""


class MpuGrid:
    """The grid accessors zero uses, answered from `mpu` (read once, on construction)."""

    stage_id = 0  # no pipeline stages: a PipelineModule brings its own grid
    pipe_parallel_size = 1

    def __init__(self, mpu):
        missing = [name for name in _REQUIRED if not callable(getattr(mpu, name, None))]
        if missing:
            raise MpuError(f"zero.initialize: the mpu ({type(mpu).__name__}) has no {missing}; "
                           "a model-parallel unit answers DeepSpeed's get_data_parallel_* and "
                           "get_model_parallel_* (group, rank, world_size) for this rank")
        self.mpu = mpu
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.data_parallel_group = mpu.get_data_parallel_group()
        self.data_parallel_id = mpu.get_data_parallel_rank()
        self.data_parallel_size = mpu.get_data_parallel_world_size()
        self.model_parallel_group = mpu.get_model_parallel_group()
        self.model_parallel_rank = mpu.get_model_parallel_rank()
        self.model_parallel_size = mpu.get_model_parallel_world_size()
        spelling = next(s for s in _TENSOR_SPELLINGS
                        if all(callable(getattr(mpu, f"get_{s}_{what}", None))
                               for what in ("group", "rank", "world_size")))
        self.tensor_parallel_group = getattr(mpu, f"get_{spelling}_group")()
        self.tensor_parallel_id = getattr(mpu, f"get_{spelling}_rank")()
        self.tensor_parallel_size = getattr(mpu, f"get_{spelling}_world_size")()
        self._check()

    def _check(self) -> None:
        for name in _PIPELINE_SIZES:
            stages = getattr(self.mpu, name, lambda: 1)()
            if stages != 1:
                raise MpuError(
                    f"zero.initialize: the mpu's {name}() is {stages}; zero takes pipeline "
                    "stages from a PipelineModule's topology (PipeModelDataParallelTopology), "
                    "not from an mpu: pass the PipelineModule without mpu=")
        tensor_ranks = dist.get_process_group_ranks(self.tensor_parallel_group)
        model_ranks = dist.get_process_group_ranks(self.model_parallel_group)
        if tensor_ranks != model_ranks or self.tensor_parallel_id != self.model_parallel_rank:
            raise MpuError(
                f"zero.initialize: the mpu's tensor group (ranks {tensor_ranks}, this rank "
                f"{self.tensor_parallel_id}) is not its model-parallel group (ranks "
                f"{model_ranks}, this rank {self.model_parallel_rank}); without pipeline stages "
                "the two are the same ranks in the same order (checkpoint parts are named by "
                "the model rank and joined in tensor order)")
        if self.data_parallel_size * self.model_parallel_size != self.world_size:
            raise MpuError(
                f"zero.initialize: the mpu's data-parallel size {self.data_parallel_size} x "
                f"model-parallel size {self.model_parallel_size} is not the world size "
                f"{self.world_size}; every rank must be in one data group and one model group")
        for what, group, size in (("data", self.data_parallel_group, self.data_parallel_size),
                                  ("model", self.model_parallel_group, self.model_parallel_size)):
            actual = dist.get_world_size(group)
            if actual != size:
                raise MpuError(
                    f"zero.initialize: the mpu's get_{what}_parallel_group() has {actual} "
                    f"ranks but get_{what}_parallel_world_size() says {size}")

    # ---- the accessors of grid.PipelineParallelGrid that zero reads --------------------------
    def get_data_parallel_group(self):
        return self.data_parallel_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_model_parallel_group(self):
        return self.model_parallel_group

    def get_model_parallel_rank(self) -> int:
        return self.model_parallel_rank

    def get_model_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_tensor_model_parallel_group(self):
        return self.tensor_parallel_group

    def get_tensor_model_parallel_rank(self) -> int:
        return self.tensor_parallel_id

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tensor_parallel_size

    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_rank = get_tensor_model_parallel_rank
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size

    def get_pipe_parallel_world_size(self) -> int:
        return 1

    def get_stage_id(self) -> int:
        return 0

    def get_global_rank(self) -> int:
        return self.global_rank

    def describe(self) -> dict:
        """The sizes and this rank's place, as PipelineParallelGrid.describe()."""
        return {"pipe": 1, "data": self.data_parallel_size, "tensor": self.tensor_parallel_size,
                "stage": 0, "data_rank": self.data_parallel_id,
                "tensor_rank": self.tensor_parallel_id}

    def __getattr__(self, name):
        # anything else a script asks of engine.mpu is its own mpu's
        mpu = self.__dict__.get("mpu")
        if mpu is None:
            raise AttributeError(name)
        return getattr(mpu, name)
