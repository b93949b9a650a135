"""`deepspeed.launcher`: the runner's names Accelerate imports when it launches."""
from . import runner

__all__ = ["runner"]
