"""`deepspeed.runtime.dataloader`: RepeatingLoader (also `deepspeed.utils.RepeatingLoader`),
zero's (zero/engine_batch.py)."""
from zero.engine_batch import RepeatingLoader

__all__ = ["RepeatingLoader"]
