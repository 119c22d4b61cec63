"""The nccl-tests format: reading its output (all_reduce_perf and friends) into the sweep's DataFrame
columns, and writing the sweep as nccl-tests prints it.

Reading takes two inputs:
- the text log. Layouts handled: current (`size count type redop root` + out-of-place and
  in-place `time algbw busbw #wrong`), old 2.x (no `root`; an `error` column holding the largest
  deviation instead of a count), all_gather/broadcast variants without `redop`, the
  per-iteration layout (`i_min ...` columns), `N/A` in #wrong, numbers such as `16330` or
  `1.2e+05`, launcher prefixes (`0: ` from srun --label, `[1,0]<stdout>:` from mpirun
  --tag-output), and NCCL INFO / launcher lines between rows, even in the middle of a row.
- the JSON written with `-J FILE` (nccl-tests 2.16+): `results[*].out_of_place/in_place`.

Every row read becomes two rows, `in_place` False (out-of-place half) and True (in-place half).
The sweep's rows are printed in the same columns by labutils.nccl_table, so this reader reads them back.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from labutils.busbw import COLUMNS, DTYPE_ALIASES, DTYPES, OPS, bus_factor
from labutils.inputs import LabInputError
from labutils.nccl_table import print_rows

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
_TYPES = set(DTYPES) | set(DTYPE_ALIASES) | {"float", "half", "double", "int32", "uint32", "int64", "uint64",
                                             "int8", "uint8", "bfloat16", "f8e4m3", "f8e5m2"}
_REDOPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none", "all"}
_TIME_NAMES = {"time", "cputime"}


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
    """A number cell: '16330', '1.2e+05', '0.00'; 'N/A' and 'nan' are NaN."""
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
    pos = {name: columns.index(name) for name in ("size", "count", "type", "redop", "root") if name in columns}
    base = {"op": op, "size_bytes": int(cells[pos["size"]]), "count": int(cells[pos["count"]]),
            "dtype": _dtype(cells[pos["type"]]), "redop": cells[pos["redop"]] if "redop" in pos else "none",
            "root": int(cells[pos["root"]]) if "root" in pos else -1, "world_size": world, "backend": "nccl"}
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


def _log_meta(lines: list[str]) -> tuple[dict, float]:
    """What the log says about itself: program, devices (world size), NCCL version, summary lines."""
    meta = {"program": None, "devices": [], "nccl_version": None, "avg_busbw_GBps": math.nan,
            "out_of_bounds": None, "format": "text"}
    ranks = {}
    for line in (ln.strip() for ln in lines):
        program, rank, avg = _PROGRAM.search(line), _RANK_LINE.match(line), _AVG.match(line)
        oob, version = _OOB.match(line), _NCCL_VERSION.search(line)
        if program and meta["program"] is None:
            meta["program"] = program.group(0)
        if rank:
            ranks[int(rank.group(1))] = rank.group(5).strip()
        if avg:
            meta["avg_busbw_GBps"] = float(avg.group(1))
        if oob:
            meta["out_of_bounds"] = int(oob.group(1))
        if version and meta["nccl_version"] is None:
            meta["nccl_version"] = version.group(1) or version.group(2)
    meta["devices"] = [ranks[r] for r in sorted(ranks)]
    return meta, float(len(ranks)) if ranks else math.nan


def _is_row_start(cells: list[str]) -> bool:
    return len(cells) >= 4 and bool(_NUMBER.match(cells[0]) and _NUMBER.match(cells[1])) and cells[2].lower() in _TYPES


def parse_text(text: str, op: str | None = None) -> NcclTestsLog:
    """Parse an nccl-tests text log; `op` overrides the collective read from the log.

    The header line gives the columns (and where each ends); rows are lines starting with
    size, count and type. A row cut short by other output waits for a line of numbers only.
    """
    lines = [_PREFIX.sub("", raw, count=1) for raw in text.splitlines()]
    meta, world = _log_meta(lines)
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
    return _finish(rows, found_op, world, meta)


def _finish(rows: list[dict], op: str, world: float, meta: dict) -> NcclTestsLog:
    if not rows:
        raise LabInputError("no nccl-tests result rows found (expected lines such as "
                            "'     1048576        262144     float     sum      -1   ...')")
    frame = pd.DataFrame(rows, columns=COLUMNS + ["max_error"])
    frame["world_size"] = frame["world_size"].astype(float) if math.isnan(world) else int(world)
    meta.update(op=op, world_size=None if math.isnan(world) else int(world), source="nccl-tests")
    if op in OPS and not math.isnan(world):
        meta["bus_factor"] = bus_factor(op, int(world))
    return NcclTestsLog(frame, meta)


def parse_json(doc: dict, op: str | None = None) -> NcclTestsLog:
    """Parse the document nccl-tests writes with `-J FILE` (JSON format version 2)."""
    if not isinstance(doc, dict) or "results" not in doc:
        raise LabInputError("not an nccl-tests JSON report: no 'results' list")
    args = doc.get("args") or []
    program = Path(args[0]).name if args else None
    found_op = op or _op_from_program(program)
    devices = (doc.get("config") or {}).get("devices") or []
    world = float(len(devices)) if devices else math.nan
    rows = []
    for rec in doc["results"]:
        base = {"op": found_op, "size_bytes": int(rec["size"]), "count": int(rec["count"]),
                "dtype": _dtype(str(rec.get("type", ""))), "redop": str(rec.get("redop", "none")).strip(),
                "root": int(str(rec.get("root", -1)).strip() or -1), "world_size": world, "backend": "nccl"}
        for half, key in enumerate(("out_of_place", "in_place")):
            part = rec.get(key)
            if not part:
                continue
            t = part.get("time", part.get("cpu_time"))
            rows.append({**base, "time_us": _json_float(t), "algbw_GBps": _json_float(part.get("alg_bw")),
                         "busbw_GBps": _json_float(part.get("bus_bw")), "wrong": _json_float(part.get("nwrong")),
                         "max_error": math.nan, "in_place": half == 1})
    avg = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    meta = {"program": program, "devices": [d.get("device_info", "") for d in devices],
            "nccl_version": doc.get("nccl_version"), "avg_busbw_GBps": _json_float(avg),
            "out_of_bounds": (doc.get("out_of_bounds") or {}).get("count"), "format": "json"}
    return _finish(rows, found_op, world, meta)


def _json_float(value) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)  # nccl-tests writes NaN as the string "nan"
    except (TypeError, ValueError):
        return math.nan


def parse_nccl_tests(path_or_text, op: str | None = None) -> NcclTestsLog:
    """Parse a log file, a JSON report, or their text: JSON when the text starts with '{'."""
    text = str(path_or_text)
    if "\n" not in text and len(text) < 4096:
        path = Path(text)
        if not path.exists():
            raise LabInputError(f"log={text!r} does not exist")
        text = path.read_text(encoding="utf-8", errors="replace")
        source = str(path)
    else:
        source = "<text>"
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LabInputError(f"the JSON report does not parse ({exc}); was the run cut short?") from None
        log = parse_json(doc, op)
    else:
        log = parse_text(text, op)
    log.meta["file"] = source
    return log


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
    p.add_argument("--op", default=None, help="collective, when the log does not name its program")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--csv", action="store_true")
    p.set_defaults(func=_cli_parse)


def _cli_parse(args) -> int:
    log = parse_nccl_tests(args.log, op=args.op)
    meta = {"backend": "nccl", "device": "cuda", "world_size": log.meta.get("world_size"),
            "backend_reason": f"parsed from {log.meta['file']} ({log.meta.get('program') or 'nccl-tests'})"}
    frame = log.frame if (args.json or args.csv) else log.frame[~log.frame["in_place"]]
    print_rows(frame, None if (args.json or args.csv) else meta, args.json, args.csv)
    return 0
