"""`deepspeed.utils.zero_to_fp32`: full fp32 weights from a checkpoint's rank files, without a
process group (zero/checkpoint_export.py)."""
from zero.checkpoint_export import (convert_zero_checkpoint_to_fp32_state_dict,
                                    get_fp32_state_dict_from_zero_checkpoint,
                                    load_state_dict_from_zero_checkpoint)

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "load_state_dict_from_zero_checkpoint"]
