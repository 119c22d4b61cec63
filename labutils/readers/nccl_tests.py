"""The nccl-tests format: reading its output (all_reduce_perf and friends) into the sweep's DataFrame
columns, checking each row's arithmetic as nccl-tests computes it, and deciding how many ranks a log
ran on (its table is printed by labutils.core.busbw).

Reading takes two inputs:
- the text log. Layouts handled: current (`size count type redop root` + out-of-place and
  in-place `time algbw busbw #wrong`), old 2.x (no `root`; an `error` column holding the largest
  deviation instead of a count; alltoall rows whose `redop` cell is blank), all_gather/broadcast
  variants without `redop`, the 2017-2018 layout (`bytes N type op time algbw busbw res`, time in
  ms), the per-iteration layout (`i_min ...` columns), `cputime` (-C 1), `N/A` in #wrong, numbers
  such as `16330` or `1.2e+06`, launcher prefixes (`0: ` from srun --label, `[1,0]<stdout>:` from
  mpirun --tag-output, also glued inside a row, as is a bare `[0]`), lines whose leading `#` a
  web page ate or escaped (`\\#`), binaries named `all_gather_perf_mpi` and the like, and NCCL
  INFO / launcher lines between rows, even in the middle of a row.
- the JSON written with `-J FILE` (nccl-tests 2.16+): `results[*].out_of_place/in_place`.

Every row read becomes two rows, `in_place` False (out-of-place half) and True (in-place half).

Each row is held to what nccl-tests prints (src/common.cu, src/util.cu and each op's *_GetBw):
time > 0 us; size = count x type size (x N for the ops whose count is per rank: all_gather,
reduce_scatter, alltoall, gather, scatter, hypercube); algbw = size / time / 1e3 GB/s; busbw =
algbw x the op's bus factor (2(N-1)/N all_reduce, (N-1)/N all_gather, reduce_scatter, alltoall,
gather, scatter, 1 otherwise); logs from before nccl-tests 2.6 put (N-1)/N into algbw and printed
busbw = algbw for the per-rank ops, which is accepted too. Each comparison allows the rounding of
the printed numbers (half a unit of the last printed digit: `583.1` is 583.1 +- 0.05).

How many ranks a log ran on (`decide_world_size`) weighs what the log says (the header's thread and
GPU counts, the command line's -g and its launcher's process count, NCCL INFO lines, the rank
lines) against what its numbers say (busbw / algbw is the bus factor of N ranks; size / count is
N for the per-rank ops), and says why when they disagree.

The sweep's rows are printed in the same columns (`labutils.core.busbw.format_nccl_table`, what
`python -m labutils sweep` and `parse-nccl-tests` print), so this reader reads them back.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from labutils.core.busbw import COLUMNS, DTYPE_ALIASES, DTYPES, OPS, bus_factor, print_rows
from labutils.core.inputs import LabInputError, check_choice, check_int
from labutils.readers.sources import read_text

_PREFIX = re.compile(r"^\s*(?:\d+:\s|\[\d+,\d+\]<std(?:out|err)>:\s?)")
# Launcher tags and a bare "[0]" that other output glued inside a row (replaced by blanks of the
# same width, so the header's column ends still line up).
_INNER_TAG = re.compile(r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?")
_NUMBER = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_GLUED = re.compile(r"^(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(\D.*)$")
# all_gather_perf, all_gather_perf_mpi, reduce_scatter_perf.exe ...: the op is the name before _perf.
_PROGRAM = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv|gather|"
                      r"scatter|hypercube)_perf(?:_?\w+)?\b")
_RANK_LINE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                        r"\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version\s+(\S+)|nccl-library=(\d+)")
_HEADER_GPUS = re.compile(r"^#?\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\b")
_COMMAND_GPUS = re.compile(r"_perf\w*\s(?:.*\s)?(?:-g|--ngpus)[\s=]*(\d+)\b")
_COMMAND_THREADS = re.compile(r"_perf\w*\s(?:.*\s)?(?:-t|--nthreads)[\s=]*(\d+)\b")
_LAUNCHER = re.compile(r"(?:^|[\s/])(mpirun|mpiexec|orterun|srun)\s")
_MPI_PROCS = re.compile(r"\s(?:-np|--np|-n|-c)[\s=]+(\d+)\b")
_SRUN_TASKS = re.compile(r"\s(?:-n|--ntasks)[\s=]+(\d+)\b")
_SRUN_NODES = re.compile(r"\s(?:-N|--nodes)[\s=]+(\d+)\b")
_SRUN_PER_NODE = re.compile(r"\s--ntasks-per-node[\s=]+(\d+)\b")
_INFO_NRANKS = re.compile(r"NCCL INFO\b.*\brank\s+(\d+)\s+nranks\s+(\d+)\b")
_INT = re.compile(r"^-?\d+$")
# Every program of nccl-tests (what --op may name), and those whose busbw/algbw ratio gives N.
PROGRAMS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv", "gather",
            "scatter", "hypercube")
RATIO_OPS = ("all_reduce", "all_gather", "reduce_scatter")
# The ops whose printed count is per rank: size = count x type size x N (their *_GetCollByteCount).
PER_RANK_OPS = ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter", "hypercube")
# Bytes per element of every type nccl-tests prints (its test_typenames) and the lab's names.
TYPE_BYTES = {"int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2,
              "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
_TYPES = set(DTYPES) | set(DTYPE_ALIASES) | set(TYPE_BYTES)
_REDOPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none", "all"}
_TIME_NAMES = {"time", "cputime"}
# The 2017-2018 header's names for today's columns (its time was in ms).
_OLD_NAMES = {"bytes": "size", "N": "count", "op": "redop", "res": "error"}
MAX_RANKS = 1 << 20  # far above any job; a larger count in a log is a corrupt line
MAX_GPUS_PER_PROCESS = 1024  # nGpus and nThread of one process: no machine holds more
MAX_SIZE_BYTES = 1 << 50  # 1 PiB: far above any buffer a collective of today's GPUs can hold
# nccl-tests prints its preamble (nThread line, rank lines, header) before NCCL's INFO lines, so a
# file with none of it, nor a row, this far in is no nccl-tests log: refused without reading on.
MAX_LINES_BEFORE_OUTPUT = 100_000
_JSON_HALF_UNIT = 5e-7  # -J writes every number with %lf (6 decimals)


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests output: `frame` in the sweep's COLUMNS (+ `max_error` for old logs)
    and `meta` (program, op, world_size, devices, nccl_version, avg_busbw_GBps, source)."""

    frame: pd.DataFrame
    meta: dict = field(default_factory=dict)


def _op_from_program(name: str | None) -> str:
    match = _PROGRAM.search(name or "")
    return match.group(1) if match else "unknown"


def _dtype(name: str) -> str:
    name = name.lower()
    return DTYPE_ALIASES.get(name, name)


def _value(token: str) -> float:
    """A number cell: '16330', '1.2e+06', '0.00'; 'N/A' and 'nan' are NaN."""
    if token.upper() in ("N/A", "NAN", "-NAN"):
        return math.nan
    return float(token)


def _half_unit(token: str) -> float:
    """Half a unit of the last digit printed: '583.1' -> 0.05, '16330' -> 0.5, '1.2e+05' -> 5000."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    try:
        return 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    except (ValueError, OverflowError):
        return math.inf


def _is_cell(token: str) -> bool:
    return (bool(_NUMBER.match(token)) or token.upper() in ("N/A", "NAN", "-NAN", "INF", "-INF")
            or token.lower() in _TYPES | _REDOPS)


def _cells(line: str, ends: list[int] | None = None) -> list[str]:
    """The row cells at the start of `line`, stopping where other output (an INFO line) was glued on.

    nccl-tests right-aligns each value under its header name, so with the header's column `ends`
    a value glued to an INFO line ('    -1node7:123:456 [0] NCCL INFO ...') is cut where its
    column ends; without them the leading number is taken.
    """
    out = []
    for match in re.finditer(r"\S+", line):
        token = match.group(0)
        if _is_cell(token):
            out.append(token)
            continue
        i = len(out)
        if ends and i < len(ends) and match.start() < ends[i] < match.end():
            head = line[match.start():ends[i]]
            if _NUMBER.match(head) or _is_cell(head):
                out.append(head)
        elif _GLUED.match(token):
            out.append(_GLUED.match(token).group(1))
        break
    return out


def _header_columns(line: str) -> tuple[list[str], list[int], bool] | None:
    """(names, end offsets, time in ms) from a header line such as '#  size  count  type  redop  root
    time ...' (or the 2017 '#  bytes  N  type  op  time ...', whose time was printed in ms)."""
    found = [(m.group(0), m.end()) for m in re.finditer(r"[^\s#\\]\S*", line)]
    names = [n for n, _ in found]
    if len(names) >= 4 and names[:2] in (["size", "count"], ["bytes", "N"]) and "type" in names[:3]:
        old = names[0] == "bytes"
        kept = [(_OLD_NAMES.get(n, n) if old else n, e) for n, e in found if n != "timestamp"]
        return [n for n, _ in kept], [e for _, e in kept], old
    return None


def _guess_columns(cells: list[str]) -> list[str]:
    """Columns for a row seen without a header: optional redop and root, then groups of 4."""
    cols = ["size", "count", "type"]
    rest = cells[3:]
    if rest and rest[0].lower() in _REDOPS:
        cols.append("redop")
        rest = rest[1:]
    if rest and len(rest) % 4 == 1 and re.match(r"^-?\d+$", rest[0]):
        cols.append("root")
        rest = rest[1:]
    groups = max(1, len(rest) // 4)
    return cols + ["time", "algbw", "busbw", "#wrong"] * groups


def _fill_blank_redop(cells: list[str], columns: list[str]) -> list[str]:
    """Old alltoall rows leave the redop cell blank ('float           520935 ...'): put an empty cell
    there so the later columns keep their places."""
    if "redop" in columns:
        i = columns.index("redop")
        if i < len(cells) and cells[i].lower() not in _REDOPS and _NUMBER.match(cells[i]):
            return cells[:i] + [""] + cells[i:]
    return cells


def _halves(columns: list[str]) -> list[dict]:
    """Positions of (time, algbw, busbw, wrong) for the out-of-place and in-place halves."""
    halves = []
    for i, name in enumerate(columns):
        if name in _TIME_NAMES and i + 3 < len(columns) and columns[i + 1] == "algbw":
            halves.append({"time": i, "algbw": i + 1, "busbw": i + 2, "wrong": i + 3,
                           "wrong_is_error": columns[i + 3] == "error", "cputime": name == "cputime"})
    return halves


def _needed(columns: list[str]) -> int:
    """Cells a complete row has: up to the #wrong of its last half."""
    halves = _halves(columns)
    return halves[-1]["wrong"] + 1 if halves else len(columns)


@dataclass(frozen=True)
class _Layout:
    columns: list[str]
    time_ms: bool = False


def _rows_from_cells(cells: list[str], layout: _Layout, where: tuple[int, str]) -> list[dict]:
    """The row's out-of-place and in-place halves; LabInputError for a cell that is not what its
    column holds (a size that is no whole number, a negative or infinite value)."""
    try:
        return _convert_cells(cells, layout, where)
    except (ValueError, IndexError, OverflowError):
        raise LabInputError(f"the nccl-tests row at line {where[0]} ({where[1]!r}) has a cell that does not fit "
                            f"its column ({', '.join(layout.columns)})") from None


def _convert_cells(cells: list[str], layout: _Layout, where: tuple[int, str]) -> list[dict]:
    columns = layout.columns
    pos = {name: columns.index(name) for name in ("size", "count", "type", "redop", "root") if name in columns}
    size, count = cells[pos["size"]], cells[pos["count"]]
    if not (_INT.match(size) and _INT.match(count)):
        raise ValueError("size and count are whole numbers")
    root = cells[pos["root"]] if "root" in pos else None
    if root is not None and not _INT.match(root):
        raise ValueError("root is a whole number")
    redop = cells[pos["redop"]] if "redop" in pos else "none"
    base = {"op": "unknown", "size_bytes": int(size), "count": int(count),
            "dtype": _dtype(cells[pos["type"]]), "redop": redop or "none",
            "root": int(root) if root is not None else math.nan, "world_size": math.nan, "backend": "nccl",
            "_line": where[0], "_text": where[1], "_type": cells[pos["type"]].lower()}
    scale = 1e3 if layout.time_ms else 1.0
    rows = []
    for half, at in enumerate(_halves(columns)):
        if at["wrong"] >= len(cells):
            break
        raw_wrong = _value(cells[at["wrong"]])
        t, alg, bus = cells[at["time"]], cells[at["algbw"]], cells[at["busbw"]]
        rows.append({**base, "time_us": _value(t) * scale, "algbw_GBps": _value(alg), "busbw_GBps": _value(bus),
                     "wrong": math.nan if at["wrong_is_error"] else raw_wrong,
                     "max_error": raw_wrong if at["wrong_is_error"] else math.nan, "in_place": half == 1,
                     "_dt": _half_unit(t) * scale, "_dalg": _half_unit(alg), "_dbus": _half_unit(bus),
                     "_cputime": at["cputime"]})
    return rows


_CHECKED = (("size_bytes", "size"), ("count", "count"), ("time_us", "time"), ("algbw_GBps", "algbw"),
            ("busbw_GBps", "busbw"), ("wrong", "#wrong"))


def _where(row: dict) -> str:
    line = f" at line {row['_line']}" if row.get("_line") else ""
    return f"the nccl-tests row{line} ({str(row.get('_text', row['size_bytes']))[:140]!r})"


def _check_rows(rows: list[dict]) -> None:
    """LabInputError naming the row for a number no run prints: a negative or infinite cell, a time
    that is not > 0, a bandwidth that is not a number, a size over MAX_SIZE_BYTES (N/A #wrong passes)."""
    for row in rows:
        for key, column in _CHECKED:
            value = row[key]
            if isinstance(value, float) and math.isnan(value):
                if key in ("time_us", "algbw_GBps", "busbw_GBps"):
                    raise LabInputError(f"{column} is not a number in {_where(row)}; nccl-tests prints a time > 0 "
                                        "and finite bandwidths for every row")
                continue
            if value < 0 or math.isinf(value):
                raise LabInputError(f"{column}={value!r} in {_where(row)} is outside the allowed range [0, inf)")
        if not row["time_us"] > 0:
            raise LabInputError(f"time=0 in {_where(row)}: nccl-tests prints a time > 0 us for every size")
        if row["size_bytes"] > MAX_SIZE_BYTES:
            raise LabInputError(f"size={row['size_bytes']} in {_where(row)} is outside the allowed range "
                                f"[0, {MAX_SIZE_BYTES}] bytes (1 PiB)")


# --- each row's arithmetic, as nccl-tests computes it -------------------------------------------------

def nccl_tests_bus_factor(op: str, n: int) -> float:
    """busbw / algbw as each op's *_GetBw in nccl-tests: 2(N-1)/N all_reduce; (N-1)/N all_gather,
    reduce_scatter, alltoall, gather, scatter; 1 broadcast, reduce, sendrecv, hypercube."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def _conventions(op: str, n: int | None) -> list[tuple[float, float]]:
    """(algbw / (size/time), busbw / algbw) pairs a version of nccl-tests printed for `op` on N ranks:
    today's (1, factor); hypercube's ((N-1)/N, 1); and, before nccl-tests 2.6, ((N-1)/N, 1) for the
    per-rank ops. [] when N is unknown and the op's numbers depend on it."""
    if op in ("broadcast", "reduce", "sendrecv"):
        return [(1.0, 1.0)]
    if n is None or op not in PROGRAMS:
        return []
    share = (n - 1) / n
    if op == "hypercube":
        return [(share, 1.0)]
    found = [(1.0, nccl_tests_bus_factor(op, n))]
    if op in PER_RANK_OPS:
        found.append((share, 1.0))
    return found


def _count_world(rows: list[dict], op: str) -> tuple[int | None, str]:
    """N from size = count x type size x N (the per-rank ops), after checking every row's count;
    LabInputError naming the first row whose count does not match its size and type."""
    found = None
    for row in rows:
        width = TYPE_BYTES.get(row["_type"])
        size, count = row["size_bytes"], row["count"]
        if width is None:
            continue
        if (size == 0) != (count == 0):
            raise LabInputError(f"count={count} does not match size={size} in {_where(row)}: nccl-tests prints "
                                "count = size / type size (0 with 0)")
        if count == 0:
            continue
        per = count * width
        if op in PER_RANK_OPS or op not in PROGRAMS:
            if size % per:
                raise LabInputError(f"count={count} does not match size={size} in {_where(row)}: size / (count x "
                                    f"{width} bytes of {row['_type']}) is not a whole number of ranks")
            if op in PER_RANK_OPS:
                n = size // per
                if found is not None and n != found[0]:
                    raise LabInputError(f"count={count} does not match size={size} in {_where(row)}: it says {n} "
                                        f"ranks where the row at line {found[1]['_line']} says {found[0]}")
                found = found or (n, row)
        elif size != per:
            raise LabInputError(f"count={count} does not match size={size} in {_where(row)}: {op} prints count = "
                                f"size / {width} bytes of {row['_type']} = {size / width:g}")
    return (found[0], "size / (count x type size)") if found else (None, "")


def _check_arithmetic(rows: list[dict], op: str, world: int | None) -> None:
    """LabInputError naming the first row whose algbw is not size / time or whose busbw is not
    algbw x the op's factor, beyond the rounding of the printed numbers (half a unit of each one's
    last digit, the time's carried through size / time)."""
    for row in rows:
        size, t, alg, bus = row["size_bytes"], row["time_us"], row["algbw_GBps"], row["busbw_GBps"]
        d_alg, d_bus = row.get("_dalg", _JSON_HALF_UNIT), row.get("_dbus", _JSON_HALF_UNIT)
        raw = size / (t * 1e3)  # GB/s: nccl-tests' bytes / 1e9 / seconds
        d_raw = raw * row.get("_dt", _JSON_HALF_UNIT) / t
        if op not in PROGRAMS:
            if alg > raw + d_raw + d_alg + 1e-6 * raw:
                raise LabInputError(f"algbw={alg:g} GB/s in {_where(row)} is above size / time = {raw:.6g} GB/s "
                                    "(nccl-tests prints algbw <= size / time / 1e3)")
            continue
        conventions = _conventions(op, world)
        if not conventions:
            top = 2.0 if op == "all_reduce" else 1.0  # the factor's bound over every N
            if op in RATIO_OPS + PER_RANK_OPS and bus > top * alg + d_bus + top * d_alg:
                raise LabInputError(f"busbw={bus:g} GB/s in {_where(row)} is above {top:g} x algbw = {top * alg:.6g} "
                                    f"GB/s, more than the bus factor of {op} on any number of ranks")
            continue
        alg_ok = [(a, b) for a, b in conventions if row.get("_cputime") or abs(alg - a * raw) <= a * d_raw + d_alg
                  + 1e-6 * raw]
        if not alg_ok:
            a = conventions[0][0]
            raise LabInputError(f"algbw={alg:g} GB/s in {_where(row)} contradicts size / time = {a * raw:.6g} GB/s "
                                f"(nccl-tests: algbw = size / time / 1e3, printed to the rounding of its digits)")
        if not any(abs(bus - b * alg) <= d_bus + b * d_alg + 1e-6 * alg for _, b in alg_ok):
            b = alg_ok[0][1]
            n = f" on {world} ranks" if world else ""
            raise LabInputError(f"busbw={bus:g} GB/s in {_where(row)} is not algbw x {b:.4g} = {b * alg:.6g} GB/s, the "
                                f"bus factor of {op}{n} (nccl-tests: busbw = algbw x factor)")


# --- the whole log ------------------------------------------------------------------------------------

def _launcher_processes(line: str) -> tuple[str, int] | None:
    """('mpirun -np 2', 2) from a command line that runs a *_perf binary under a launcher."""
    found = _LAUNCHER.search(line)
    if not found or found.start() > line.find("_perf"):
        return None
    head = line[found.start():line.find("_perf")]
    if found.group(1) == "srun":
        tasks, nodes, per = _SRUN_TASKS.search(head), _SRUN_NODES.search(head), _SRUN_PER_NODE.search(head)
        if tasks:
            return f"srun -n {tasks.group(1)}", int(tasks.group(1))
        if nodes and per:
            return (f"srun --nodes {nodes.group(1)} --ntasks-per-node {per.group(1)}",
                    int(nodes.group(1)) * int(per.group(1)))
        return None
    procs = _MPI_PROCS.search(head)
    return (f"{found.group(1)} -np {procs.group(1)}", int(procs.group(1))) if procs else None


class _Meta:
    """What the log says about itself, gathered line by line: program, devices, NCCL version,
    summary lines (the "Avg bus bandwidth" line as printed, `avg_busbw_text`), and the raw
    evidence of the world size."""

    def __init__(self):
        self.meta = {"program": None, "devices": [], "nccl_version": None, "avg_busbw_GBps": math.nan,
                     "avg_busbw_text": None, "out_of_bounds": None, "format": "text"}
        self.ranks, self.rank_pids, self.pids = {}, {}, set()
        self.header, self.command, self.launcher, self.info = None, None, None, {}
        self.plain_command = False

    def seen(self) -> bool:
        """Whether a line only nccl-tests prints (its program's name, nThread, a rank line) was read."""
        return bool(self.meta["program"] or self.header or self.ranks)

    def command_line(self, line: str) -> None:
        program = _PROGRAM.search(line)
        if not program:
            return
        if self.meta["program"] is None:
            self.meta["program"] = program.group(0)
        if line.lstrip().startswith("#"):
            return
        gpus, threads = _COMMAND_GPUS.search(line), _COMMAND_THREADS.search(line)
        if self.command is None:
            self.command = (int(gpus.group(1)) if gpus else None, int(threads.group(1)) if threads else None)
        launcher = _launcher_processes(line)
        if launcher and self.launcher is None:
            self.launcher = launcher
        elif not _LAUNCHER.search(line) and re.match(r"^\s*(?:\S*[$#]\s+)?\S*_perf", line):
            self.plain_command = True  # the binary itself started the run: one process

    def line(self, s: str) -> None:
        if "_perf" in s:
            self.command_line(s)
        if "nThread" in s:
            header = _HEADER_GPUS.match(s)
            if header and self.header is None:
                self.header = (int(header.group(1)), int(header.group(2)))
        if "Rank" in s:
            rank = _RANK_LINE.match(s)
            if rank:
                r, pid = int(rank.group(1)), (rank.group(2), rank.group(3))
                if r > MAX_RANKS:
                    raise LabInputError(f"the rank line {s.strip()[:100]!r} names rank {r}, outside the allowed "
                                        f"range [0, {MAX_RANKS}]")
                self.rank_pids.setdefault(r, set()).add(pid)
                self.ranks[r] = rank.group(6).strip()
                self.pids.add(pid)
        if "NCCL" in s or "nccl-library" in s:
            version = _NCCL_VERSION.search(s)
            if version and self.meta["nccl_version"] is None:
                self.meta["nccl_version"] = version.group(1) or version.group(2)
            info = _INFO_NRANKS.search(s)
            if info:
                self.info.setdefault(int(info.group(2)), True)
        if "Avg bus" in s:
            avg = _AVG.match(s)
            if avg:
                self.meta["avg_busbw_GBps"] = float(avg.group(1))
                self.meta["avg_busbw_text"] = avg.group(1)
        if "Out of bounds" in s:
            oob = _OOB.match(s)
            if oob:
                self.meta["out_of_bounds"] = int(oob.group(1))

    def evidence(self) -> dict:
        """The world size's sources: `exact` ({name: N}), `per_process` ({name: ranks per process}),
        `ranks`, `processes`, whether the log shows one process (`single`) or several that each ran
        alone (`independent`: a rank 0 line from each, nccl-tests built without MPI=1)."""
        self.meta["devices"] = [self.ranks[r] for r in sorted(self.ranks)]
        independent = len(self.rank_pids.get(0, ())) if len(self.rank_pids.get(0, ())) > 1 else 0
        evidence = {"per_process": {}, "exact": {}, "ranks": sorted(self.ranks), "processes": len(self.pids),
                    "independent": independent}
        threads, gpus = self.header or (None, None)
        for name, value in (("nThread", threads), ("nGpus", gpus)):
            if value is not None and not 1 <= value <= MAX_GPUS_PER_PROCESS:
                raise LabInputError(f"the header's {name} {value} is outside the allowed range [1, "
                                    f"{MAX_GPUS_PER_PROCESS}] (GPUs and threads of one process)")
        if self.header:
            evidence["per_process"][f"nThread {threads} nGpus {gpus} in the header"] = threads * gpus
        cmd_gpus, cmd_threads = self.command or (None, None)
        if cmd_gpus is not None:
            if not 1 <= cmd_gpus <= MAX_GPUS_PER_PROCESS:
                raise LabInputError(f"-g {cmd_gpus} on the command line is outside the allowed range "
                                    f"[1, {MAX_GPUS_PER_PROCESS}] (GPUs per process)")
            evidence["per_process"][f"-g {cmd_gpus} on the command line"] = cmd_gpus * (cmd_threads or threads or 1)
        per = (cmd_gpus or gpus or 1) * (cmd_threads or threads or 1)
        if self.launcher and not independent:
            name, procs = self.launcher
            if not 1 <= procs * per <= MAX_RANKS:
                raise LabInputError(f"{name} x {per} GPUs per process is outside the allowed range [1, {MAX_RANKS}]")
            evidence["exact"][f"{name} x {per} GPU{'s' if per > 1 else ''} per process"] = procs * per
        for n in self.info:
            if not 1 <= n <= MAX_RANKS:
                raise LabInputError(f"NCCL INFO nranks {n} is outside the allowed range [1, {MAX_RANKS}]")
            evidence["exact"].setdefault(f"NCCL INFO nranks {n}", n)
        evidence["single"] = bool(independent) or len(self.pids) == 1 or (self.plain_command and not self.launcher
                                                                            and len(self.pids) <= 1)
        return evidence


def _is_row_start(cells: list[str]) -> bool:
    return len(cells) >= 4 and bool(_NUMBER.match(cells[0]) and _NUMBER.match(cells[1])) and cells[2].lower() in _TYPES


def _clean(raw: str) -> str:
    """A line without its launcher prefix and with a web page's escaped '\\#' put back."""
    s = _PREFIX.sub("", raw, count=1) if raw[:1] in "[ \t0123456789" else raw
    return s.replace("\\#", "#", 1) if s[:2] == "\\#" or s.lstrip()[:2] == "\\#" else s


def parse_text(text: str, op: str | None = None, nranks: int | None = None) -> NcclTestsLog:
    """Parse an nccl-tests text log; `op` overrides the collective read from the log.

    The header line gives the columns (and where each ends); rows are lines starting with
    size, count and type. A row cut short by other output waits for a line of numbers only.
    One pass with a few substring tests per line that can be no row, so a long file of other
    text is refused in linear time.
    """
    meta = _Meta()
    layout, ends, pending, rows, command = None, None, None, [], ""
    for number, raw in enumerate(text.splitlines(), 1):
        if number > MAX_LINES_BEFORE_OUTPUT and not (rows or layout or meta.seen()):
            raise LabInputError(f"no nccl-tests output in the first {MAX_LINES_BEFORE_OUTPUT} lines (no header, "
                                "rank line or result row, which nccl-tests prints before NCCL's own lines): "
                                "is this an nccl-tests log?")
        s = _clean(raw)
        stripped = s.strip()
        if not stripped:
            continue
        if stripped.endswith("\\"):  # a command line continued on the next line
            command += stripped[:-1] + " "
            continue
        if command:
            meta.line(command + stripped)
            command = ""
            continue
        if not (stripped[0].isdigit() or stripped[0] == "-" and stripped[1:2].isdigit()):  # no row: other text
            if "size" in stripped or "bytes" in stripped:
                found = _header_columns(stripped if stripped[0] == "#" else "# " + stripped)
                if found:
                    shift = len(s) - len(s.lstrip()) - (0 if stripped[0] == "#" else 2)
                    layout, ends = _Layout(found[0], found[2]), [e + shift for e in found[1]]
                    continue
            meta.line(s)
            continue
        if "NCCL" in s:
            meta.line(s)
        if "[" in s:
            s = _INNER_TAG.sub(lambda m: " " * len(m.group(0)), s)
        cells = _cells(s.rstrip(), ends)
        if pending is not None and not _is_row_start(cells):
            tokens = s.split()
            if not all(_NUMBER.match(t) or t.upper() == "N/A" for t in tokens):
                continue  # a stray line inside a row: keep waiting for the rest of the row
            cells, row_layout, where = pending[0] + tokens, pending[1], pending[2]
            pending = None
        else:
            if pending is not None:  # a new row began: the cut one never got its numbers
                rows.extend(_rows_from_cells(*pending))
                pending = None
            if not _is_row_start(cells):
                continue
            row_layout, where = layout or _Layout(_guess_columns(cells)), (number, raw.strip())
            cells = _fill_blank_redop(cells, row_layout.columns)
        if len(cells) < _needed(row_layout.columns):
            pending = (cells, row_layout, where)  # cut by other output; its numbers follow on a later line
            continue
        rows.extend(_rows_from_cells(cells, row_layout, where))
    if pending is not None:
        rows.extend(_rows_from_cells(*pending))
    found_op = op or _op_from_program(meta.meta["program"])
    for row in rows:
        row["op"] = found_op
    return _finish(rows, found_op, meta.evidence(), meta.meta, nranks)


def _finish(rows: list[dict], op: str, evidence: dict, meta: dict, nranks: int | None = None) -> NcclTestsLog:
    if not rows:
        raise LabInputError("no nccl-tests result rows found (expected lines such as "
                            "'     1048576        262144     float     sum      -1   ...')")
    _check_rows(rows)
    from_count, name = _count_world(rows, op)
    if from_count is not None:
        if not 1 <= from_count <= MAX_RANKS:
            raise LabInputError(f"world size: {name} says {from_count} ranks, outside the allowed range [1, "
                                f"{MAX_RANKS}]")
        evidence["exact"][name] = from_count
    decided, why = decide_world_size(evidence, rows, op, nranks)
    if decided is not None and "one process assumed" in why:
        try:  # a guess, not a source: kept only where every row's numbers fit it
            _check_arithmetic(rows, op, decided)
        except LabInputError:
            decided, why = None, "unknown: no source in the log gives the rank count (give --nranks)"
    _check_arithmetic(rows, op, decided)
    world = math.nan if decided is None else float(decided)
    for row in rows:
        row["world_size"] = world
    meta["world_size_source"] = why
    if evidence.get("independent"):
        meta["independent_runs"] = evidence["independent"]
    frame = pd.DataFrame(rows, columns=COLUMNS + ["max_error"])
    frame["world_size"] = frame["world_size"].astype(float) if math.isnan(world) else int(world)
    meta.update(op=op, world_size=None if math.isnan(world) else int(world), source="nccl-tests")
    if op in OPS and not math.isnan(world):
        meta["bus_factor"] = bus_factor(op, int(world))
    return NcclTestsLog(frame, meta)


def parse_json(doc: dict, op: str | None = None, nranks: int | None = None) -> NcclTestsLog:
    """Parse the document nccl-tests writes with `-J FILE` (JSON format version 2); LabInputError
    naming the field for a report whose `results` or a record's fields have the wrong type."""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise LabInputError("not an nccl-tests JSON report: 'results' is missing or not a list")
    try:
        return _parse_json(doc, op, nranks)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        if isinstance(exc, LabInputError):
            raise
        raise LabInputError(f"the nccl-tests JSON report has a field of the wrong type or missing "
                            f"({type(exc).__name__}: {exc}); expected results[*].size, count, type, "
                            "out_of_place/in_place") from None


def _whole(value, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not _INT.match(str(value).strip()):
        raise ValueError(f"{field_name}={value!r} is not a whole number")
    return int(str(value).strip())


def _parse_json(doc: dict, op: str | None, nranks: int | None) -> NcclTestsLog:
    args = doc.get("args") or []
    program = Path(str(args[0])).name if isinstance(args, list) and args else None
    found_op = op or _op_from_program(program)
    config = doc.get("config") or {}
    devices = (config.get("devices") if isinstance(config, dict) else None) or []
    if not isinstance(devices, list):
        raise TypeError("config.devices is not a list")
    evidence = {"per_process": {}, "exact": {f"{len(devices)} config.devices": len(devices)} if devices else {},
                "single": True}
    rows = []
    for i, rec in enumerate(doc["results"]):
        if not isinstance(rec, dict):
            raise TypeError(f"a result record is {type(rec).__name__}, not an object")
        root = str(rec.get("root", -1)).strip() or "-1"
        base = {"op": found_op, "size_bytes": _whole(rec["size"], "size"), "count": _whole(rec["count"], "count"),
                "dtype": _dtype(str(rec.get("type", ""))), "redop": str(rec.get("redop", "none")).strip(),
                "root": _whole(root, "root"), "world_size": math.nan, "backend": "nccl",
                "_type": str(rec.get("type", "")).lower()}
        base["_text"] = f"results[{i}]: size {base['size_bytes']} count {base['count']} {base['_type']}"
        for half, key in enumerate(("out_of_place", "in_place")):
            part = rec.get(key)
            if not part:
                continue
            if not isinstance(part, dict):
                raise TypeError(f"{key} is {type(part).__name__}, not an object")
            t = part.get("time", part.get("cpu_time"))
            rows.append({**base, "time_us": _json_float(t), "algbw_GBps": _json_float(part.get("alg_bw")),
                         "busbw_GBps": _json_float(part.get("bus_bw")), "wrong": _json_float(part.get("nwrong")),
                         "max_error": math.nan, "in_place": half == 1, "_cputime": "time" not in part})
    avg = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    meta = {"program": program,
            "devices": [d.get("device_info", "") if isinstance(d, dict) else str(d) for d in devices],
            "nccl_version": doc.get("nccl_version"), "avg_busbw_GBps": _json_float(avg),
            "avg_busbw_text": None if avg is None else str(avg),
            "out_of_bounds": (doc.get("out_of_bounds") or {}).get("count"), "format": "json"}
    return _finish(rows, found_op, evidence, meta, nranks)


def _json_float(value) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)  # nccl-tests writes NaN as the string "nan"
    except (TypeError, ValueError, OverflowError):
        return math.nan


def parse_nccl_tests(path_or_text, op: str | None = None, nranks: int | None = None) -> NcclTestsLog:
    """Parse a log file, a JSON report, or their text: JSON when the text starts with '{'.

    `op` names the collective when the log does not (one of PROGRAMS); `nranks` is the world size
    when the log does not say it, and must agree with every source that does (`decide_world_size`).
    A file is read through `labutils.readers.sources.read_text` (regular files only, its size cap).
    """
    if op is not None:
        check_choice("op", op, PROGRAMS)
    if nranks is not None:
        nranks = check_int("nranks", nranks, low=1, high=MAX_RANKS)
    text = str(path_or_text)
    if "\n" not in text and len(text) < 4096:
        text, source = read_text(text, "log"), text
    else:
        source = "<text>"
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise LabInputError(f"the JSON report does not parse ({exc}); was the run cut short?") from None
        log = parse_json(doc, op, nranks)
    else:
        log = parse_text(text, op, nranks)
    log.meta["file"] = source
    return log


# --- the world size -------------------------------------------------------------------------------

def _slack(v: float) -> float:
    return max(0.0051, 6e-4 * abs(v))  # 2 decimals, or 4 significant figures


def _bandwidth_pairs(rows: list[dict]) -> list[tuple[float, float, float, float]]:
    """(algbw, busbw, their rounding) of every row that printed both as finite numbers, algbw > 0;
    the rounding is half a unit of each one's last printed digit (else 2 decimals or 4 figures)."""
    return [(r["algbw_GBps"], r["busbw_GBps"], r.get("_dalg", _slack(r["algbw_GBps"])) + 1e-9,
             r.get("_dbus", _slack(r["busbw_GBps"])) + 1e-9) for r in rows
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (r["algbw_GBps"], r["busbw_GBps"]))
            and r["algbw_GBps"] > 0]


def _fits(pairs: list[tuple[float, float, float, float]], op: str, n: int) -> bool:
    """Whether busbw = algbw * factor(n) on every pair, within the columns' rounding."""
    factor = bus_factor(op, n)
    return all(abs(a * factor - b) <= db + factor * da for a, b, da, db in pairs)


def _n_from_ratio(rows: list[dict], op: str) -> int | None:
    """N from busbw = algbw * factor(N) on every row with a bandwidth: the one N whose factor
    reproduces each printed busbw within its rounding (2 decimals, or 4 significant figures), else None."""
    if op not in RATIO_OPS:
        return None
    pairs = _bandwidth_pairs(rows)
    if not pairs:
        return None
    alg, bus = max(pairs)[:2]
    ratio = bus / alg
    top = 2.0 if op == "all_reduce" else 1.0
    if not 0 <= ratio < top:
        return None
    guess = round(top / (top - ratio))
    if not 1 <= guess <= MAX_RANKS:
        return None
    near = [n for n in (guess - 1, guess + 1) if n >= 1 and _fits(pairs, op, n)]
    return guess if _fits(pairs, op, guess) and not near else None


def _ranks_tell(ranks: list[int], rows: list[dict], op: str) -> bool:
    """Whether the # Rank lines 0..k-1 can be the whole world: a log cut to its tail may keep only
    the first ranks, so k counts only when the bandwidth columns fit k ranks and rule out k + 1."""
    if not ranks or ranks != list(range(len(ranks))):
        return False
    pairs = _bandwidth_pairs(rows) if op in RATIO_OPS else []
    if not pairs:
        return True  # no numbers to hold them against
    return _fits(pairs, op, len(ranks)) and not _fits(pairs, op, len(ranks) + 1)


def decide_world_size(evidence: dict, rows: list[dict], op: str, nranks: int | None = None) -> tuple[int | None, str]:
    """(N, which source decided and which agree) from every source a log has; LabInputError when
    two disagree.

    Sources: `nranks` (the caller's override), NCCL INFO's `nranks`, the launcher's process count x
    GPUs per process (`mpirun -np 2 ... -g 1` is 2 ranks), size / (count x type size) for the
    per-rank ops (all exact); the header's nThread x nGpus and the command line's -g are ranks *per
    process*: the world size only where the log shows one process (one Pid on its rank lines, the
    binary run without a launcher, or processes that each ran alone), else a divisor of it; the
    busbw/algbw ratio (exact where it singles out one N) and the `# Rank` lines (a lower bound: a
    log cut to its tail keeps only some; the world size only when nothing else speaks). Last, with
    nothing else, the ranks of one process.
    """
    exact: list[tuple[str, int]] = []
    if nranks is not None:
        exact.append(("--nranks", nranks))
    exact += list(evidence.get("exact", {}).items())
    per_process = evidence.get("per_process", {})
    single = evidence.get("single", evidence.get("processes", 0) <= 1)
    if single:
        exact += [(name, n) for name, n in per_process.items()]
    ratio_n = _n_from_ratio(rows, op)
    if ratio_n is not None:
        exact.append(("busbw/algbw", ratio_n))
    ranks = evidence.get("ranks", [])
    at_least = max(len(ranks), ranks[-1] + 1) if ranks else 0
    alone = evidence.get("independent", 0)
    note = (f"; {alone} processes each ran alone (a rank 0 line from each: nccl-tests built without MPI=1)"
            if alone else "")

    def says(name, n):
        return f"{name} says {n}"

    if exact:
        name, world = exact[0]
        clash = [(m, n) for m, n in exact[1:] if n != world]
        if clash:
            raise LabInputError(f"world size: the log disagrees with itself: {says(name, world)}, "
                                + ", ".join(says(m, n) for m, n in clash)
                                + " (-g and nGpus count the GPUs of one process)"
                                + "; give the true rank count with --nranks only if the log is yours and complete")
        if world < at_least:
            raise LabInputError(f"world size: {says(name, world)} but the log lists a # Rank line for rank "
                                f"{ranks[-1]} ({at_least} ranks at least)")
        bad = [(m, p) for m, p in per_process.items() if world % p]
        if bad:
            raise LabInputError(f"world size: {says(name, world)} but {bad[0][0]} ({bad[0][1]} ranks per process) "
                                "does not divide it")
        agree = [m for m, _ in exact[1:]] + (["# Rank lines"] if ranks else [])
        return world, name + (f" (agrees: {', '.join(agree)})" if agree else "") + note
    if _ranks_tell(ranks, rows, op):
        return len(ranks), f"{len(ranks)} # Rank lines (nothing else in the log gives the rank count)"
    values = set(per_process.values())
    if len(values) == 1 and min(values) >= at_least:
        name, world = next(iter(per_process.items()))
        return world, f"{name}, one process assumed (nothing else in the log gives the rank count)"
    return None, "unknown: no source in the log gives the rank count (give --nranks)"


# --- nccl-tests against the lab's sweep -----------------------------------------------------------

def compare_with_sweep(log_frame: pd.DataFrame, sweep_frame: pd.DataFrame) -> pd.DataFrame:
    """busbw of nccl-tests (out-of-place) and of the lab's sweep at the sizes both measured."""
    left = log_frame[~log_frame["in_place"].astype(bool)][["size_bytes", "busbw_GBps"]]
    right = sweep_frame[["size_bytes", "busbw_GBps"]]
    both = left.merge(right, on="size_bytes", suffixes=("_nccl_tests", "_lab"))
    both["ratio_lab_to_nccl_tests"] = both["busbw_GBps_lab"] / both["busbw_GBps_nccl_tests"].replace(0, np.nan)
    return both


# --- command line ------------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    p = subparsers.add_parser("parse-nccl-tests", help="read an nccl-tests log or -J JSON into the sweep's rows",
                              description="Parse all_reduce_perf (and friends) output; prints the table, "
                                          "or rows as JSON/CSV with the sweep's keys plus in_place.")
    p.add_argument("log", help="nccl-tests stdout log, or the JSON file written with -J")
    p.add_argument("--op", default=None, choices=PROGRAMS, help="collective, when the log does not name its program")
    p.add_argument("--nranks", type=int, default=None,
                   help="the job's rank count, when the log does not say it; refused when the log says otherwise")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--csv", action="store_true")
    p.set_defaults(func=_cli_parse)


def _cli_parse(args) -> int:
    log = parse_nccl_tests(args.log, op=args.op, nranks=args.nranks)
    meta = {"backend": "nccl", "device": "cuda", "world_size": log.meta.get("world_size"),
            "backend_reason": f"parsed from {log.meta['file']} ({log.meta.get('program') or 'nccl-tests'}); "
                              f"world size {log.meta.get('world_size') or '?'}: {log.meta.get('world_size_source')}",
            "avg_busbw_text": log.meta.get("avg_busbw_text") or "N/A (the log has no Avg bus bandwidth line)",
            "out_of_bounds": log.meta.get("out_of_bounds")}
    frame = log.frame if (args.json or args.csv) else log.frame[~log.frame["in_place"]]
    print_rows(frame, None if (args.json or args.csv) else meta, args.json, args.csv)
    return 0
