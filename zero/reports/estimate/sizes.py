"""Byte and element counts: read them from the command line, print them, round them to pages."""
from __future__ import annotations

import re

from .errors import EstimateError

GiB = 1024 ** 3
MiB = 1024 ** 2
KiB = 1024

# Offload (csrc/core/aligned_buffer.h kIoAlignment): NVMe staging chunks and swap-file
# offsets are rounded up to whole I/O pages.
IO_ALIGNMENT = 4096

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4,
          "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024 ** 4}


def parse_bytes(text: str | int | float) -> int:
    """'2GiB', '512 MiB', '1.5GB' (decimal), '3e9' or a plain number of bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise EstimateError(f"cannot read the size {text!r}: write e.g. 2GiB, 512MiB, 1.5GB or a "
                            "number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_count(text: str | int | float) -> int:
    """An element count: '125000000', '1.3e9', '7B', '350M', '20k'."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*", str(text))
    if not match:
        raise EstimateError(f"cannot read the count {text!r}: write e.g. 125000000, 1.3e9, 350M "
                            "or 7B")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    return int(round(float(match.group(1)) * scale))


def format_bytes(value: int | float) -> str:
    """GiB from 1 GiB up, MiB below (KiB under 0.01 MiB), always labelled."""
    value = float(value)
    if value == 0:
        return "0"
    if abs(value) >= GiB:
        return f"{value / GiB:.2f} GiB"
    if abs(value) >= 0.01 * MiB:
        return f"{value / MiB:.3f} MiB" if abs(value) < 10 * MiB else f"{value / MiB:.1f} MiB"
    return f"{value / KiB:.2f} KiB"


def round_up(value: int, alignment: int = IO_ALIGNMENT) -> int:
    """`value` bytes rounded up to a multiple of `alignment` (whole I/O pages by default)."""
    return -(-int(value) // alignment) * alignment
