"""`deepspeed.OnDevice` (DeepSpeed 0.19.8's deepspeed/utils/init_on_device.py): modules and
tensors built inside it land on `device` ("meta" by default: shapes without memory) and their
floating-point tensors in `dtype` (None: as they are):

    with deepspeed.OnDevice(dtype=torch.bfloat16, device="meta"):
        model = MyModel()

Here through torch's own device context and its default dtype, where DeepSpeed patches
torch.empty / zeros / ones / full and Tensor.__new__. So inside it, unlike DeepSpeed's,
every factory function builds on `device` (torch.tensor, arange, randn, linspace too: a
buffer a module computes with arange in its __init__, such as a rotary embedding's inv_freq,
is on `device` as well), a Python float becomes a `dtype` tensor, and a call that names its own
floating dtype keeps it (DeepSpeed casts it to `dtype`).
"""
from __future__ import annotations

import torch

__all__ = ["OnDevice"]


class OnDevice:
    def __init__(self, dtype, device="meta", enabled=True):
        self.dtype = dtype
        self.device = device
        self.enabled = enabled
        self._device_context = None
        self._default_dtype = None

    def __enter__(self):
        if not self.enabled:
            return
        if self.dtype is not None and not self.dtype.is_floating_point:
            raise ValueError(f"zero: OnDevice(dtype={self.dtype}): the dtype is the one "
                             "floating-point tensors are built in; pass a floating dtype such "
                             "as torch.bfloat16, or None")
        self._default_dtype = torch.get_default_dtype()
        if self.dtype is not None:
            torch.set_default_dtype(self.dtype)
        self._device_context = torch.device(self.device)
        self._device_context.__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        if not self.enabled:
            return
        self._device_context.__exit__(exc_type, exc_value, traceback)
        torch.set_default_dtype(self._default_dtype)
