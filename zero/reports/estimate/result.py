"""The estimate of one option: bytes per category and location, with the layout's numbers and
the stage-3 and offload details."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .categories import CATEGORIES, LOCATIONS, by_location
from .options import Option
from .training_setup import Setup

BUILT = "built"
# No option of OPTIONS is formula-only any more (offload_param nvme is built); the status
# stays for an option added before the engine builds it.
FORMULA_ONLY = "formula only — not yet built/measured"
# Stage 3 without gather units (a ModelShapes made by hand with no `units`): the paper's
# formula on the padded numbers, not checked against the engine.
STAGE3_FORMULA = "formula — stage 3 built, estimate not checked against it"
# Stage 3 from --params: the units are assumed (see shapes_from_count), so are W and U.
STAGE3_ASSUMED_UNITS = "built — stage-3 units assumed (--params), not the model's"


@dataclass
class Estimate:
    option: Option
    setup: Setup
    # name -> {"bytes", "formula", "location": device|host|nvme, "by_location": {location:
    # bytes}}; a category split over locations (stage 3's param with offload_param: the
    # partitioned shard on the host, the persistent part on the device; staging) also has
    # "formula_by_location", and "location" names where most of it is
    categories: dict[str, dict]
    numel: int                    # Ψ (padded; stage 3: the partitioned parameters)
    shard_numel: int              # Ψ/N (padded)
    max_unit_numel: int           # U
    unit_count: int
    groups: list[dict] = field(default_factory=list)
    exact_units: bool = True      # stage 3: the model's gather units (False: assumed / none)
    persistent_numel: int = 0     # stage 3: Ψp, the persistent (whole) parameters, padded
    persistent_shard_numel: int = 0
    frozen_numel: int = 0         # stage 3: Ψf, the partitioned frozen parameters, padded
    stage3: Optional[dict] = None  # stage 3: units, working set, bounds (see estimate())
    offload: Optional[dict] = None  # offload: chunks, staging, swap file (see staging_row)
    refused: str = ""  # why the engine refuses this option whatever the sizes

    @property
    def name(self) -> str:
        return self.option.name

    @property
    def status(self) -> str:
        if not self.option.built:
            return FORMULA_ONLY
        if self.option.stage == 3:
            if self.stage3 is None:
                return STAGE3_FORMULA
            return BUILT if self.exact_units else STAGE3_ASSUMED_UNITS
        return BUILT

    @property
    def runs(self) -> bool:
        """False when the engine would refuse this set-up (stage 3: a unit in use does not fit
        under stage3_max_live_parameters; parameters on NVMe: a unit above buffer_size)."""
        return not self.error

    @property
    def error(self) -> str:
        """What the engine would raise ("" when it builds and runs)."""
        params = (self.offload or {}).get("param_nvme") or {}
        return self.refused or (self.stage3 or {}).get("error") or params.get("error", "")

    def bytes_at(self, location: str) -> int:
        """Bytes per rank at one location ("device", "host" or "nvme"); transient categories
        (buckets, gathered parameters, device staging) at their peak."""
        return sum(by_location(row).get(location, 0) for row in self.categories.values())

    @property
    def device_bytes(self) -> int:
        return self.bytes_at("device")

    @property
    def host_bytes(self) -> int:
        return self.bytes_at("host")

    @property
    def nvme_bytes(self) -> int:
        return self.bytes_at("nvme")

    def model_state_at(self, location: str) -> int:
        """The model states (param, gradient, master, optimizer state) at one location: what
        the live report's model_state_by_location gives."""
        return sum(by_location(self.categories[name]).get(location, 0)
                   for name in CATEGORIES[:4])

    @property
    def model_state_bytes(self) -> int:
        """param + gradient + fp32_master + optimizer_state, wherever they live (stage 3: the
        persistent part included)."""
        return sum(self.categories[name]["bytes"] for name in CATEGORIES[:4])

    @property
    def persistent_bytes(self) -> int:
        """Stage 3: the model-state bytes of the persistent parameters alone."""
        return sum(self.categories[name].get("persistent_bytes", 0) for name in CATEGORIES[:4])

    def to_dict(self) -> dict:
        per_node = self.setup.ranks_per_node
        out = {
            "option": self.name, "stage": self.option.stage,
            "offload_optimizer": self.option.offload_optimizer,
            "offload_param": self.option.offload_param,
            "status": self.status, "built": self.option.built,
            "categories": self.categories,
            "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
            "nvme_bytes": self.nvme_bytes,
            "model_state_bytes": self.model_state_bytes,
            "model_state_by_location": {where: self.model_state_at(where)
                                        for where in LOCATIONS},
            "per_node": {"ranks": per_node, "device_bytes": self.device_bytes * per_node,
                         "host_bytes": self.host_bytes * per_node,
                         "nvme_bytes": self.nvme_bytes * per_node},
            "numel": self.numel, "shard_numel": self.shard_numel,
            "max_unit_numel": self.max_unit_numel, "unit_count": self.unit_count,
            "groups": self.groups,
        }
        if self.option.stage == 3:
            out.update(persistent_numel=self.persistent_numel,
                       persistent_shard_numel=self.persistent_shard_numel,
                       persistent_bytes=self.persistent_bytes,
                       frozen_numel=self.frozen_numel, stage3=self.stage3)
        if self.offload is not None:
            out["offload"] = self.offload
        if self.error:
            out["error"] = self.error
        return out
