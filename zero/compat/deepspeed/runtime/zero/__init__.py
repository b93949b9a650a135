"""`deepspeed.zero` (= `deepspeed.runtime.zero`): zero.Init, GatheredParameters and the
external-parameter registry, zero's own (zero/init.py, zero/stage3.py)."""
from zero.init import Init
from zero.stage3 import (GatheredParameters, register_external_parameter,
                         unregister_external_parameter)

from . import offload_config, partition_parameters

__all__ = ["Init", "GatheredParameters", "register_external_parameter",
           "unregister_external_parameter", "offload_config", "partition_parameters"]
