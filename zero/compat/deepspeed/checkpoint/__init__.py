"""`deepspeed.checkpoint`: the helpers Accelerate calls when it saves a model."""
from . import utils

__all__ = ["utils"]
