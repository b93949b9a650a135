"""`deepspeed.zero` (= `deepspeed.runtime.zero`): zero.Init, GatheredParameters, the
external-parameter registry and ZeroParamStatus, zero's own (zero/init.py, zero/stage3.py,
zero/ds_param.py)."""
from zero.ds_param import ZeroParamStatus
from zero.init import Init
from zero.stage3 import (GatheredParameters, register_external_parameter,
                         unregister_external_parameter)

from . import offload_config, partition_parameters

__all__ = ["Init", "GatheredParameters", "ZeroParamStatus", "register_external_parameter",
           "unregister_external_parameter", "offload_config", "partition_parameters"]
