"""Before the engine writes a byte to NVMe: will every rank's swap files fit on their drives?

A 2B-parameter model spends minutes writing its swap files. Each file is preallocated when it
is made (csrc/core/swap_file.cpp names a full disk then), but the files come one after
another and every rank on a node makes its own: without this check a run could write most of
them and fail on the last. So, when the engine starts, every rank works out its swap bytes
per drive from the memory estimator (the formula `zero-mem estimate` prints, exact against the
engine), and the ranks compare, per machine and drive, the sum of what they will write with
the space the drive has. All ranks measure before any writes (the exchange is a collective)
and all raise the same error, naming the bytes needed, the bytes available and the fix.
"""
from __future__ import annotations

import logging
import os
import socket
import tempfile
from dataclasses import dataclass

import torch.distributed as dist

logger = logging.getLogger("zero")


@dataclass(frozen=True)
class DriveNeed:
    """What one rank will write to one drive."""
    host: str
    device: int      # st_dev of the folder
    folder: str      # nvme_path as configured
    keys: tuple      # the config keys that point there
    needed: int      # bytes this rank's swap files take
    available: int   # bytes free there, measured before anything was written


class SwapSpaceError(RuntimeError):
    """The swap files would not fit on their drive."""


def check_swap_space(config, model, param_groups, data_parallel_group=None) -> None:
    """Raises SwapSpaceError on every rank when the swap files of the ranks that share a
    drive need more than it has. Collective over the world when any NVMe offload is
    configured (every rank's files count, whatever part of the model it holds); the states
    are sharded over `data_parallel_group` (default the world)."""
    zero_cfg = config.zero_optimization
    folders = {key: block.nvme_path for key, block in
               (("offload_param", zero_cfg.offload_param),
                ("offload_optimizer", zero_cfg.offload_optimizer)) if block.device == "nvme"}
    if not folders:
        return
    bytes_by_key = _nvme_bytes(config, model, param_groups,
                               dist.get_world_size(data_parallel_group))
    try:  # told to every rank: none may wait in the exchange alone (nvme_path is per host)
        _check_writable(folders)
        mine = _drive_needs(folders, bytes_by_key) if bytes_by_key is not None else []
    except OSError as error:
        mine = f"zero: rank {dist.get_rank()} on {socket.gethostname()}: {error}"
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    failures = [entry for entry in everyone if isinstance(entry, str)]
    message = failures[0] if failures else \
        _shortfall([need for needs in everyone for need in needs])
    if message:
        raise SwapSpaceError(message)


def _nvme_bytes(config, model, param_groups, world: int) -> dict[str, int] | None:
    """This rank's NVMe bytes by config key, its states sharded over `world` ranks, from the
    estimator; None when it cannot tell (then each file's own preallocation check is the
    guard)."""
    from zero.reports import estimate as est

    local = min(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    try:
        shapes = est.shapes_from_module(model, param_groups=param_groups)
        setup, stage = est.setup_from_config(config.raw, world,
                                             num_nodes=world // local if world % local == 0
                                             else 1)
        rows = est.estimate(shapes, setup, stage).categories
    except est.EstimateError as error:
        logger.info("zero: no swap-space check before start (%s)", error)
        return None
    on_nvme = {name: est.by_location(row).get("nvme", 0) for name, row in rows.items()}
    return {"offload_param": on_nvme.pop("param", 0), "offload_optimizer": sum(on_nvme.values())}


def _check_writable(folders: dict[str, str]) -> None:
    """Each folder is a directory that takes a file (an unnamed one, gone when closed)."""
    for key, folder in folders.items():
        if not os.path.isdir(folder):
            raise OSError(f"{key}.nvme_path '{folder}' is not an existing directory; create it "
                          "or point nvme_path at one")
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as error:
            raise OSError(f"{key}.nvme_path '{folder}' does not take a file ({error.strerror}); "
                          "point nvme_path at a writable directory") from error


def _drive_needs(folders: dict[str, str], bytes_by_key: dict[str, int]) -> list[DriveNeed]:
    host, by_device = socket.gethostname(), {}
    for key, folder in folders.items():
        stats, device = os.statvfs(folder), os.stat(folder).st_dev
        need = by_device.get(device) or DriveNeed(host, device, folder, (), 0,
                                                  stats.f_bavail * stats.f_frsize)
        by_device[device] = DriveNeed(host, device, need.folder, need.keys + (key,),
                                      need.needed + bytes_by_key.get(key, 0), need.available)
    return list(by_device.values())


def _shortfall(needs: list[DriveNeed]) -> str:
    """The first drive whose ranks need more than it has, as the error to raise; '' if none."""
    drives: dict[tuple[str, int], list[DriveNeed]] = {}
    for need in needs:
        drives.setdefault((need.host, need.device), []).append(need)
    for (host, _), sharing in sorted(drives.items()):
        total = sum(need.needed for need in sharing)
        available = min(need.available for need in sharing)
        if total > available:
            keys = sorted({key for need in sharing for key in need.keys})
            return (f"zero: the NVMe swap files do not fit: {len(sharing)} rank(s) on {host} "
                    f"write {total:,} bytes ({_gib(total)}) to '{sharing[0].folder}' "
                    f"({' and '.join(k + '.nvme_path' for k in keys)}), which has "
                    f"{available:,} bytes ({_gib(available)}) free; free "
                    f"{_gib(total - available)} there, point nvme_path at a larger drive, or "
                    "run on more ranks or nodes (each rank writes 1/N of the states)")
    return ""


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
