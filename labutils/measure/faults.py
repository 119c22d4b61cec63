"""Fault injection for the sweep: a rank that hangs, crashes or returns wrong elements, to show
that a run fails loudly and names the rank (tests, and `interconnect-lab sweep --fault`).

Kept out of labutils.measure.harness so the loop a student reads has no fault in it.
"""

from __future__ import annotations

import os
import time

from labutils.measure.harness import sweep_worker

FAULTS = ("none", "corrupt", "hang", "crash")


def corrupt_first_elements(out) -> None:
    """Add 1 to the first (up to) 3 elements of a result tensor."""
    out.view(-1)[:3] += 1


def faulty_sweep_worker(ctx, fault_rank: int = -1, fault: str = "none", **sweep_kwargs) -> list[dict]:
    """`sweep_worker` in which rank `fault_rank` misbehaves: "hang" (sleeps an hour before its
    first call), "crash" (exits with status 17), or "corrupt" (wrong result elements)."""
    if ctx.rank == fault_rank and fault == "hang":
        time.sleep(3600)
    if ctx.rank == fault_rank and fault == "crash":
        os._exit(17)
    tamper = corrupt_first_elements if ctx.rank == fault_rank and fault == "corrupt" else None
    return sweep_worker(ctx, tamper=tamper, **sweep_kwargs)
