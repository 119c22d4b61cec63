"""The two-device time budget: when does splitting one operation over two devices pay?

One device takes T1 = S + C: S ms that cannot be split, C ms that can. Two devices take
T2 = S + C/(2η) + H, where η in (0, 1] is how efficiently each half runs and
H = Q·(ℓ + V/B) is the communication: Q serialised exchanges, each with startup ℓ ms and
V bytes over an effective bandwidth B in decimal GB/s (V/B in ms is V / (B·1e6)).

Every function takes numbers or numpy arrays (broadcast together) and returns a float or an
array. Times are in ms, V in bytes, B in decimal GB/s. Where no value can make splitting pay the
answer is "never": math.inf, with the reason in `Budget.notes`. Invalid input raises
LabInputError naming the parameter, the value and the allowed range.

N devices (`evaluate_n` and the `*_n` functions): the divisible part runs on N devices, and each
exchange is a ring all-reduce of V bytes (V counted in fp32), sent in the wire dtype:

    T_N = S + C/(Nη) + H_N,    H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w / B],    V_w = V · (wire bytes / 4)

A ring all-reduce is 2(N−1) steps; ℓ is the startup of one exchange on two devices, whose ring has
2 steps, so each step costs ℓ/2 and N devices pay 2(N−1)·ℓ/2 = (N−1)·ℓ. Each device sends
2(N−1)/N · V_w bytes (labutils.model.ring). At N = 2 and fp32 this is exactly the article's model:
(N−1)·ℓ = ℓ, 2(N−1)/N = 1, C/(Nη) = C/(2η); the tests check the two agree to the last bit. The
split pays when C·(1 − 1/(Nη)) > H_N; bf16 or fp16 on the wire halves V_w. The two-device
functions are the article's formulas as printed and stay as they are.

The break-even as a hardware ratio (labutils.model.hardware_ratio): with the startups left out, splitting
pays when the work per byte on the wire, F/V_w (FLOP/byte), exceeds Q·2(N−1)/N / (1 − 1/(Nη))
times the ratio R/B of the compute rate to the link bandwidth. For the lab's MLP block
(F = 4·batch·hidden·ffn, V = batch·hidden values) that is a critical hidden size.

A pure model (notebook 06, the budget dashboard): no launcher, no files; the worked cases and the
`interconnect-lab budget` command are labutils.course.budget_cli. This is a model with stated
assumptions (equal exchanges, no overlap, no competing traffic, no queue); its numbers are
arithmetic, not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labutils.core.arrays import as_float_array, float_or_array, safe_divide
from labutils.core.inputs import LabInputError, check_broadcast, check_range
from labutils.model.budget_formulas import (
    WIRE_DTYPES,
    _break_even,
    _break_even_n,
    _comm,
    _comm_n,
    _min_bandwidth,
    _min_bandwidth_n,
    _min_eta,
    _min_eta_n,
    _n_inputs,
    _saved_fraction,
    ring_factor,
    wire_dtype_name,
)
from labutils.model.budget_formulas import (
    check_devices as check_devices,
)
from labutils.model.budget_formulas import (
    saved_fraction_n as saved_fraction_n,
)
from labutils.model.budget_notes import _notes

# The article's base case: 12 ms of divisible work, four 2 MB exchanges over 10 GB/s.
BASE_CASE = {"S_ms": 0.8, "C_ms": 12.0, "eta": 0.8, "Q": 4, "latency_ms": 0.03,
             "volume_bytes": 2_000_000, "bandwidth_GBps": 10.0}
PARAMETERS = tuple(BASE_CASE)

_TIME = {"low": 0.0, "high": math.inf, "high_open": True, "unit": "ms"}
_RANGES = {
    "S_ms": _TIME,
    "C_ms": _TIME,
    "latency_ms": _TIME,
    "eta": {"low": 0.0, "high": 1.0, "low_open": True},
    "Q": {"low": 0.0, "high": math.inf, "high_open": True, "unit": "communications"},
    "volume_bytes": {"low": 0.0, "high": math.inf, "high_open": True, "unit": "bytes"},
    # an infinite bandwidth is allowed: it shows what the startup costs alone do
    "bandwidth_GBps": {"low": 0.0, "low_open": True, "unit": "GB/s (decimal)"},
}
_LINK_PARAMS = ("eta", "Q", "latency_ms", "volume_bytes", "bandwidth_GBps")
RESULT_FIELDS = ("t_one_ms", "t_two_ms", "comm_ms", "speedup", "efficiency", "break_even_C_ms",
                 "min_bandwidth_GBps", "min_eta", "overlap_bound_ms")


def check_inputs(**params) -> None:
    """Raise LabInputError for the first parameter outside its range (see module docstring): None,
    text, NaN, a negative count, an infinite time; or for arrays that do not broadcast together."""
    for name, value in params.items():
        check_range(name, value, **_RANGES[name])
    check_broadcast(**params)


def _quiet(fn):
    """Run a formula without numpy's RuntimeWarnings: an overflow to inf (a vanishing bandwidth, C
    near 1e308) is an answer ("never") that the notes explain, not a warning on stderr."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapper












# --- the public functions ---

@_quiet
def comm_ms(Q, latency_ms, volume_bytes, bandwidth_GBps):
    """H = Q·(ℓ + V/B) in ms, with V/B = V / (B·1e6) ms for V bytes at B decimal GB/s."""
    check_inputs(Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return float_or_array(_comm(Q, latency_ms, volume_bytes, bandwidth_GBps))


@_quiet
def t_one_ms(S_ms, C_ms):
    """One device: T1 = S + C (ms)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms)
    return float_or_array(as_float_array(S_ms) + as_float_array(C_ms))


@_quiet
def t_two_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Two devices, no overlap: T2 = S + C/(2η) + Q·(ℓ + V/B) (ms)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return float_or_array(as_float_array(S_ms) + as_float_array(C_ms) / (2 * as_float_array(eta))
                          + _comm(Q, latency_ms, volume_bytes, bandwidth_GBps))


@_quiet
def overlap_bound_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Optimistic lower bound with perfect overlap: S + max(C/(2η), H) (ms). Not a prediction."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    H = _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)
    return float_or_array(as_float_array(S_ms) + np.maximum(as_float_array(C_ms) / (2 * as_float_array(eta)), H))


@_quiet
def saved_fraction(eta):
    """The share of C that splitting saves before communication: 1 − 1/(2η) (0.375 at η = 0.8)."""
    check_inputs(eta=eta)
    return float_or_array(_saved_fraction(eta))


@_quiet
def break_even_C_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Divisible compute at which T2 == T1: H / (1 − 1/(2η)) ms; splitting pays above it.

    math.inf ("never") when η ≤ 0.5: the halves then save no time at all.
    """
    check_inputs(eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return float_or_array(_break_even(eta, _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)))


@_quiet
def transfer_window_ms(C_ms, eta, Q, latency_ms):
    """D = C·(1 − 1/(2η))/Q − ℓ: the time each transfer may take after its startup (ms).

    Splitting pays when V/B < D. Q = 0 gives math.inf (nothing to transfer).
    """
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        window = as_float_array(C_ms) * _saved_fraction(eta) / as_float_array(Q) - as_float_array(latency_ms)
    return float_or_array(np.where(as_float_array(Q) > 0, window, math.inf))


@_quiet
def min_bandwidth_GBps(C_ms, eta, Q, latency_ms, volume_bytes):
    """Smallest effective bandwidth that makes splitting pay: V/D, in decimal GB/s.

    0 when no bytes travel (or Q = 0) and the saving beats the startups; math.inf ("never") when
    D ≤ 0: the startups alone use up the compute saved, or η ≤ 0.5.
    """
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes)
    return float_or_array(_min_bandwidth(C_ms, eta, Q, latency_ms, volume_bytes))


@_quiet
def min_eta(C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Smallest local efficiency that makes splitting pay: C / (2(C − H)).

    math.inf ("never") when C ≤ H. A value above 1 is impossible, since η ≤ 1.
    """
    check_inputs(C_ms=C_ms, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return float_or_array(_min_eta(C_ms, _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)))


@dataclass(frozen=True)
class Budget:
    """Every figure of the budget for one set of inputs (floats, or arrays when an input was one).

    `notes` maps a field name to the reason why it is "never" (math.inf) or impossible.
    `efficiency` is speedup / 2 (time against resource count, not energy). From `evaluate_n`,
    `t_two_ms` is the time on the N devices, T_N, and `efficiency` speedup / N.
    """

    t_one_ms: float | np.ndarray
    t_two_ms: float | np.ndarray
    comm_ms: float | np.ndarray
    speedup: float | np.ndarray
    efficiency: float | np.ndarray
    break_even_C_ms: float | np.ndarray
    min_bandwidth_GBps: float | np.ndarray
    min_eta: float | np.ndarray
    overlap_bound_ms: float | np.ndarray
    notes: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Plain numbers (lists for arrays); infinities stay math.inf."""
        out = {}
        for name in RESULT_FIELDS:
            value = getattr(self, name)
            out[name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["notes"] = dict(self.notes)
        return out











@_quiet
def evaluate(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps) -> Budget:
    """The whole budget in one call; inputs may be numbers or arrays (broadcast together)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    S, C, eta_a = as_float_array(S_ms), as_float_array(C_ms), as_float_array(eta)
    H = _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)
    T1 = S + C
    T2 = S + C / (2 * eta_a) + H
    speedup = safe_divide(T1, T2, 1.0)  # no work at all: ratio 1
    shape = np.broadcast_shapes(S.shape, C.shape, eta_a.shape, H.shape)
    min_b = _min_bandwidth(C, eta_a, Q, latency_ms, volume_bytes)
    min_e = _min_eta(C, H)
    values = {
        "t_one_ms": T1, "t_two_ms": T2, "comm_ms": H, "speedup": speedup, "efficiency": speedup / 2,
        "break_even_C_ms": _break_even(eta_a, H), "min_bandwidth_GBps": min_b, "min_eta": min_e,
        "overlap_bound_ms": S + np.maximum(C / (2 * eta_a), H),
    }
    values = {k: float_or_array(np.broadcast_to(v, shape)) if shape else float_or_array(v) for k, v in values.items()}
    return Budget(**values, notes=_notes(C, eta_a, Q, latency_ms, H, min_b, min_e))


def check_scalar(budget: Budget, what: str = "verdict") -> None:
    """LabInputError unless every figure of `budget` is one number (an array budget has one verdict
    per point: evaluate each point on its own)."""
    shape = np.shape(budget.t_one_ms)
    if shape:
        raise LabInputError(f"{what} takes a budget of single numbers; this one holds arrays of shape {shape}: "
                            "evaluate each point on its own (e.g. evaluate(..., C_ms=values[i]))")


def _never_cause(budget: Budget, limit: str) -> str:
    """Why no compute makes splitting pay, from the notes: η too low, or a communication that is infinite."""
    note = budget.notes.get("break_even_C_ms", "")
    if "eta <=" in note:
        return f"no amount of compute makes it pay at eta <= {limit}"
    if "infinite" in note:
        return "no amount of compute makes it pay: the communication is infinite (the bandwidth is too low for V)"
    return "no amount of compute makes it pay"


def verdict(budget: Budget, N: int = 2) -> str:
    """One plain sentence on a scalar budget: does splitting (over N devices) pay, and by how much?
    LabInputError for an array budget (`check_scalar`)."""
    check_scalar(budget)
    t1, t2, be = budget.t_one_ms, budget.t_two_ms, budget.break_even_C_ms
    many = "two devices" if N == 2 else f"{N} devices"
    limit = "0.5" if N == 2 else f"1/{N}"
    if t2 < t1:
        return (f"Splitting pays: {many} take {t2:.4g} ms instead of {t1:.4g} ms "
                f"({budget.speedup:.3g}x faster, efficiency {budget.efficiency:.0%}, not {N}x).")
    if t2 == t1:
        return f"Break-even: both take {t1:.4g} ms; splitting gains nothing."
    need = (_never_cause(budget, limit) if math.isinf(be)
            else f"the divisible compute would have to exceed {be:.4g} ms")
    return (f"Splitting loses: {many} take {t2:.4g} ms against {t1:.4g} ms on one "
            f"({t1 / t2:.3g}x); {need}.")


# --- N devices: the ring all-reduce generalisation (see the module docstring) ---





@_quiet
def wire_bytes(volume_bytes, wire_dtype="fp32"):
    """V_w = V · (bytes per value on the wire / 4): V counted in fp32, sent as `wire_dtype` (bf16 halves it)."""
    check_inputs(volume_bytes=volume_bytes)
    return float_or_array(as_float_array(volume_bytes) * (WIRE_DTYPES[wire_dtype_name(wire_dtype)] / 4))


















@_quiet
def comm_n_ms(Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w/B] ms: Q ring all-reduces on N devices (= comm_ms at N = 2, fp32)."""
    check_inputs(Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return float_or_array(_comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, *_n_inputs(N, wire_dtype)))


@_quiet
def t_n_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """N devices, no overlap: T_N = S + C/(Nη) + H_N (ms); t_two_ms at N = 2, fp32."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes,
                 bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return float_or_array(as_float_array(S_ms) + as_float_array(C_ms) / (n * as_float_array(eta))
                          + _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale))


@_quiet
def break_even_C_n_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """Divisible compute at which T_N == T1: H_N / (1 − 1/(Nη)) ms; math.inf ("never") when η ≤ 1/N."""
    check_inputs(eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return float_or_array(_break_even_n(eta, _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale), n))


@_quiet
def min_bandwidth_n_GBps(C_ms, eta, Q, latency_ms, volume_bytes, N=2, wire_dtype="fp32"):
    """Smallest B that makes N devices pay: 2(N−1)/N·V_w / (D_N·1e6) GB/s, with
    D_N = (C·(1 − 1/(Nη)) − Q(N−1)ℓ)/Q ms; math.inf ("never") when D_N ≤ 0."""
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes)
    return float_or_array(_min_bandwidth_n(C_ms, eta, Q, latency_ms, volume_bytes, *_n_inputs(N, wire_dtype)))


@_quiet
def min_eta_n(C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """Smallest local efficiency that makes N devices pay: C / (N(C − H_N)); math.inf when C ≤ H_N."""
    check_inputs(C_ms=C_ms, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return float_or_array(_min_eta_n(C_ms, _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale), n))


@_quiet
def evaluate_n(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32") -> Budget:
    """The whole budget on N devices (a Budget whose t_two_ms is T_N and efficiency speedup / N).

    Equal, field by field and note by note, to `evaluate` at N = 2 with fp32 on the wire.
    """
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    S, C, eta_a = as_float_array(S_ms), as_float_array(C_ms), as_float_array(eta)
    H = _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale)
    T1 = S + C
    TN = S + C / (n * eta_a) + H
    speedup = safe_divide(T1, TN, 1.0)
    shape = np.broadcast_shapes(S.shape, C.shape, eta_a.shape, H.shape)
    min_b = _min_bandwidth_n(C, eta_a, Q, latency_ms, volume_bytes, n, scale)
    min_e = _min_eta_n(C, H, n)
    values = {
        "t_one_ms": T1, "t_two_ms": TN, "comm_ms": H, "speedup": speedup, "efficiency": speedup / n,
        "break_even_C_ms": _break_even_n(eta_a, H, n), "min_bandwidth_GBps": min_b, "min_eta": min_e,
        "overlap_bound_ms": S + np.maximum(C / (n * eta_a), H),
    }
    values = {k: float_or_array(np.broadcast_to(v, shape)) if shape else float_or_array(v) for k, v in values.items()}
    return Budget(**values, notes=_notes(C, eta_a, Q, latency_ms, H, min_b, min_e, int(n)))


def devices_table(params: dict, world_sizes=(2, 4, 8), wire_dtypes=("fp32", "bf16")) -> pd.DataFrame:
    """T_N, H_N, speedup, efficiency and break-even C for each N and wire dtype, the rest `params`."""


    rows = []
    for dtype in wire_dtypes:
        for n in world_sizes:
            b = evaluate_n(**params, N=n, wire_dtype=dtype)
            rows.append({"N": n, "wire": wire_dtype_name(dtype), "ring factor 2(N-1)/N": ring_factor(n),
                         "H_N (ms)": b.comm_ms, "T_N (ms)": b.t_two_ms, "speedup": b.speedup,
                         "efficiency": b.efficiency, "break-even C (ms)": b.break_even_C_ms})
    return pd.DataFrame(rows)
