"""The nccl-tests vocabulary, its units, its bandwidth arithmetic and its table (a leaf: imports no
other lab module but the input checks and `to_json`). Notebooks 02-04 use it; the sweep, the parser
and the table printer (`format_nccl_table`, `print_rows`: what `python -m labutils sweep` and
`parse-nccl-tests` print, in nccl-tests' own columns) share these names and columns.

Units, as nccl-tests uses them: sizes with 1024-based suffixes, bandwidth in decimal GB/s.
`parse_size("64M") == 64 * 1024**2` (nccl-tests' -b/-e); `GBps(bytes, seconds) = bytes / seconds / 1e9`.

Bandwidths (nccl-tests' doc/PERFORMANCE.md), GB/s = 1e9 bytes/s, time t in seconds:

    algbw = S / t
    busbw = algbw * factor,  factor = 2(N-1)/N  all_reduce
                                      (N-1)/N   all_gather, reduce_scatter
                                      1         broadcast

S is nccl-tests' "size": the whole buffer. For all_reduce and broadcast that is count * elem
bytes; for all_gather it is the gathered output (N * per-rank count * elem bytes) and for
reduce_scatter the input being reduced (likewise N * per-rank count). The "count" column of
all_gather and reduce_scatter is the per-rank count, as nccl-tests prints it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from labutils.core.inputs import LabInputError, check_choice, check_int, check_number, check_range, check_whole
from labutils.core.results import to_json

# --- units, as nccl-tests uses them -------------------------------------------------------------

_SUFFIX = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
           "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4, "TB": 1024**4, "TIB": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
MAX_SIZE_BYTES = 2**62  # 4 EiB: far above any buffer; more is a typo
MAX_RANKS = 10**9  # far above any job's ranks (model.fit.MAX_WORLD_SIZE)


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
    nbytes = check_number("nbytes", nbytes, low=0, high=1e30, unit="bytes")  # NaN and inf are no size
    for suffix, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g}{suffix}"
    return f"{nbytes:.0f}B" if nbytes.is_integer() else f"{nbytes:.3g}B"


def binary_size(nbytes: float) -> str:
    """`format_size` with its 1024-based unit spelt out, as notebook 05 writes sizes: 16793600 ->
    '16MiB', 264192 -> '258KiB', 512 -> '512B'."""
    short = format_size(nbytes)
    return short + "iB" if short[-1] in "KMG" else short


def GBps(nbytes, seconds):
    """Decimal gigabytes per second: bytes / seconds / 1e9 (nccl-tests' GB/s).

    LabInputError for negative or non-finite bytes and for seconds that are not > 0."""
    check_range("nbytes", nbytes, low=0, high=float("inf"), high_open=True, unit="bytes")
    check_range("seconds", seconds, low=0, low_open=True, high=float("inf"), high_open=True, unit="s")
    return nbytes / seconds / 1e9


# --- the vocabulary ----------------------------------------------------------------------------

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


REDOPS = {"all_reduce": "sum", "all_gather": "none", "reduce_scatter": "sum", "broadcast": "none"}


ROOTS = {"all_reduce": -1, "all_gather": -1, "reduce_scatter": -1, "broadcast": 0}


# canonical name -> (nccl-tests type name, bytes per element)
DTYPES = {"float32": ("float", 4), "float16": ("half", 2), "bfloat16": ("bfloat16", 2), "float64": ("double", 8),
          "int32": ("int32", 4), "int64": ("int64", 8), "int8": ("int8", 1), "uint8": ("uint8", 1)}


DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "fp32": "float32",
                 "fp16": "float16", "bf16": "bfloat16", "int": "int32", "char": "int8"}


# Row keys shared by the sweep and the nccl-tests parser (the --json/--csv columns).
COLUMNS = ["op", "size_bytes", "count", "dtype", "redop", "root", "time_us", "algbw_GBps", "busbw_GBps",
           "wrong", "world_size", "backend", "in_place"]


SWEEP_EXTRA = ["device", "time_max_us", "busbw_slowest_GBps", "iters", "warmup"]


def canonical_dtype(name: str) -> str:
    """'float' -> 'float32', 'half' -> 'float16', ...; LabInputError for an unknown type."""
    name = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    return check_choice("dtype", name, tuple(DTYPES))


def element_bytes(dtype: str) -> int:
    """Bytes per element: float32 4, bfloat16 and float16 2, float64 8, ... (aliases accepted)."""
    return DTYPES[canonical_dtype(dtype)][1]


def bus_factor(op: str, world_size):
    """busbw / algbw for `op` on N ranks: 2(N-1)/N all_reduce, (N-1)/N all_gather and
    reduce_scatter, 1 broadcast (nccl-tests). N=1 gives 0 for all but broadcast.

    For all_reduce, 2(N-1)/N is also the share of the buffer each rank sends (and receives) in a
    ring. A float for one N; numpy-vectorised over an array of N.
    """
    check_choice("op", op, OPS)
    if np.ndim(world_size) == 0:
        n = float(check_int("world_size", np.asarray(world_size).item(), low=1, high=MAX_RANKS))
    else:
        check_whole("world_size", world_size, low=1, high=MAX_RANKS, unit="ranks")
        n = np.asarray(world_size, dtype=float)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0 if np.ndim(n) == 0 else np.ones_like(n)


def bandwidths_GBps(op: str, size_bytes: float, time_us: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in decimal GB/s: algbw = size_bytes / time_us / 1e3; busbw = algbw * factor.
    A time that is not positive (a row nccl-tests could not time) gives (NaN, NaN)."""
    check_range("size_bytes", size_bytes, low=0, high=math.inf, high_open=True, unit="bytes")
    if np.ndim(size_bytes) or np.ndim(time_us):
        raise LabInputError("bandwidths_GBps takes one row: one size_bytes and one time_us")
    try:
        time_us = float(time_us)
    except (TypeError, ValueError, OverflowError):
        raise LabInputError(f"time_us must be a number of microseconds, got {time_us!r}") from None
    if not time_us > 0:
        return math.nan, math.nan
    algbw = size_bytes / time_us / 1e3
    return algbw, algbw * bus_factor(op, world_size)


@dataclass(frozen=True)
class Layout:
    """Buffers of one collective call. `size_bytes` and `count` follow nccl-tests' columns;
    `per_rank` is the element count each rank contributes (all_gather) or keeps (reduce_scatter)."""

    op: str
    dtype: str
    world_size: int
    count: int
    per_rank: int
    size_bytes: int


def layout(op: str, size_bytes: int, dtype: str, world_size: int) -> Layout | None:
    """The buffers nccl-tests uses for a requested size (rounded down to whole elements per rank).

    None when the size holds no element per rank (e.g. 4 bytes of float across 3 ranks).
    """
    elem = element_bytes(dtype)
    total = int(size_bytes) // elem
    if op in ("all_gather", "reduce_scatter"):
        per_rank = total // world_size
        if per_rank == 0:
            return None
        return Layout(op, dtype, world_size, per_rank, per_rank, per_rank * world_size * elem)
    if total == 0:
        return None
    return Layout(op, dtype, world_size, total, total, total * elem)


def sweep_sizes(min_bytes, max_bytes, factor: int = 2) -> list[int]:
    """min, min*f, min*f^2, ... <= max (nccl-tests' -b -e -f); sizes accept K/M/G (1024-based)."""
    lo = parse_size(min_bytes, "min_bytes")
    hi = parse_size(max_bytes, "max_bytes")
    factor = check_int("factor", factor, low=2)
    if lo < 1:
        raise LabInputError(f"min_bytes={lo} is outside the allowed range [1, inf) bytes")
    if lo > hi:
        raise LabInputError(f"min_bytes={format_size(lo)} is larger than max_bytes={format_size(hi)}")
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    return sizes


# --- printing the sweep as nccl-tests prints it ---------------------------------------------------

def _num(value: float, width: int) -> str:
    """nccl-tests' number style: 2 decimals while they fit, then 1, 0, then exponent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'N/A':>{width}}"
    for text in (f"{value:.2f}", f"{value:.1f}", f"{value:.0f}"):
        if len(text) <= width:
            return f"{text:>{width}}"
    return f"{value:>{width}.1e}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_nccl_table(frame: pd.DataFrame, meta: dict | None = None) -> str:
    """The sweep as nccl-tests prints it: size, count, type, redop, root, time, algbw, busbw, #wrong,
    then the "Out of bounds values" and "Avg bus bandwidth" lines.

    A frame read from an old layout (no `root` column: every root NaN) is printed without it. The
    summary lines quote `meta["avg_busbw_text"]` and `meta["out_of_bounds"]` when given (a parsed
    log's own lines), else they are computed over the rows.
    """
    meta = meta or {}
    lines = []
    if meta.get("budget_ms") is not None:
        lines.append(f"# labutils sweep: {meta.get('backend')} on {meta.get('device')}, {meta.get('world_size')} "
                     f"rank(s), warm-up {meta.get('warmup')}, ~{float(meta['budget_ms']):.4g} ms timed per size")
    if meta.get("backend_reason"):
        lines.append(f"# backend: {meta['backend_reason']}")
    has_root = bool(len(frame)) and bool(frame["root"].notna().any())
    root_head, root_unit = (f"  {'root':>6}", f"  {'':>6}") if has_root or not len(frame) else ("", "")
    lines.append("#")
    lines.append(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}{root_head}  {'time':>7}  "
                 f"{'algbw':>6}  {'busbw':>6}  {'#wrong':>6}")
    lines.append(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}{root_unit}  {'(us)':>7}  "
                 f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}")
    several_ops = frame["op"].nunique() > 1 if len(frame) else False
    op = None
    for r in frame.to_dict("records"):
        if several_ops and r["op"] != op:
            op = r["op"]
            lines.append(f"# --- {op}")
        dtype = DTYPES.get(r["dtype"], (r["dtype"], 0))[0]
        wrong = "N/A" if _missing(r["wrong"]) else f"{int(r['wrong'])}"
        root = "" if not root_head else f"  {'N/A' if _missing(r['root']) else int(r['root']):>6}"
        lines.append(f"{int(r['size_bytes']):>12}  {int(r['count']):>12}  {dtype:>8}  {r['redop']:>6}{root}  "
                     f"{_num(r['time_us'], 7)}  {_num(r['algbw_GBps'], 6)}  {_num(r['busbw_GBps'], 6)}  {wrong:>6}")
    bad = meta.get("out_of_bounds")
    if bad is None:
        bad = int((frame["wrong"].fillna(0) > 0).sum()) if len(frame) else 0
    lines.append(f"# {'Out of bounds values':<20} : {bad} {'FAILED' if bad else 'OK'}")
    avg = meta.get("avg_busbw_text")
    if avg is None:
        avg = f"{float(frame['busbw_GBps'].mean()) if len(frame) else math.nan:g}"
    lines.append(f"# {'Avg bus bandwidth':<20} : {avg}")
    lines.append("#")
    return "\n".join(lines)


def print_rows(frame: pd.DataFrame, meta: dict | None, as_json: bool, as_csv: bool) -> None:
    """Print rows as JSON records, CSV, or the nccl-tests table (shared by sweep and parse-nccl-tests)."""
    if as_json:
        print(to_json(frame.to_dict("records")))
    elif as_csv:
        print(frame.to_csv(index=False), end="")
    else:
        print(format_nccl_table(frame, meta))
