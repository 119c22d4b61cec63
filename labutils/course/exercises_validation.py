"""Graders of notebook 09 (the time budget held against a measured split layer): T2 predicted from
the measured inputs, on the shared reading and judging of `labutils.course.grading`.
"""

from __future__ import annotations

from labutils.course.grading import grade
from labutils.model import budget as bm


def check_t2_prediction(answer_ms, inputs) -> str:
    """Notebook 07: T2 = S + C/(2 eta) + Q (l + V/B), in ms, from `inputs` (validation.BudgetInputs).

    The tolerance comes from the slips, not a fixed percentage: each slip (eta left out, the
    latency, V/B, S or the whole communication left out, V/B off by 1000 or 8) is a candidate and
    the answer is matched to the nearest one it is close to. An answer that left out V/B, even
    when V/B is 1 % of T2, is nearer that slip than the right value and is told so.
    """
    try:
        S, C, eta, Q, lat, V, B = (float(v) for v in inputs.as_args())
        right = float(bm.t_two_ms(S, C, eta, Q, lat, V, B))
        wire_ms = float(bm.comm_ms(1, 0.0, V, B))
    except Exception as exc:  # noqa: BLE001
        return f"These inputs cannot be graded ({exc})."
    slips = [(right - C / (2 * eta) + C / 2, f"you used C/2: divide by 2 eta (eta = {eta:.3g}), the split's halves "
                                             "do not run at full efficiency."),
             (right - Q * lat, "the latency is missing: every all-reduce pays it once, whatever its size."),
             (right - Q * wire_ms, "the bandwidth term V/B is missing (or came out in seconds): V bytes at B GB/s "
                                   "take V / (B 1e9) s, that is V / (B 1e6) ms."),
             (right - S, "S is missing: the serial work is in T2 too."),
             (right + Q * wire_ms * 999, "V/B came out 1000 times too large: V / (B 1e9) is in seconds, "
                                         "V / (B 1e6) in ms."),
             (right + Q * wire_ms * 7, "V/B came out 8 times too large: B is in gigabytes per second, not gigabits."),
             (right - Q * (lat + wire_ms), "the communication is missing: Q (latency + V/B)."),
             (S + C, "that is T1, one device's time; T2 splits C over two devices and adds the communication.")]
    how = "Add three parts: S, C / (2 eta), and Q (latency + V / B) with V/B converted to ms."
    return grade(answer_ms, right, slips, "ms", how, rel_tol=0.001,
                 right_text=f"of which {Q * (lat + wire_ms):.4g} ms is communication; the one-rank time is "
                            f"{S + C:.4g} ms.")
