"""Where zero.Init keeps a rank's shards when parameters are offloaded to NVMe: one file under
offload_param.nvme_path, so that building a model never holds even this rank's part of it in
memory (ZeRO-Infinity's "model size bounded by disk").

The file is unlinked from the start (O_TMPFILE where the filesystem has it, else created and
removed at once): it has no name, and the kernel frees its blocks when the last shard that
uses it is gone, or when the process ends in any way, a crash or SIGKILL included. Nothing is
ever left on disk.

A `SpilledShard` is one parameter's shard in that file (offset, elements, dtype); it reads
into a new tensor and is overwritten in place (a re-partition after an init-time gather). The
engine reads each unit's shards once, while it writes its own swap files; the file's blocks
are freed when the last shard is released, at the end of the engine's build (so the disk holds
this file and the swap files together for a while).
"""
from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass

import torch


class SpillFull(OSError):
    """The device holding the spill file has no room for the next shard."""


class ShardSpill:
    """An append-only, unnamed file of shards under `folder` (created if missing)."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self._file = tempfile.TemporaryFile(dir=folder, prefix="zero-init-shards-")
        self.size = 0  # bytes appended so far
        self.on_write = None  # called with the bytes of every shard appended

    def put(self, tensor: torch.Tensor) -> "SpilledShard":
        """Appends a copy of `tensor` (1-D, CPU or not) and returns its record."""
        record = SpilledShard(self, self.size, tensor.numel(), tensor.dtype, tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        record.write(tensor)
        self.size += nbytes
        if self.on_write is not None:
            self.on_write(nbytes)
        return record

    def pwrite(self, data: memoryview, offset: int) -> None:
        done = 0
        while done < len(data):
            try:
                done += os.pwrite(self._file.fileno(), data[done:], offset + done)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise SpillFull(error.errno, self._full_message(len(data) - done)) from None
                raise

    def pread(self, into: memoryview, offset: int) -> None:
        done = 0
        while done < len(into):
            got = os.preadv(self._file.fileno(), [into[done:]], offset + done)
            if got == 0:
                raise OSError(errno.EIO, f"zero.Init: the shard file under '{self.folder}' "
                              f"ended at {offset + done} bytes, {len(into) - done} short")
            done += got

    def _full_message(self, missing: int) -> str:
        stats = os.statvfs(self.folder)
        available = stats.f_bavail * stats.f_frsize
        return (f"zero.Init: the device holding offload_param.nvme_path '{self.folder}' is "
                f"full: this rank's shards take {self.size} bytes so far, {missing} more "
                f"could not be written, {available} bytes are available (every rank on the "
                "node writes its own); free space there or point nvme_path at a larger device")


@dataclass(frozen=True)
class SpilledShard:
    spill: ShardSpill
    offset: int
    numel: int
    dtype: torch.dtype
    device: torch.device  # where read() puts it (the training device)

    def read(self) -> torch.Tensor:
        out = torch.empty(self.numel, dtype=self.dtype)
        if self.numel:
            self.spill.pread(memoryview(_bytes_of(out).numpy()), self.offset)
        return out.to(self.device)

    def write(self, tensor: torch.Tensor) -> None:
        """Overwrites the shard with `tensor` (same element count; converted to its dtype)."""
        if tensor.numel() != self.numel:
            raise ValueError(f"zero.Init: a shard of {self.numel} elements written with "
                             f"{tensor.numel()}")
        data = tensor.detach().to(device="cpu", dtype=self.dtype).contiguous().view(-1)
        if self.numel:
            self.spill.pwrite(memoryview(_bytes_of(data).numpy()), self.offset)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as uint8 (numpy has no bfloat16)."""
    return tensor.view(torch.uint8)
