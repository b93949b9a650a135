"""`deepspeed.inference`: the InferenceEngine init_inference returns (zero/inference.py)."""
from . import engine

__all__ = ["engine"]
