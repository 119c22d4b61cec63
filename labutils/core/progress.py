"""A progress bar in the launching process, moved by rank 0's reports.

A worker calls `ctx.report({"done": i, "of": n})` after each unit of work; `rank_progress`
yields the `on_report(rank, payload)` that labutils.measure.launch.launch (or run_this_rank) takes
and moves a tqdm.auto bar to rank 0's count. Every rank does the same work, so one rank's count
is the job's count.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def rank_progress(total: int, desc: str, enabled: bool = True, unit: str = "it", leave: bool = False):
    """Yield `on_report` for a launch (None when not `enabled`); the bar closes on exit, also on error.

    The bar shows rank 0's payload["done"] out of payload["of"] (when given, else `total`);
    reports without "done" and reports of other ranks are ignored.
    """
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr)

    def on_report(rank: int, payload) -> None:
        if rank != 0 or not isinstance(payload, dict) or "done" not in payload:
            return
        if payload.get("of"):
            bar.total = payload["of"]
        bar.update(payload["done"] - bar.n)

    try:
        yield on_report
    finally:
        bar.close()
