"""Units, as nccl-tests uses them: sizes with 1024-based suffixes, bandwidth in decimal GB/s.

`parse_size("64M") == 64 * 1024**2` (nccl-tests' -b/-e); `GBps(bytes, seconds) = bytes / seconds / 1e9`.
"""

from __future__ import annotations

import re

from labutils.inputs import LabInputError

_SUFFIX = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
           "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4, "TB": 1024**4, "TIB": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, name: str = "size") -> int:
    """Bytes from "1K", "64M", "1G", "4096" (K/M/G = 1024-based, as nccl-tests' -b/-e)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise LabInputError(f"{name}={text} is outside the allowed range [0, inf) bytes")
        return text
    match = _SIZE.match(str(text))
    if not match or match.group(2).upper() not in _SUFFIX:
        raise LabInputError(f"{name}={text!r} is not a size; use a number with an optional K, M or G suffix "
                            "(1024-based), e.g. 1K, 64M")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not value.is_integer():
        raise LabInputError(f"{name}={text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: float) -> str:
    """Short 1024-based label: 1024 -> '1K', 67108864 -> '64M', 1536 -> '1.5K'."""
    nbytes = float(nbytes)
    for suffix, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g}{suffix}"
    return f"{nbytes:.0f}B" if nbytes.is_integer() else f"{nbytes:.3g}B"


def GBps(nbytes: float, seconds: float) -> float:
    """Decimal gigabytes per second: bytes / seconds / 1e9 (nccl-tests' GB/s)."""
    return nbytes / seconds / 1e9
