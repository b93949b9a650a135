"""DeepSpeed's engine calls about the batch: `set_train_batch_size` and
`set_train_micro_batch_size` (batch-size ramps change them between steps) and `deepspeed_io`
(a DataLoader over a dataset, each data-parallel rank reading its part), and
RepeatingLoader. Names, arguments and behaviour are DeepSpeed 0.19.8's (runtime/engine.py,
runtime/dataloader.py)."""
from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT = "train", "eval", "predict"  # DeepSpeed's routes
logger = logging.getLogger("zero")


class EngineDataLoader(torch.utils.data.DataLoader):
    """A DataLoader with what scripts read of DeepSpeed's DeepSpeedDataLoader: `data_sampler`,
    the sampler (DeepSpeedExamples call `loader.data_sampler.set_epoch(epoch)`)."""

    @property
    def data_sampler(self):
        return self.sampler


class RepeatingLoader:
    """DeepSpeed's (deepspeed.utils.RepeatingLoader): iterates over `loader` for ever, a new
    pass when it is exhausted (a DataLoader reshuffles then), as pipeline training's
    train_batch(data_iter) expects."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


class EngineBatch:
    """Mixed into ZeroEngine, which sets `config`, `micro_steps`, `world_size` (the
    data-parallel ranks), `data_parallel_group` and `sequence_parallel`."""

    collate_fn = None  # initialize(collate_fn=...): deepspeed_io's default

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """The global batch by more or fewer micro-batches per step (gradient accumulation
        steps); the micro-batch stays. Call it between optimizer steps."""
        per_micro_step = self.train_micro_batch_size_per_gpu() * self.world_size
        if train_batch_size < per_micro_step or train_batch_size % per_micro_step:
            raise ValueError(
                f"zero: set_train_batch_size({train_batch_size}): the global batch must be a "
                f"multiple of train_micro_batch_size_per_gpu x data-parallel ranks = "
                f"{per_micro_step} (e.g. {per_micro_step}, {2 * per_micro_step}); to change "
                "the micro-batch, call set_train_micro_batch_size")
        self._set_batch(train_batch_size=train_batch_size,
                        gradient_accumulation_steps=train_batch_size // per_micro_step)

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """The micro-batch per rank; the gradient accumulation steps stay, so the global batch
        follows. Call it between optimizer steps."""
        if micro_batch_size < 1:
            raise ValueError(f"zero: set_train_micro_batch_size({micro_batch_size}): the "
                             "micro-batch must be at least 1")
        gas = self.gradient_accumulation_steps()
        self._set_batch(train_batch_size=micro_batch_size * gas * self.world_size,
                        train_micro_batch_size_per_gpu=micro_batch_size)

    def _set_batch(self, **values) -> None:
        if self.micro_steps % self.gradient_accumulation_steps():
            raise RuntimeError("zero: the batch size changed in the middle of an accumulation "
                               "window; change it between optimizer steps")
        self.config = dataclasses.replace(self.config, **values)

    def _replica(self) -> int:
        """Which part of the data this rank reads: its data-parallel rank (the ranks of one
        sequence group read the same samples)."""
        if self.sequence_parallel is not None:
            return self.sequence_parallel.data_rank
        return dist.get_rank(self.data_parallel_group)

    def deepspeed_io(self, dataset, batch_size=None, route=ROUTE_TRAIN, pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A DataLoader of `dataset` in micro-batches (batch_size, default the config's),
        each data-parallel rank reading its part (a DistributedSampler, shuffled for training,
        in order for "eval" and "predict"), unless `data_sampler` is given."""
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if not iterable and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ValueError("zero: deepspeed_io needs a dataset (map-style: __getitem__ and "
                             f"__len__, or a torch IterableDataset), got {type(dataset).__name__}")
        if iterable and self.world_size > 1 and dist.get_rank() == 0:
            logger.warning("zero: deepspeed_io reads an IterableDataset as it is given: it must "
                           "hand each data-parallel rank its own part (e.g. datasets' "
                           "split_dataset_by_node), or every rank trains on the same samples")
        if data_sampler is None and not iterable:
            data_sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=self.world_size, rank=self._replica(),
                shuffle=route == ROUTE_TRAIN)
        return EngineDataLoader(
            dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
            sampler=data_sampler, collate_fn=collate_fn or self.collate_fn,
            pin_memory=pin_memory and torch.cuda.is_available(),
            num_workers=num_local_io_workers or 0, drop_last=self.config.dataloader_drop_last)
