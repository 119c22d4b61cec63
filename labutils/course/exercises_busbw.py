"""Grader of notebook 02 (the sweep): the busbw nccl-tests prints for one row of a collective."""

from __future__ import annotations

import math

from labutils.core.busbw import MAX_RANKS, bandwidths_GBps, bus_factor
from labutils.core.inputs import check_int, check_range
from labutils.course.grading import MiB_PER_MB, grade


def check_busbw(answer_GBps, op: str, size_bytes: float, time_us: float, world_size: int) -> str:
    """Notebook 02: the busbw nccl-tests would print for one row (size, time, N ranks) of `op`.

    busbw = size / time x factor(op, N). Slips: algbw, the factor divided, all_reduce's factor
    for another op, the time read in ms or s, 1024 for 1000 (the size in MiB), Gb/s, GiB/s.
    """
    try:
        world_size = check_int("world_size", world_size, low=1, high=MAX_RANKS)
        check_range("time_us", time_us, low=0, low_open=True, high=math.inf, high_open=True, unit="us")
        algbw, right = bandwidths_GBps(op, size_bytes, time_us, world_size)
        factor = bus_factor(op, world_size)
    except Exception as exc:  # noqa: BLE001
        return f"The row cannot be graded ({exc})."
    slips = []
    if factor != 1:
        slips += [(algbw, f"that is algbw = size / time. Multiply by the {op} factor for N = {world_size} "
                          f"({factor:.4g}) to get busbw."),
                  (algbw / factor, f"you divided by the factor; busbw = algbw x {factor:.4g}, the rate the "
                                   "busiest link ran at, is the larger one here.")]
    ar = bus_factor("all_reduce", world_size)
    if op != "all_reduce" and ar != factor:
        slips.append((algbw * ar, f"that uses all_reduce's factor 2(N-1)/N; {op}'s factor is {factor:.4g} "
                                  "(doc/PERFORMANCE.md of nccl-tests)."))
    slips += [(right / 1e3, "that is the answer / 1000: time_us is in microseconds (1e-6 s), not milliseconds."),
              (right * MiB_PER_MB, "that counts the size in MiB (1024^2 bytes) where GB/s wants decimal bytes "
                                   "(1e9 per GB).")]
    how = (f"algbw = size_bytes / (time_us x 1e-6) / 1e9 GB/s; then busbw = algbw x factor, the factor of {op} on "
           f"{world_size} ranks.")
    return grade(answer_GBps, right, slips, "GB/s", how,
                 right_text=f"algbw {algbw:.4g} GB/s times {factor:.4g}, the rate the busiest link ran at.")
