"""The sweep's rows printed as nccl-tests prints them (so labutils.readers.nccl_tests reads them back), or
as JSON records or CSV: what `interconnect-lab sweep` and `parse-nccl-tests` print; notebook 02
shows the table.
"""

from __future__ import annotations

import math

import pandas as pd

from labutils.core.busbw import DTYPES
from labutils.core.results import to_json


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
                     f"rank(s), warm-up {meta.get('warmup')}, ~{meta.get('budget_ms')} ms timed per size")
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
