"""offload_param "nvme": which units of the parameter shard stay in host memory and which go to
the swap file, the host buffers that carry them, and the `param` row that results."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .categories import category_row
from .sizes import round_up
from .training_setup import BUFFER_COUNT_ERROR, Setup


@dataclass(frozen=True)
class ParamPlacement:
    """Where offload_param "nvme" puts one rank's partitioned parameter shard, summed over
    the partitioned groups (Stage3Group::place_param_shard, per group)."""
    host_numel: int = 0           # the first units' shards, up to max_in_cpu, in host memory
    nvme_numel: int = 0           # the rest, in the group's swap file
    nvme_units: int = 0
    buffer_bytes: int = 0         # host staging: per group with an NVMe unit, buffer_count x
    largest_shards: tuple[int, ...] = ()  # ... round_up(b x its largest NVMe unit's shard)
    swap_file_bytes: int = 0      # every NVMe unit's shard at a page-aligned offset
    error: str = ""               # what the engine raises at initialize ("" when it builds)

    def to_dict(self) -> dict:
        return {"host_numel": self.host_numel, "nvme_numel": self.nvme_numel,
                "nvme_units": self.nvme_units, "buffer_bytes": self.buffer_bytes,
                "largest_nvme_unit_shards": list(self.largest_shards),
                "swap_file_bytes": self.swap_file_bytes, "error": self.error}


def kept_in_host_memory(unit_shards: Sequence[int], max_in_cpu: int) -> int:
    """How many of a group's units stay in host memory: the engine walks them in order and
    keeps each while the kept shard elements stay within max_in_cpu; the first that does not
    fit goes to NVMe, and so does every unit after it (one host tensor holds a prefix of the
    shard, the swap file the rest)."""
    kept = 0
    for count, shard in enumerate(unit_shards):
        if kept + shard > max_in_cpu:
            return count
        kept += shard
    return len(unit_shards)


def param_placement(setup: Setup, groups: Sequence[Sequence[tuple[str, int]]]
                    ) -> ParamPlacement:
    """offload_param "nvme": per partitioned group (its units in order as (name, shard
    elements)), the units up to max_in_cpu in host memory and the rest on NVMe, buffer_count
    page-rounded host buffers of the largest NVMe unit, and the engine's errors: a unit above
    buffer_size (named with the size that every unit fits), fewer than 2 buffers."""
    b = setup.param_bytes
    host = nvme = units = buffers = swap = 0
    largest, too_big = [], []
    for rows in groups:
        shards = [int(shard) for _, shard in rows]
        kept = kept_in_host_memory(shards, setup.param_max_in_cpu)
        host += sum(shards[:kept])
        on_nvme = rows[kept:]
        if not on_nvme:
            continue
        nvme += sum(shard for _, shard in on_nvme)
        units += len(on_nvme)
        largest.append(max(shard for _, shard in on_nvme))
        buffers += setup.param_buffer_count * round_up(b * largest[-1])
        swap += sum(round_up(b * shard) for _, shard in on_nvme)
        too_big += [(name, shard) for name, shard in on_nvme if shard > setup.param_buffer_size]
    error = ""
    if too_big:  # the engine's message names the key and its value the same way
        name, shard = too_big[0]
        error = (f"gather unit '{name}' has {shard:,} parameter elements per rank on NVMe, more "
                 f"than zero_optimization.offload_param.buffer_size = {setup.param_buffer_size}"
                 f": the engine raises; raise buffer_size to at least "
                 f"{max(s for _, s in too_big)} or split the unit (every ModuleList child is "
                 "one unit)")
    elif units and setup.param_buffer_count < 2:
        error = BUFFER_COUNT_ERROR.format(setup.param_buffer_count)
    return ParamPlacement(host_numel=host, nvme_numel=nvme, nvme_units=units,
                          buffer_bytes=buffers, largest_shards=tuple(largest),
                          swap_file_bytes=swap, error=error)


def param_row_on_nvme(placement: ParamPlacement, b: int, persistent_bytes: int = 0,
                      persistent_term: str = "0") -> dict:
    """The `param` row with offload_param on NVMe: the shard's NVMe units at `nvme`, the
    first units kept within max_in_cpu (H elements) at `host`, stage 3's persistent
    parameters whole on the device. Exact bytes: the registry counts the NVMe tiles unrounded."""
    host, nvme = placement.host_numel, placement.nvme_numel
    note = (f" (H = {host:,}: the first units' shards within max_in_cpu, in host memory)"
            if host and nvme else "")
    parts = [("nvme", b * nvme, f"{b}·(Ψ/N − H)" if host else f"{b}Ψ/N"),
             ("host", b * host, f"{b}·H{note}" if nvme else f"{b}Ψ/N"),
             ("device", persistent_bytes, persistent_term)]
    parts = [(where, value, text) for where, value, text in parts if value]
    if not parts:
        return category_row(0, "0", "nvme")
    by_location = {where: value for where, value, _ in parts}
    total = " + ".join(t for t in (f"{b}Ψ/N" if host or nvme else "", persistent_term)
                       if t and t != "0")
    out = {"bytes": sum(by_location.values()), "persistent_bytes": persistent_bytes,
           "formula": total + note, "location": max(by_location, key=by_location.get),
           "by_location": by_location}
    if len(parts) > 1:
        out["formula_by_location"] = {where: text for where, _, text in parts}
    return out
