"""Graders of notebook 08 (the time budget: break-even, minimum bandwidth, the critical hidden size),
on the shared reading and judging of `labutils.course.grading`.
"""

from __future__ import annotations

from labutils.course.grading import grade
from labutils.model import budget as bm
from labutils.model import hardware_ratio as hr

# --- 08 · the time budget ---------------------------------------------------------------------------------

def check_break_even(answer_ms, *, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000,
                     bandwidth_GBps=10.0) -> str:
    """Notebook 08: the break-even C (ms) C* = H / (1 - 1/(2 eta)), H = Q (l + V/B).

    Slips: H itself, H multiplied by the saved share, the startup left out, V/B left out, the
    base case's H, the 2 of 2 eta dropped, the units of V/B."""
    try:
        right = float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
        H = float(bm.comm_ms(Q, latency_ms, volume_bytes, bandwidth_GBps))
        frac = float(bm.saved_fraction(eta))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    base = {k: bm.BASE_CASE[k] for k in ("eta", "Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    slips = [(H, "that is H, the communication; divide it by the share of C that splitting saves, 1 - 1/(2 eta)."),
             (H * frac, "you multiplied H by 1 - 1/(2 eta); divide instead."),
             (float(bm.break_even_C_ms(eta, Q, 0.0, volume_bytes, bandwidth_GBps)),
              "you left out the startup cost l of each exchange."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, 0.0, bandwidth_GBps)),
              "you left out the transfer V/B of each exchange."),
             (float(bm.break_even_C_ms(**base)), "that is the base case; recompute H with this exercise's Q, V and B."),
             (H * 2 * eta, "1/(2 eta) is the share of C each device still computes; divide H by the saved share "
                           "1 - 1/(2 eta)."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes * 1e3, bandwidth_GBps)),
              "V/B came out 1000 times too large: V bytes at B GB/s take V / (B 1e6) ms."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes * 8, bandwidth_GBps)),
              "V/B came out 8 times too large: B is in gigabytes per second, not gigabits.")]
    how = "compute H = Q (l + V / (B 1e6)) ms first, then C* = H / (1 - 1/(2 eta))."
    return grade(answer_ms, right, slips, "ms", how, allow_inf=True,
                 right_text="Below it, splitting costs more than it saves.")


def check_min_bandwidth(answer_GBps, *, C_ms=12.0, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000) -> str:
    """Notebook 08: the minimum bandwidth B = V / (D 1e6) GB/s, D = C (1 - 1/(2 eta)) / Q - l.

    Slips: the startup left out, the saving not shared among the Q exchanges, 1 - 1/eta, and the
    units (GB/s vs Gb/s, MB/s, GiB/s)."""
    try:
        right = float(bm.min_bandwidth_GBps(C_ms, eta, Q, latency_ms, volume_bytes))
        saving = C_ms * float(bm.saved_fraction(eta))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(float(bm.min_bandwidth_GBps(C_ms, eta, Q, 0.0, volume_bytes)),
              "you left out the startup: D = C (1 - 1/(2 eta)) / Q - l."),
             (volume_bytes / ((saving - latency_ms) * 1e6) if saving > latency_ms else None,
              "share the saving among the Q exchanges: divide C (1 - 1/(2 eta)) by Q before subtracting l."),
             (volume_bytes / ((C_ms / (2 * eta) / Q - latency_ms) * 1e6) if Q and C_ms / (2 * eta) / Q > latency_ms
              else None, "1/(2 eta) is the share of C each device still computes; the saving is C (1 - 1/(2 eta)).")]
    how = "D = C (1 - 1/(2 eta)) / Q - l (ms), then B = V / (D 1e6) GB/s; never (math.inf) if D <= 0."
    return grade(answer_GBps, right, slips, "GB/s", how, allow_inf=True,
                 right_text="Any slower link makes the split lose.")


def check_critical_hidden(answer, *, compute_TFLOPs=312.0, bandwidth_GBps=24.0, eta=0.8, N=2, Q=1,
                          wire_dtype="bf16", ffn_ratio=4.0) -> str:
    """Notebook 08: the critical hidden size h* = I* w / (4 r) (startups left out).

    Slips: I* itself, R/B without the saved share, the wire dtype, the link's Gb/s taken as GB/s
    (8x), and bytes for bits the other way."""
    try:
        right = float(hr.critical_hidden(compute_TFLOPs, bandwidth_GBps, eta, N, Q, wire_dtype, ffn_ratio))
        w = bm.WIRE_DTYPES[bm.wire_dtype_name(wire_dtype)]
        intensity = float(hr.critical_intensity(compute_TFLOPs, bandwidth_GBps, eta, N, Q))
        ratio = float(hr.hardware_ratio(compute_TFLOPs, bandwidth_GBps))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(intensity, "that is I*, FLOP per byte; turn it into a hidden size: h* = I* x w / (4 r)."),
             (ratio * w / (4 * ffn_ratio), "you used R/B alone; divide by the saved share 1 - 1/(N eta) (and "
                                           "multiply by Q x 2(N-1)/N)."),
             (right * 4 / w if w != 4 else None, "check the wire dtype: V_w counts w bytes per value (2 for bf16, "
                                                 "4 for fp32)."),
             (right / 8, "the link's bandwidth came out 8 times too high: a port quoted in Gb/s (gigabits) "
                         "carries 8 times fewer GB/s."),
             (right * 8, "the link's bandwidth came out 8 times too low: GB/s counts bytes; divide by 8 only to "
                         "turn Gb/s into GB/s.")]
    how = ("R/B = TFLOP/s x 1e12 / (GB/s x 1e9) FLOP per byte; I* = Q x 2(N-1)/N / (1 - 1/(N eta)) x R/B; "
           "h* = I* x w / (4 r).")
    return grade(answer, right, slips, "", how, allow_inf=True, units=False,
                 right_text=(f"I* = {intensity:.5g} FLOP per byte on the wire. Below it the all-reduce costs more "
                             "than the split saves."))
