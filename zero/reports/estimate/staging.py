"""Offload's staging: the host chunks the offloaded optimizer step streams through, the host
buffers of parameters on NVMe, the device staging of parameter gathers; the `staging` row
and the offload detail."""
from __future__ import annotations

from typing import Optional, Sequence

from offload import OFFLOAD_TILE

from .categories import category_row
from .options import Option
from .params_on_nvme import ParamPlacement
from .sizes import round_up
from .training_setup import Setup, optimizer_arrays


def state_arrays(setup: Setup) -> list[str]:
    """The fp32 arrays an offloaded optimizer keeps per element (csrc ShardState)."""
    return ["master", *optimizer_arrays(setup)]


def staging_row(setup: Setup, option: Option, group_shards: Sequence[int], device_bytes: int = 0,
                device_formula: str = "0", params: Optional[ParamPlacement] = None
                ) -> tuple[dict, Optional[dict]]:
    """The `staging` row and the offload detail. Host: the optimizer's chunks (see
    optimizer_staging) and, with offload_param on NVMe, the parameter buffers. Device
    (offload_param): given."""
    host, terms, notes, detail = 0, [], [], None
    if option.offload_optimizer != "none" or option.offload_param != "none":
        detail = {"offload_optimizer": option.offload_optimizer,
                  "offload_param": option.offload_param,
                  "device_staging_bytes": device_bytes, "host_staging_bytes": 0,
                  "swap_file_bytes": 0}
    if option.offload_optimizer != "none":
        host, term, note, more = optimizer_staging(setup, option, group_shards)
        terms.append(term)
        notes.append(note)
        detail.update(more)
    if params is not None:
        detail["param_nvme"] = params.to_dict()
        detail["swap_file_bytes"] += params.swap_file_bytes
        if params.buffer_bytes:
            # each buffer holds one whole unit's shard (the largest on NVMe), page-rounded for
            # O_DIRECT; prefetches and write-backs share them
            b = setup.param_bytes
            sigma = "Σ groups " if len(params.largest_shards) > 1 else ""
            terms.append(f"{sigma}{setup.param_buffer_count}·⌈{b}·V⌉")
            notes.append(f"V = the largest NVMe unit's shard = "
                         f"{', '.join(f'{v:,}' for v in params.largest_shards)}"
                         + ("" if option.offload_optimizer == "nvme" else
                            "; ⌈⌉: whole 4 KiB pages"))
            host += params.buffer_bytes
    if detail is not None:
        detail["host_staging_bytes"] = host
    by_location = {}
    formulas = {}
    if host:
        by_location["host"] = host
        formulas["host"] = f"{' + '.join(terms)} ({'; '.join(notes)})"
    if device_bytes:
        by_location["device"], formulas["device"] = device_bytes, device_formula
    if not by_location:  # no staging: nothing offloaded (a ratio rounding to 0)
        return category_row(0, "0"), detail
    location = max(by_location, key=lambda where: by_location[where])
    text = "; ".join(f"{where}: {formula}" for where, formula in formulas.items()) \
        if len(formulas) > 1 else formulas[location]
    return {"bytes": host + device_bytes, "formula": text, "location": location,
            "by_location": by_location, "formula_by_location": formulas}, detail


def optimizer_staging(setup: Setup, option: Option, group_shards: Sequence[int]
                      ) -> tuple[int, str, str, dict]:
    """offload_optimizer, per engine group: 2 slots x (C·g gradients + C·b parameters for a
    16-bit model; none for a model on the CPU, updated in place; g: the gradients' bytes, b
    unless they accumulate in fp32), with NVMe also 2 slots x each state array x
    round_up(a·C, 4096) (a: the array's bytes per element, 4, or 2 for a 16-bit master or
    state); the delayed update stages the shard's gradients and new parameters instead of
    the chunks.
    (host bytes, formula term, its note, the offload detail's fields)."""
    b, g = setup.param_bytes, setup.grad_bytes
    sixteen_bit = b != 4
    nvme = option.offload_optimizer == "nvme"
    arrays = state_arrays(setup)
    # with a ratio < 1 only each shard's tail is offloaded: the pool is sized for it, and a
    # group whose tail is empty has no pool
    tails = [setup.offloaded_numel(shard) for shard in group_shards]
    group_shards = [tail for tail in tails if tail]
    chunks = [setup.offload_chunk(shard) for shard in group_shards]
    model = f"({g}+{b})" if sixteen_bit else f"{g}"
    delayed = setup.delayed_update and not nvme  # the engine refuses it with NVMe
    host, terms = 0, []
    if not setup.cpu_only and not delayed:  # (the delayed update stages the whole shard)
        host = sum(2 * c * (g + (b if sixteen_bit else 0)) for c in chunks)
        terms.append(f"2·C·{model}")
    if nvme:
        host += sum(2 * round_up(setup.array_bytes(name) * c) for c in chunks for name in arrays)
        sizes = [setup.array_bytes(name) for name in arrays]
        terms.append(f"2·{len(arrays)}·⌈4C⌉" if set(sizes) == {4} else
                     "2·(" + " + ".join(f"⌈{size}C⌉" for size in sizes) + ")")
    if delayed:  # the whole shard's gradients and new parameters, one update behind
        host += sum(int(shard) * (g + b) for shard in group_shards)
        terms.append(f"2·S·{b}" if g == b else f"S·({g}+{b})")
    term = " + ".join(terms) or "0 (the model is on the CPU: updated in place)"
    sigma = "Σ groups " if len(chunks) > 1 else ""
    part = "Ψ/N" if setup.offload_ratio == 1 else f"the offloaded {setup.offload_ratio:g}·Ψ/N"
    note = (f"C = min(sub_group_size, {OFFLOAD_TILE:,}, {part} of the group) = "
            f"{', '.join(f'{c:,}' for c in chunks) or '-'}"
            + ("; ⌈⌉: whole 4 KiB pages" if nvme else "")
            + ("; S = the group's Ψ/N, the delayed update's gradients and parameters"
               if delayed else ""))
    swap = 0
    if nvme:  # the swap file: every chunk of every array at a page-aligned offset
        for shard, c in zip(group_shards, chunks):
            full, rest = divmod(int(shard), c)
            for name in arrays:
                size = setup.array_bytes(name)
                swap += full * round_up(size * c) + (round_up(size * rest) if rest else 0)
    detail = dict(chunk_limit=setup.offload_chunk_limit, state_arrays=arrays,
                  groups=[{"offloaded_numel": int(shard), "chunk_numel": c}
                          for shard, c in zip(group_shards, chunks)],
                  ratio=setup.offload_ratio, offloaded_numel=sum(tails),
                  delayed_update=delayed, swap_file_bytes=swap)
    return host, f"{sigma}{term}", note, detail
