"""Why a figure of labutils.model.budget is infinite or undefined: the notes its Budget carries.

`_notes` turns the masks of the evaluated arrays (eta <= 1/N, an infinite H, a link too slow to
ever pay) into one sentence each, for one value or a count over an array (notebook 06's dashboard).
"""

from __future__ import annotations

import numpy as np

from labutils.core.arrays import as_float_array
from labutils.model.budget_formulas import (
    check_devices as check_devices,
)
from labutils.model.budget_formulas import (
    saved_fraction_n as saved_fraction_n,
)

_INF_COMM_REASON = ("the communication H is infinite: V / B overflows, the bandwidth is too low for these "
                    "bytes, so no finite compute pays for it")


_ETA_REASON = ("with eta <= 0.5 the two halves take at least as long as the whole (C/(2 eta) >= C), "
               "so no compute is saved to pay for the communication")


def _reason(mask, total: int, scalar_text: str, array_text: str) -> str | None:
    count = int(np.count_nonzero(mask))
    if not count:
        return None
    return f"never: {scalar_text}" if total == 1 else f"never at {count} of {total} points: {array_text}"


def _eta_reason(N: int = 2) -> str:
    if N == 2:
        return _ETA_REASON
    return (f"with eta <= 1/{N} the {N} parts take at least as long as the whole (C/({N} eta) >= C), "
            "so no compute is saved to pay for the communication")


def _notes(C, eta, Q, latency, H, min_b, min_e, N: int = 2) -> dict:
    """Human reasons for every "never" (and for a minimum η above 1), one line per field.

    N = 2 is the article's wording; other N name the ring's (N−1)·ℓ startups and C/(Nη).
    """
    C, eta, Q, latency, H, min_b, min_e = np.broadcast_arrays(*map(as_float_array,
                                                                   (C, eta, Q, latency, H, min_b, min_e)))
    total = C.size
    saved = 1.0 - 1.0 / (float(N) * eta)
    saving, startup = C * saved, Q * ((N - 1.0) * latency)
    first = (lambda x: float(x.ravel()[0]))
    notes = {}
    low_eta = saved <= 0
    reason = _eta_reason(N)
    startups = "Q*l" if N == 2 else f"Q*{N - 1}*l"
    kept = "C*(1 - 1/(2 eta))" if N == 2 else f"C*(1 - 1/({N} eta))"
    text = _reason(low_eta, total, reason, reason)
    no_link = np.isinf(H) & ~low_eta
    link_text = _reason(no_link, total, _INF_COMM_REASON, _INF_COMM_REASON)
    text = "; ".join(t for t in (text, link_text) if t)
    if text:
        notes["break_even_C_ms"] = text
    startup_bound = np.isinf(min_b) & ~low_eta
    parts = [p for p in (
        _reason(low_eta & np.isinf(min_b), total, reason, reason),
        _reason(startup_bound, total,
                f"the startups alone ({startups} = {first(startup):.6g} ms) use up the compute saved "
                f"({kept} = {first(saving):.6g} ms); no bandwidth is enough",
                f"the startups alone ({startups}) use up the compute saved ({kept}); "
                "no bandwidth is enough")) if p]
    if parts:
        notes["min_bandwidth_GBps"] = "; ".join(parts)
    parts_word = "halves" if N == 2 else "parts"
    text = _reason(np.isinf(min_e), total,
                   f"the communication (H = {first(H):.6g} ms) is at least the whole divisible compute "
                   f"(C = {first(C):.6g} ms); even perfect {parts_word} (eta = 1) cannot pay for it",
                   "the communication H is at least the divisible compute C; even eta = 1 cannot pay for it")
    over_one = np.isfinite(min_e) & (min_e > 1)
    if over_one.any():
        extra = (f"needs eta > {first(min_e[over_one]):.6g}, impossible since eta <= 1"
                 if total == 1 else f"impossible (needs eta > 1) at {int(over_one.sum())} of {total} points")
        text = f"{text}; {extra}" if text else extra
    if text:
        notes["min_eta"] = text
    return notes
