"""The nccl-tests format: reading its output (all_reduce_perf and friends) into the sweep's DataFrame
columns, and deciding how many ranks a log ran on (its table is printed by labutils.core.busbw).

Reading takes two inputs:
- the text log. Layouts handled: current (`size count type redop root` + out-of-place and
  in-place `time algbw busbw #wrong`), old 2.x (no `root`; an `error` column holding the largest
  deviation instead of a count), all_gather/broadcast variants without `redop`, the
  per-iteration layout (`i_min ...` columns), `N/A` in #wrong, numbers such as `16330` or
  `1.2e+06`, launcher prefixes (`0: ` from srun --label, `[1,0]<stdout>:` from mpirun
  --tag-output), and NCCL INFO / launcher lines between rows, even in the middle of a row.
- the JSON written with `-J FILE` (nccl-tests 2.16+): `results[*].out_of_place/in_place`.

Every row read becomes two rows, `in_place` False (out-of-place half) and True (in-place half).

How many ranks a log ran on (`decide_world_size`) weighs what the log says (the header's thread and
GPU counts, the command line, NCCL INFO lines, the rank lines) against what its numbers say
(busbw / algbw is the bus factor of N ranks), and says why when they disagree.

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
_NUMBER = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_GLUED = re.compile(r"^(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(\D.*)$")
_PROGRAM = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv|gather|"
                      r"scatter|hypercube)_perf\b")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                        r"\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version\s+(\S+)|nccl-library=(\d+)")
_HEADER_GPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\b")
_COMMAND_GPUS = re.compile(r"_perf\b.*?\s-g\s*(\d+)\b")
_COMMAND_THREADS = re.compile(r"_perf\b.*?\s-t\s*(\d+)\b")
_INFO_NRANKS = re.compile(r"NCCL INFO\b.*\brank\s+(\d+)\s+nranks\s+(\d+)\b")
_RANK_PID = re.compile(r"\bPid\s+(\d+)\b")
_INT = re.compile(r"^-?\d+$")
# Every program of nccl-tests (what --op may name), and those whose busbw/algbw ratio gives N.
PROGRAMS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv", "gather",
            "scatter", "hypercube")
RATIO_OPS = ("all_reduce", "all_gather", "reduce_scatter")
_TYPES = set(DTYPES) | set(DTYPE_ALIASES) | {"float", "half", "double", "int32", "uint32", "int64", "uint64",
                                             "int8", "uint8", "bfloat16", "f8e4m3", "f8e5m2"}
_REDOPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none", "all"}
_TIME_NAMES = {"time", "cputime"}
MAX_RANKS = 1 << 20  # far above any job; a larger count in a log is a corrupt line


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


def _is_cell(token: str) -> bool:
    return bool(_NUMBER.match(token)) or token.upper() in ("N/A", "NAN") or token.lower() in _TYPES | _REDOPS


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


def _header_columns(line: str) -> tuple[list[str], list[int]] | None:
    """(names, end offsets) from a header line such as '#  size  count  type  redop  root  time ...'."""
    found = [(m.group(0), m.end()) for m in re.finditer(r"[^\s#]\S*", line)]
    names = [n for n, _ in found]
    if len(names) >= 4 and names[0] == "size" and names[1] == "count" and "type" in names[:3]:
        kept = [(n, e) for n, e in found if n != "timestamp"]
        return [n for n, _ in kept], [e for _, e in kept]
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


def _halves(columns: list[str]) -> list[dict]:
    """Positions of (time, algbw, busbw, wrong) for the out-of-place and in-place halves."""
    halves = []
    for i, name in enumerate(columns):
        if name in _TIME_NAMES and i + 3 < len(columns) and columns[i + 1] == "algbw":
            halves.append({"time": i, "algbw": i + 1, "busbw": i + 2, "wrong": i + 3,
                           "wrong_is_error": columns[i + 3] == "error"})
    return halves


def _needed(columns: list[str]) -> int:
    """Cells a complete row has: up to the #wrong of its last half."""
    halves = _halves(columns)
    return halves[-1]["wrong"] + 1 if halves else len(columns)


def _rows_from_cells(cells: list[str], columns: list[str], op: str, world: float) -> list[dict]:
    """The row's out-of-place and in-place halves; LabInputError for a cell that is not what its
    column holds (a size that is no whole number, a negative or infinite value)."""
    try:
        return _convert_cells(cells, columns, op, world)
    except (ValueError, IndexError, OverflowError):
        raise LabInputError(f"the nccl-tests row {' '.join(cells)!r} has a cell that does not fit its column "
                            f"({', '.join(columns)})") from None


def _convert_cells(cells: list[str], columns: list[str], op: str, world: float) -> list[dict]:
    pos = {name: columns.index(name) for name in ("size", "count", "type", "redop", "root") if name in columns}
    size, count = cells[pos["size"]], cells[pos["count"]]
    if not (_INT.match(size) and _INT.match(count)):
        raise ValueError("size and count are whole numbers")
    root = cells[pos["root"]] if "root" in pos else None
    if root is not None and not _INT.match(root):
        raise ValueError("root is a whole number")
    base = {"op": op, "size_bytes": int(size), "count": int(count),
            "dtype": _dtype(cells[pos["type"]]), "redop": cells[pos["redop"]] if "redop" in pos else "none",
            "root": int(root) if root is not None else math.nan, "world_size": world, "backend": "nccl"}
    rows = []
    for half, where in enumerate(_halves(columns)):
        if where["wrong"] >= len(cells):
            break
        raw_wrong = _value(cells[where["wrong"]])
        rows.append({**base, "time_us": _value(cells[where["time"]]), "algbw_GBps": _value(cells[where["algbw"]]),
                     "busbw_GBps": _value(cells[where["busbw"]]),
                     "wrong": math.nan if where["wrong_is_error"] else raw_wrong,
                     "max_error": raw_wrong if where["wrong_is_error"] else math.nan, "in_place": half == 1})
    return rows


_CHECKED = (("size_bytes", "size"), ("count", "count"), ("time_us", "time"), ("algbw_GBps", "algbw"),
            ("busbw_GBps", "busbw"), ("wrong", "#wrong"))


def _check_rows(rows: list[dict]) -> None:
    """LabInputError naming the column for a negative or infinite number (N/A, NaN pass)."""
    for row in rows:
        for key, column in _CHECKED:
            value = row[key]
            if isinstance(value, float) and math.isnan(value):
                continue
            if value < 0 or math.isinf(value):
                raise LabInputError(f"{column}={value!r} in the nccl-tests row of size {row['size_bytes']} is "
                                    "outside the allowed range [0, inf)")


def _log_meta(lines: list[str]) -> tuple[dict, dict]:
    """What the log says about itself: program, devices, NCCL version, summary lines (the "Avg bus
    bandwidth" line as printed, `avg_busbw_text`), and the raw evidence of the world size."""
    meta = {"program": None, "devices": [], "nccl_version": None, "avg_busbw_GBps": math.nan, "avg_busbw_text": None,
            "out_of_bounds": None, "format": "text"}
    ranks, pids, evidence = {}, set(), {"per_process": {}, "exact": {}}
    for line in (ln.strip() for ln in lines):
        program, rank, avg = _PROGRAM.search(line), _RANK_LINE.match(line), _AVG.match(line)
        oob, version = _OOB.match(line), _NCCL_VERSION.search(line)
        header, info = _HEADER_GPUS.match(line), _INFO_NRANKS.search(line)
        if program and meta["program"] is None:
            meta["program"] = program.group(0)
        if program and not line.startswith("#"):
            gpus, threads = _COMMAND_GPUS.search(line), _COMMAND_THREADS.search(line)
            if gpus:
                evidence["per_process"].setdefault(f"-g {gpus.group(1)} on the command line",
                                                   int(gpus.group(1)) * int(threads.group(1) if threads else 1))
        if header:
            evidence["per_process"].setdefault(f"nThread {header.group(1)} nGpus {header.group(2)} in the header",
                                               int(header.group(1)) * int(header.group(2)))
        if info:
            n = int(info.group(2))
            evidence["exact"].setdefault(f"NCCL INFO nranks {n}", n)
        if rank:
            ranks[int(rank.group(1))] = rank.group(5).strip()
            pid = _RANK_PID.search(line)
            pids.add((pid.group(1) if pid else "?", rank.group(2)))
        if avg:
            meta["avg_busbw_GBps"] = float(avg.group(1))
            meta["avg_busbw_text"] = avg.group(1)
        if oob:
            meta["out_of_bounds"] = int(oob.group(1))
        if version and meta["nccl_version"] is None:
            meta["nccl_version"] = version.group(1) or version.group(2)
    meta["devices"] = [ranks[r] for r in sorted(ranks)]
    evidence["ranks"], evidence["processes"] = sorted(ranks), len(pids)
    return meta, evidence


def _is_row_start(cells: list[str]) -> bool:
    return len(cells) >= 4 and bool(_NUMBER.match(cells[0]) and _NUMBER.match(cells[1])) and cells[2].lower() in _TYPES


def parse_text(text: str, op: str | None = None, nranks: int | None = None) -> NcclTestsLog:
    """Parse an nccl-tests text log; `op` overrides the collective read from the log.

    The header line gives the columns (and where each ends); rows are lines starting with
    size, count and type. A row cut short by other output waits for a line of numbers only.
    """
    lines = [_PREFIX.sub("", raw, count=1) for raw in text.splitlines()]
    meta, evidence = _log_meta(lines)
    world = math.nan
    found_op = op or _op_from_program(meta["program"])
    columns, ends, pending, rows = None, None, None, []
    for line in lines:
        if line.strip().startswith("#"):
            columns, ends = _header_columns(line.rstrip()) or (columns, ends)
            continue
        cells = _cells(line.rstrip(), ends)
        if pending is not None and not _is_row_start(cells):
            tokens = line.split()
            if not tokens or not all(_NUMBER.match(t) or t.upper() == "N/A" for t in tokens):
                continue  # a stray line inside a row: keep waiting for the rest of the row
            cells, pending = pending + tokens, None
        elif pending is not None:  # a new row began: the cut one never got its numbers
            rows.extend(_rows_from_cells(pending, columns or _guess_columns(pending), found_op, world))
            pending = None
        if not _is_row_start(cells):
            continue
        cols = columns or _guess_columns(cells)
        if len(cells) < _needed(cols):
            pending = cells  # the row was cut by other output; its numbers follow on a later line
            continue
        rows.extend(_rows_from_cells(cells, cols, found_op, world))
    if pending is not None:
        rows.extend(_rows_from_cells(pending, columns or _guess_columns(pending), found_op, world))
    return _finish(rows, found_op, evidence, meta, nranks)


def _finish(rows: list[dict], op: str, evidence: dict, meta: dict, nranks: int | None = None) -> NcclTestsLog:
    if not rows:
        raise LabInputError("no nccl-tests result rows found (expected lines such as "
                            "'     1048576        262144     float     sum      -1   ...')")
    _check_rows(rows)
    decided, why = decide_world_size(evidence, rows, op, nranks)
    world = math.nan if decided is None else float(decided)
    for row in rows:
        row["world_size"] = world
    meta["world_size_source"] = why
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
    evidence = {"per_process": {}, "exact": {f"{len(devices)} config.devices": len(devices)} if devices else {}}
    rows = []
    for rec in doc["results"]:
        if not isinstance(rec, dict):
            raise TypeError(f"a result record is {type(rec).__name__}, not an object")
        root = str(rec.get("root", -1)).strip() or "-1"
        base = {"op": found_op, "size_bytes": _whole(rec["size"], "size"), "count": _whole(rec["count"], "count"),
                "dtype": _dtype(str(rec.get("type", ""))), "redop": str(rec.get("redop", "none")).strip(),
                "root": _whole(root, "root"), "world_size": math.nan, "backend": "nccl"}
        for half, key in enumerate(("out_of_place", "in_place")):
            part = rec.get(key)
            if not part:
                continue
            if not isinstance(part, dict):
                raise TypeError(f"{key} is {type(part).__name__}, not an object")
            t = part.get("time", part.get("cpu_time"))
            rows.append({**base, "time_us": _json_float(t), "algbw_GBps": _json_float(part.get("alg_bw")),
                         "busbw_GBps": _json_float(part.get("bus_bw")), "wrong": _json_float(part.get("nwrong")),
                         "max_error": math.nan, "in_place": half == 1})
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

def _bandwidth_pairs(rows: list[dict]) -> list[tuple[float, float]]:
    """(algbw, busbw) of every row that printed both as finite numbers, algbw > 0."""
    return [(r["algbw_GBps"], r["busbw_GBps"]) for r in rows
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (r["algbw_GBps"], r["busbw_GBps"]))
            and r["algbw_GBps"] > 0]


def _fits(pairs: list[tuple[float, float]], op: str, n: int) -> bool:
    """Whether busbw = algbw * factor(n) on every pair, within the columns' rounding (2 decimals,
    or 4 significant figures)."""
    def slack(v):
        return max(0.0051, 6e-4 * abs(v))

    factor = bus_factor(op, n)
    return all(abs(a * factor - b) <= slack(b) + factor * slack(a) for a, b in pairs)


def _n_from_ratio(rows: list[dict], op: str) -> int | None:
    """N from busbw = algbw * factor(N) on every row with a bandwidth: the one N whose factor
    reproduces each printed busbw within its rounding (2 decimals, or 4 significant figures), else None."""
    if op not in RATIO_OPS:
        return None
    pairs = _bandwidth_pairs(rows)
    if not pairs:
        return None
    alg, bus = max(pairs)
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

    Sources: `nranks` (the caller's override), NCCL INFO's `nranks` (exact), the header's nThread x
    nGpus and the command line's -g (ranks per process: the world size for one process, a multiple
    of it across processes), the busbw/algbw ratio (exact where it singles out one N) and the `# Rank`
    lines (a lower bound: a log cut to its tail keeps only some; the world size only when nothing
    else speaks).
    """
    exact: list[tuple[str, int]] = []
    if nranks is not None:
        exact.append(("--nranks", nranks))
    exact += list(evidence.get("exact", {}).items())
    per_process = evidence.get("per_process", {})
    multi = evidence.get("processes", 0) > 1
    if not multi:
        exact += [(name, n) for name, n in per_process.items()]
    ratio_n = _n_from_ratio(rows, op)
    if ratio_n is not None:
        exact.append(("busbw/algbw", ratio_n))
    ranks = evidence.get("ranks", [])
    at_least = max(len(ranks), ranks[-1] + 1) if ranks else 0

    def says(name, n):
        return f"{name} says {n}"

    if exact:
        name, world = exact[0]
        clash = [(m, n) for m, n in exact[1:] if n != world]
        if clash:
            raise LabInputError(f"world size: the log disagrees with itself: {says(name, world)}, "
                                + ", ".join(says(m, n) for m, n in clash)
                                + "; give the true rank count with --nranks only if the log is yours and complete")
        if world < at_least:
            raise LabInputError(f"world size: {says(name, world)} but the log lists a # Rank line for rank "
                                f"{ranks[-1]} ({at_least} ranks at least)")
        bad = [(m, p) for m, p in per_process.items() if world % p]
        if bad:
            raise LabInputError(f"world size: {says(name, world)} but {bad[0][0]} ({bad[0][1]} ranks per process) "
                                "does not divide it")
        agree = [m for m, _ in exact[1:]] + (["# Rank lines"] if ranks else [])
        return world, name + (f" (agrees: {', '.join(agree)})" if agree else "")
    if _ranks_tell(ranks, rows, op):
        return len(ranks), f"{len(ranks)} # Rank lines (nothing else in the log gives the rank count)"
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
