"""`deepspeed.runtime.zero.offload_config`: the enums engine.offload_states takes
(zero/offload_states.py)."""
from zero.offload_states import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum"]
