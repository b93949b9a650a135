"""`deepspeed.runtime.engine`: DeepSpeedEngine is zero's engine."""
from zero.engine import ZeroEngine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]
