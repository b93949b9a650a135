"""The ways to run that the estimate covers: a ZeRO stage and where the optimizer state and
(stage 3) the parameter shard live."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import EstimateError


@dataclass(frozen=True)
class Option:
    """One way to run: a ZeRO stage, where the optimizer state lives (none = on the device,
    cpu = host memory, nvme = a swap file) and, at stage 3, where the parameter shard lives."""
    name: str
    stage: int
    offload_optimizer: str = "none"   # none | cpu | nvme
    offload_param: str = "none"       # none | cpu | nvme

    @property
    def offloaded(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def built(self) -> bool:
        """The engine builds it: every option of OPTIONS (offload_param on NVMe since the
        parameter swap, csrc/adapter/param_swap.h)."""
        return True


OPTIONS = (
    Option("stage 0", 0),
    Option("stage 1", 1),
    Option("stage 2", 2),
    Option("stage 1 + offload optimizer", 1, "cpu"),
    Option("stage 1 + offload optimizer (NVMe)", 1, "nvme"),
    Option("stage 2 + offload optimizer", 2, "cpu"),
    Option("stage 2 + offload optimizer (NVMe)", 2, "nvme"),
    Option("stage 3", 3),
    Option("stage 3 + offload optimizer", 3, "cpu"),
    Option("stage 3 + offload optimizer (NVMe)", 3, "nvme"),
    Option("stage 3 + offload params", 3, "none", "cpu"),
    Option("stage 3 + offload optimizer + params", 3, "cpu", "cpu"),
    Option("stage 3 + offload optimizer (NVMe) + params", 3, "nvme", "cpu"),
    Option("stage 3 + offload params (NVMe)", 3, "none", "nvme"),
    Option("stage 3 + offload optimizer (host) + params (NVMe)", 3, "cpu", "nvme"),
    Option("stage 3 + offload optimizer + params (NVMe)", 3, "nvme", "nvme"),  # both on NVMe
)


def option_for(stage: int, offload_optimizer: str = "none", offload_param: str = "none"
               ) -> Option:
    """The option of OPTIONS for a stage and offload devices (an EstimateError naming why
    when there is none: offload at stage 0, parameter offload below stage 3)."""
    for option in OPTIONS:
        if (option.stage, option.offload_optimizer, option.offload_param) == \
                (stage, offload_optimizer, offload_param):
            return option
    if offload_param != "none" and stage != 3:
        raise EstimateError(f"offload_param {offload_param!r} needs stage 3 (stage is {stage})")
    if offload_optimizer != "none" and stage == 0:
        raise EstimateError("offload_optimizer needs ZeRO stage 1, 2 or 3 (at stage 0 nothing is "
                            "sharded to offload)")
    raise EstimateError(f"no estimate for stage {stage} with offload_optimizer "
                        f"{offload_optimizer!r} and offload_param {offload_param!r}")
