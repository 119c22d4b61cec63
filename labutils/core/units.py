"""Units, as nccl-tests uses them: sizes with 1024-based suffixes, bandwidth in decimal GB/s.

`parse_size("64M") == 64 * 1024**2` (nccl-tests' -b/-e); `GBps(bytes, seconds) = bytes / seconds / 1e9`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from labutils.core.inputs import LabInputError, check_range

_SUFFIX = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
           "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4, "TB": 1024**4, "TIB": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
MAX_SIZE_BYTES = 2**62  # 4 EiB: far above any buffer; more is a typo


def parse_size(text: str | int, name: str = "size") -> int:
    """Bytes from "1K", "64M", "1G", "4096" (K/M/G = 1024-based, as nccl-tests' -b/-e).

    Exact for any digit count (no float on the way); a lower-case b ("64Mb", "1 kb") is bits and
    refused, as are negative, fractional and absurd (> 4 EiB) counts: LabInputError naming `name`.
    """
    if isinstance(text, bool) or text is None:
        raise LabInputError(f"{name}={text!r} is not a size; use a number of bytes with an optional K, M or G suffix")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.match(str(text))
        if match and match.group(2).endswith("b") and match.group(2).upper() in _SUFFIX:
            raise LabInputError(f"{name}={text!r}: a lower-case b means bits; sizes are bytes, write "
                                f"{match.group(1)}{match.group(2)[:-1].upper() or 'B'} (1024-based)")
        if not match or match.group(2).upper() not in _SUFFIX:
            raise LabInputError(f"{name}={text!r} is not a size; use a number with an optional K, M or G suffix "
                                "(1024-based), e.g. 1K, 64M")
        exact = Fraction(match.group(1)) * _SUFFIX[match.group(2).upper()]
        if exact.denominator != 1:
            raise LabInputError(f"{name}={text!r} is not a whole number of bytes")
        value = int(exact)
    if not 0 <= value <= MAX_SIZE_BYTES:
        raise LabInputError(f"{name}={value} is outside the allowed range [0, {MAX_SIZE_BYTES}] bytes")
    return value


def format_size(nbytes: float) -> str:
    """Short 1024-based label: 1024 -> '1K', 67108864 -> '64M', 1536 -> '1.5K'."""
    nbytes = float(nbytes)
    for suffix, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g}{suffix}"
    return f"{nbytes:.0f}B" if nbytes.is_integer() else f"{nbytes:.3g}B"


def GBps(nbytes, seconds):
    """Decimal gigabytes per second: bytes / seconds / 1e9 (nccl-tests' GB/s).

    LabInputError for negative or non-finite bytes and for seconds that are not > 0."""
    check_range("nbytes", nbytes, low=0, high=float("inf"), high_open=True, unit="bytes")
    check_range("seconds", seconds, low=0, low_open=True, high=float("inf"), high_open=True, unit="s")
    return nbytes / seconds / 1e9
