"""deepspeed.compression.helper, as DeepSpeed 0.19.8 keeps it: a deprecated name for the helpers
of deepspeed.utils.module_utils (DeepSpeed-Chat imports them from here), with its warning."""
import warnings

from ..utils.module_utils import recursive_getattr, recursive_setattr

warnings.warn("deepspeed.compression.helper is deprecated; import recursive_getattr and "
              "recursive_setattr from deepspeed.utils.module_utils instead", FutureWarning,
              stacklevel=2)

__all__ = ["recursive_getattr", "recursive_setattr"]
