"""`deepspeed.runtime.dataloader`: RepeatingLoader (also `deepspeed.utils.RepeatingLoader`)."""
from __future__ import annotations


class RepeatingLoader:
    """Iterates over `loader` for ever: when it is exhausted, a new pass starts (a DataLoader
    reshuffles then), as pipeline training's train_batch(data_iter) expects."""

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
