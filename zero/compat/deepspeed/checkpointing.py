"""`deepspeed.checkpointing`: DeepSpeed's activation checkpointing API
(zero/activation_checkpointing.py), the module DeepSpeed also keeps as
`deepspeed.runtime.activation_checkpointing.checkpointing`."""
from .runtime.activation_checkpointing.checkpointing import *  # noqa: F401,F403
from .runtime.activation_checkpointing.checkpointing import __all__  # noqa: F401
