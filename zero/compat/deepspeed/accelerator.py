"""`deepspeed.accelerator.get_accelerator()`: the calls DeepSpeed scripts make on it, answered
for the device zero trains on (a CUDA GPU when torch sees one, else the CPU)."""
from __future__ import annotations

import os

import torch


class Accelerator:
    """The device of this process: cuda:LOCAL_RANK on a GPU machine, else cpu."""

    def __init__(self):
        self._cuda = torch.cuda.is_available()

    def device_name(self, device_index: int | None = None) -> str:
        if not self._cuda:
            return "cpu"
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def current_device_name(self) -> str:
        return self.device_name(int(os.environ.get("LOCAL_RANK", "0")) if self._cuda else None)

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._cuda else 0

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._cuda else 1

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return "nccl" if self._cuda else "gloo"

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self) -> bool:
        return True

    def synchronize(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()


def get_accelerator() -> Accelerator:
    return Accelerator()
