"""Graders of notebook 09 (the time budget held against a measured split layer): T2 on a link twice
as fast, from the measured inputs, on the shared reading and judging of `labutils.course.grading`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labutils.course.grading import grade
from labutils.experiments.validation import BudgetInputs
from labutils.model import budget as bm


@dataclass(frozen=True)
class FasterLink:
    """The exercise's numbers: `inputs` with the bandwidth doubled, `measured_bandwidth_GBps` the
    link's own B, and `volume_scale`, how many times the measured V the exercise's V is (1 unless
    the two links' T2 rounded alike at two figures)."""

    inputs: BudgetInputs
    measured_bandwidth_GBps: float
    volume_scale: int = 1

    def describe(self) -> str:
        """The exercise's numbers in one line, V's enlargement named when there is one."""
        f = self.inputs
        wider = f" ({self.volume_scale}x the layer's, so that doubling B shows)" if self.volume_scale > 1 else ""
        return (f"S = {f.S_ms:.4f} ms, C = {f.C_ms:.4f} ms, eta = {f.eta:.3f}, Q = {f.Q}, l = {f.latency_ms:.4f} ms, "
                f"V = {f.volume_bytes:.0f} bytes{wider}, B = {f.bandwidth_GBps:.4g} GB/s "
                f"(measured: {self.measured_bandwidth_GBps:.4g} GB/s)")


def _t2_ms(inputs: BudgetInputs, bandwidth_GBps: float) -> float:
    return float(bm.t_two_ms(*dataclasses.replace(inputs, bandwidth_GBps=bandwidth_GBps).as_args()))


def faster_link(inputs: BudgetInputs, factor: float = 2.0) -> FasterLink:
    """The exercise "a link `factor` times as fast" for the layer of `inputs` (validation.BudgetInputs).

    The point of the exercise is the bandwidth term, so the right T2 (B x factor) and the T2 of a
    student who forgot to change B must differ at two significant figures, the figures a grader
    accepts. On a CPU run V/B can be too small beside S + C/(2 eta) + l for that: then V is taken
    10, 100, ... times larger until they differ (at most 1e6 times, where V/B outweighs the rest).
    """
    scale = 1
    while True:
        wider = dataclasses.replace(inputs, volume_bytes=inputs.volume_bytes * scale)
        fast, slow = _t2_ms(wider, inputs.bandwidth_GBps * factor), _t2_ms(wider, inputs.bandwidth_GBps)
        if f"{fast:.2g}" != f"{slow:.2g}" or scale >= 10**6:
            return FasterLink(dataclasses.replace(wider, bandwidth_GBps=inputs.bandwidth_GBps * factor),
                              inputs.bandwidth_GBps, scale)
        scale *= 10


def check_t2_prediction(answer_ms, inputs, measured_bandwidth_GBps: float | None = None) -> str:
    """Notebook 09: T2 = S + C/(2 eta) + Q (l + V/B), in ms, from `inputs` (validation.BudgetInputs,
    or a FasterLink, whose measured bandwidth then gives the "B not doubled" slip).

    The tolerance comes from the slips, not a fixed percentage: each slip (eta left out, the
    latency, V/B, S or the whole communication left out, V/B off by 1000 or 8, the link's measured
    B used instead of the faster one) is a candidate and the answer is matched to the nearest one
    it is close to. An answer that left out V/B, even when V/B is 1 % of T2, is nearer that slip
    than the right value and is told so.
    """
    if isinstance(inputs, FasterLink):
        inputs, measured_bandwidth_GBps = inputs.inputs, inputs.measured_bandwidth_GBps
    try:
        S, C, eta, Q, lat, V, B = (float(v) for v in inputs.as_args())
        right = float(bm.t_two_ms(S, C, eta, Q, lat, V, B))
        wire_ms = float(bm.comm_ms(1, 0.0, V, B))
        slow = None if measured_bandwidth_GBps is None else _t2_ms(inputs, float(measured_bandwidth_GBps))
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
    if slow is not None:
        slips.insert(0, (slow, f"that is T2 on the link as measured (B = {measured_bandwidth_GBps:.4g} GB/s): "
                               f"the exercise's link is the faster one, B = {B:.4g} GB/s."))
    slips = [(v, t) for v, t in slips if abs(v - right) > 1e-9 * right]  # eta = 1: C/2 is no slip
    how = "Add three parts: S, C / (2 eta), and Q (latency + V / B) with V/B converted to ms."
    return grade(answer_ms, right, slips, "ms", how, rel_tol=0.001,
                 right_text=f"of which {Q * (lat + wire_ms):.4g} ms is communication; the one-rank time is "
                            f"{S + C:.4g} ms.")
