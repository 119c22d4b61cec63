"""Graders of notebook 10 (data-parallel training): the largest gradient that ideal overlap hides
behind backward, and the link a target efficiency needs; on the shared reading and judging of
`labutils.course.grading`.
"""

from __future__ import annotations

import math

from labutils.core.busbw import bus_factor
from labutils.core.inputs import check_range
from labutils.course.grading import grade
from labutils.model.ddp_model import max_hidden_gradient_bytes, min_busbw_for_efficiency, predicted_efficiency


def _size_text(n_bytes: float) -> str:
    return f"{n_bytes:.4g} bytes ({n_bytes / 1e6:.4g} MB, {n_bytes / 2**20:.4g} MiB)"


def check_hidden_gradient(answer_bytes, backward_ms: float, busbw_GBps: float, world_size: int,
                          compute_ms: float | None = None) -> str:
    """Notebook 10: the largest gradient (bytes) whose all-reduce ideal overlap hides behind
    backward: V = backward x busbw 1e6 / (2(N-1)/N). Slips: the factor, the whole step for the
    backward, MB / MiB for bytes, ms taken as s, Gb/s."""
    try:
        right = float(max_hidden_gradient_bytes(backward_ms, busbw_GBps, world_size))
        factor = float(bus_factor("all_reduce", world_size))
        if compute_ms is not None:
            check_range("compute_ms", compute_ms, low=0, low_open=True, high=math.inf, high_open=True, unit="ms")
            compute_ms = float(compute_ms)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(right * factor if factor != 1 else None,
              "you let the whole buffer cross the link at busbw. Each rank moves 2(N-1)/N of it: divide by that "
              "factor."),
             (right / factor if factor != 1 else None, "you multiplied by 2(N-1)/N; the time is 2(N-1)/N x V / "
                                                       "busbw, so V = time x busbw / (2(N-1)/N)."),
             (right * compute_ms / float(backward_ms) if compute_ms and float(backward_ms) > 0 else None,
              "only the backward pass can hide the all-reduce: DDP sends a bucket once its gradients exist, and "
              "they exist only during backward. Use the backward time, not the whole step."),
             (right / 8, "that is the answer / 8: busbw is in gigabytes per second, not gigabits.")]
    how = "Set the all-reduce time 2(N-1)/N x V / (busbw x 1e6) ms equal to the backward time and solve for V."
    return grade(answer_bytes, right, slips, "bytes", how, rel_tol=0.02,
                 right_text=(f"That is {_size_text(right)}. A larger gradient leaves part of its all-reduce "
                             "exposed even with perfect overlap."))


def check_min_busbw(answer_GBps, gradient_bytes: float, compute_ms: float, world_size: int,
                    efficiency: float = 0.9) -> str:
    """Notebook 10: the slowest link (GB/s) that keeps a weak-scaling efficiency without overlap.

    comm <= c (1/E - 1), B = 2(N-1)/N V / (comm 1e6). Slips: comm = c (1 - E), the factor,
    Gb/s, GiB/s, MB/s; other answers are told the efficiency they would give."""
    try:
        right = float(min_busbw_for_efficiency(gradient_bytes, compute_ms, world_size, efficiency))
        factor = float(bus_factor("all_reduce", world_size))
        gradient_bytes, compute_ms, efficiency = float(gradient_bytes), float(compute_ms), float(efficiency)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(right * (1 / efficiency - 1) / (1 - efficiency) if efficiency < 1 else None,
              f"you took comm = c (1 - {efficiency:g}); the efficiency is c / (c + comm), so comm = "
              f"c (1/{efficiency:g} - 1)."),
             (right / factor if factor != 1 else None, "you left out the ring factor: the all-reduce moves "
                                                       "2(N-1)/N x V over each link.")]

    def fallback(value: float) -> str:
        got = float(predicted_efficiency(gradient_bytes, value, compute_ms, world_size)) if value > 0 else 0.0
        if value < right:
            return (f"Not yet ({value:g} GB/s): too slow, at {value:g} GB/s the efficiency is {got:.1%}. Solve "
                    f"c / (c + comm) = {efficiency:g} for comm first, then the bandwidth that moves 2(N-1)/N x "
                    "bytes in that time.")
        return (f"Not yet ({value:g} GB/s): that link is enough ({got:.1%}), but slower ones are too: the question "
                "asks for the smallest. Set c / (c + comm) equal to the target and solve for the bandwidth.")

    return grade(answer_GBps, right, slips, "GB/s", "", allow_inf=True, fallback=fallback,
                 right_text=f"Any slower link drops below {efficiency:.0%} (gradient {_size_text(gradient_bytes)}).")
