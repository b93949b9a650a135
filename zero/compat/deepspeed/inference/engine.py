"""`deepspeed.inference.engine`: InferenceEngine (zero/inference.py)."""
from zero.inference import InferenceEngine

__all__ = ["InferenceEngine"]
