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
2(N−1)/N · V_w bytes (labutils.ring). At N = 2 and fp32 this is exactly the article's model:
(N−1)·ℓ = ℓ, 2(N−1)/N = 1, C/(Nη) = C/(2η); the tests check the two agree to the last bit. The
split pays when C·(1 − 1/(Nη)) > H_N; bf16 or fp16 on the wire halves V_w. The two-device
functions are the article's formulas as printed and stay as they are.

The break-even as a hardware ratio (`critical_intensity`, `critical_hidden`): with the startups
left out, splitting pays when the work per byte on the wire, F/V_w (FLOP/byte), exceeds
Q·2(N−1)/N / (1 − 1/(Nη)) times the ratio R/B of the compute rate to the link bandwidth. For the
lab's MLP block (F = 4·batch·hidden·ffn, V = batch·hidden values) that is a critical hidden size.

This is a model with stated assumptions (equal exchanges, no overlap, no competing traffic,
no queue); its numbers are arithmetic, not measurements.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from labutils.validate import LabInputError, check_range

# The article's base case: 12 ms of divisible work, four 2 MB exchanges over 10 GB/s.
BASE_CASE = {"S_ms": 0.8, "C_ms": 12.0, "eta": 0.8, "Q": 4, "latency_ms": 0.03,
             "volume_bytes": 2_000_000, "bandwidth_GBps": 10.0}
PARAMETERS = tuple(BASE_CASE)
CASES_FILE = Path(__file__).resolve().parent.parent / "data" / "budget_cases.json"

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
    """Raise LabInputError for the first parameter outside its range (see module docstring)."""
    for name, value in params.items():
        check_range(name, value, **_RANGES[name])


def _a(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _out(x):
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


# --- the formulas, unchecked (inputs already validated) ---

def _comm(Q, latency_ms, volume_bytes, bandwidth_GBps):
    return _a(Q) * (_a(latency_ms) + _a(volume_bytes) / (_a(bandwidth_GBps) * 1e6))


def _saved_fraction(eta):
    return 1.0 - 1.0 / (2.0 * _a(eta))


def _break_even(eta, H):
    frac = _saved_fraction(eta)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(frac > 0, _a(H) / np.where(frac > 0, frac, 1.0), math.inf)


def _min_bandwidth(C_ms, eta, Q, latency_ms, volume_bytes):
    saving = _a(C_ms) * _saved_fraction(eta)
    startup = _a(Q) * _a(latency_ms)
    possible = saving > startup
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        window = np.where(_a(Q) > 0, (saving - startup) / np.where(_a(Q) > 0, _a(Q), 1.0), math.inf)
        need = np.where(_a(volume_bytes) > 0, _a(volume_bytes) / (window * 1e6), 0.0)
    return np.where(possible, need, math.inf)


def _min_eta(C_ms, H):
    C, H = np.broadcast_arrays(_a(C_ms), _a(H))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(C > H, C / (2.0 * np.where(C > H, C - H, 1.0)), math.inf)


# --- the public functions ---

def comm_ms(Q, latency_ms, volume_bytes, bandwidth_GBps):
    """H = Q·(ℓ + V/B) in ms, with V/B = V / (B·1e6) ms for V bytes at B decimal GB/s."""
    check_inputs(Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return _out(_comm(Q, latency_ms, volume_bytes, bandwidth_GBps))


def t_one_ms(S_ms, C_ms):
    """One device: T1 = S + C (ms)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms)
    return _out(_a(S_ms) + _a(C_ms))


def t_two_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Two devices, no overlap: T2 = S + C/(2η) + Q·(ℓ + V/B) (ms)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return _out(_a(S_ms) + _a(C_ms) / (2 * _a(eta)) + _comm(Q, latency_ms, volume_bytes, bandwidth_GBps))


def overlap_bound_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Optimistic lower bound with perfect overlap: S + max(C/(2η), H) (ms). Not a prediction."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    H = _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)
    return _out(_a(S_ms) + np.maximum(_a(C_ms) / (2 * _a(eta)), H))


def saved_fraction(eta):
    """The share of C that splitting saves before communication: 1 − 1/(2η) (0.375 at η = 0.8)."""
    check_inputs(eta=eta)
    return _out(_saved_fraction(eta))


def break_even_C_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Divisible compute at which T2 == T1: H / (1 − 1/(2η)) ms; splitting pays above it.

    math.inf ("never") when η ≤ 0.5: the halves then save no time at all.
    """
    check_inputs(eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return _out(_break_even(eta, _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)))


def transfer_window_ms(C_ms, eta, Q, latency_ms):
    """D = C·(1 − 1/(2η))/Q − ℓ: the time each transfer may take after its startup (ms).

    Splitting pays when V/B < D. Q = 0 gives math.inf (nothing to transfer).
    """
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        window = _a(C_ms) * _saved_fraction(eta) / _a(Q) - _a(latency_ms)
    return _out(np.where(_a(Q) > 0, window, math.inf))


def min_bandwidth_GBps(C_ms, eta, Q, latency_ms, volume_bytes):
    """Smallest effective bandwidth that makes splitting pay: V/D, in decimal GB/s.

    0 when no bytes travel (or Q = 0) and the saving beats the startups; math.inf ("never") when
    D ≤ 0: the startups alone use up the compute saved, or η ≤ 0.5.
    """
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes)
    return _out(_min_bandwidth(C_ms, eta, Q, latency_ms, volume_bytes))


def min_eta(C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps):
    """Smallest local efficiency that makes splitting pay: C / (2(C − H)).

    math.inf ("never") when C ≤ H. A value above 1 is impossible, since η ≤ 1.
    """
    check_inputs(C_ms=C_ms, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return _out(_min_eta(C_ms, _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)))


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
    C, eta, Q, latency, H, min_b, min_e = np.broadcast_arrays(*map(_a, (C, eta, Q, latency, H, min_b, min_e)))
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


def evaluate(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps) -> Budget:
    """The whole budget in one call; inputs may be numbers or arrays (broadcast together)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    S, C, eta_a = _a(S_ms), _a(C_ms), _a(eta)
    H = _comm(Q, latency_ms, volume_bytes, bandwidth_GBps)
    T1 = S + C
    T2 = S + C / (2 * eta_a) + H
    with np.errstate(divide="ignore", invalid="ignore"):
        speedup = np.where(T2 > 0, T1 / np.where(T2 > 0, T2, 1.0), 1.0)  # no work at all: ratio 1
    shape = np.broadcast_shapes(S.shape, C.shape, eta_a.shape, H.shape)
    min_b = _min_bandwidth(C, eta_a, Q, latency_ms, volume_bytes)
    min_e = _min_eta(C, H)
    values = {
        "t_one_ms": T1, "t_two_ms": T2, "comm_ms": H, "speedup": speedup, "efficiency": speedup / 2,
        "break_even_C_ms": _break_even(eta_a, H), "min_bandwidth_GBps": min_b, "min_eta": min_e,
        "overlap_bound_ms": S + np.maximum(C / (2 * eta_a), H),
    }
    values = {k: _out(np.broadcast_to(v, shape)) if shape else _out(v) for k, v in values.items()}
    return Budget(**values, notes=_notes(C, eta_a, Q, latency_ms, H, min_b, min_e))


def verdict(budget: Budget, N: int = 2) -> str:
    """One plain sentence on a scalar budget: does splitting (over N devices) pay, and by how much?"""
    t1, t2, be = budget.t_one_ms, budget.t_two_ms, budget.break_even_C_ms
    many = "two devices" if N == 2 else f"{N} devices"
    limit = "0.5" if N == 2 else f"1/{N}"
    if t2 < t1:
        return (f"Splitting pays: {many} take {t2:.4g} ms instead of {t1:.4g} ms "
                f"({budget.speedup:.3g}x faster, efficiency {budget.efficiency:.0%}, not {N}x).")
    if t2 == t1:
        return f"Break-even: both take {t1:.4g} ms; splitting gains nothing."
    need = (f"no amount of compute makes it pay at eta <= {limit}" if math.isinf(be)
            else f"the divisible compute would have to exceed {be:.4g} ms")
    return (f"Splitting loses: {many} take {t2:.4g} ms against {t1:.4g} ms on one "
            f"({t1 / t2:.3g}x); {need}.")


# --- N devices: the ring all-reduce generalisation (see the module docstring) ---

WIRE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per value on the wire; V is counted in fp32
_WIRE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def wire_dtype_name(wire_dtype) -> str:
    """"fp32", "bf16" or "fp16" (torch names accepted); LabInputError naming the allowed values."""
    name = _WIRE_ALIASES.get(str(wire_dtype).lower(), str(wire_dtype).lower())
    if name not in WIRE_DTYPES:
        raise LabInputError(f"wire_dtype={wire_dtype!r} is not one of: {', '.join(WIRE_DTYPES)}")
    return name


def wire_bytes(volume_bytes, wire_dtype="fp32"):
    """V_w = V · (bytes per value on the wire / 4): V counted in fp32, sent as `wire_dtype` (bf16 halves it)."""
    check_inputs(volume_bytes=volume_bytes)
    return _out(_a(volume_bytes) * (WIRE_DTYPES[wire_dtype_name(wire_dtype)] / 4))


def check_devices(N) -> int:
    """N as an int, or LabInputError unless it is a whole number of devices >= 2."""
    value = N.item() if isinstance(N, np.generic) else N
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() or value < 2:
        raise LabInputError(f"N={N!r} is outside the allowed range: a whole number of devices >= 2")
    return int(value)


def ring_factor(N) -> float:
    """2(N−1)/N: the share of V each device sends in a ring all-reduce (1 at N = 2, towards 2)."""
    n = float(check_devices(N))
    return 2.0 * (n - 1.0) / n


def _n_inputs(N, wire_dtype) -> tuple[float, float]:
    return float(check_devices(N)), WIRE_DTYPES[wire_dtype_name(wire_dtype)] / 4


def _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n: float, scale: float):
    factor = 2.0 * (n - 1.0) / n
    return _a(Q) * ((n - 1.0) * _a(latency_ms) + factor * (_a(volume_bytes) * scale) / (_a(bandwidth_GBps) * 1e6))


def _saved_n(eta, n: float):
    return 1.0 - 1.0 / (n * _a(eta))


def _break_even_n(eta, H, n: float):
    frac = _saved_n(eta, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(frac > 0, _a(H) / np.where(frac > 0, frac, 1.0), math.inf)


def _min_bandwidth_n(C_ms, eta, Q, latency_ms, volume_bytes, n: float, scale: float):
    saving = _a(C_ms) * _saved_n(eta, n)
    startup = _a(Q) * ((n - 1.0) * _a(latency_ms))
    possible = saving > startup
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        window = np.where(_a(Q) > 0, (saving - startup) / np.where(_a(Q) > 0, _a(Q), 1.0), math.inf)
        sent = 2.0 * (n - 1.0) / n * (_a(volume_bytes) * scale)
        need = np.where(_a(volume_bytes) > 0, sent / (window * 1e6), 0.0)
    return np.where(possible, need, math.inf)


def _min_eta_n(C_ms, H, n: float):
    C, H = np.broadcast_arrays(_a(C_ms), _a(H))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(C > H, C / (n * np.where(C > H, C - H, 1.0)), math.inf)


def comm_n_ms(Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w/B] ms: Q ring all-reduces on N devices (= comm_ms at N = 2, fp32)."""
    check_inputs(Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    return _out(_comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, *_n_inputs(N, wire_dtype)))


def t_n_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """N devices, no overlap: T_N = S + C/(Nη) + H_N (ms); t_two_ms at N = 2, fp32."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes,
                 bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return _out(_a(S_ms) + _a(C_ms) / (n * _a(eta)) + _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale))


def break_even_C_n_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """Divisible compute at which T_N == T1: H_N / (1 − 1/(Nη)) ms; math.inf ("never") when η ≤ 1/N."""
    check_inputs(eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return _out(_break_even_n(eta, _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale), n))


def min_bandwidth_n_GBps(C_ms, eta, Q, latency_ms, volume_bytes, N=2, wire_dtype="fp32"):
    """Smallest B that makes N devices pay: 2(N−1)/N·V_w / (D_N·1e6) GB/s, with
    D_N = (C·(1 − 1/(Nη)) − Q(N−1)ℓ)/Q ms; math.inf ("never") when D_N ≤ 0."""
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes)
    return _out(_min_bandwidth_n(C_ms, eta, Q, latency_ms, volume_bytes, *_n_inputs(N, wire_dtype)))


def min_eta_n(C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32"):
    """Smallest local efficiency that makes N devices pay: C / (N(C − H_N)); math.inf when C ≤ H_N."""
    check_inputs(C_ms=C_ms, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    return _out(_min_eta_n(C_ms, _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale), n))


def evaluate_n(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, N=2, wire_dtype="fp32") -> Budget:
    """The whole budget on N devices (a Budget whose t_two_ms is T_N and efficiency speedup / N).

    Equal, field by field and note by note, to `evaluate` at N = 2 with fp32 on the wire.
    """
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, scale = _n_inputs(N, wire_dtype)
    S, C, eta_a = _a(S_ms), _a(C_ms), _a(eta)
    H = _comm_n(Q, latency_ms, volume_bytes, bandwidth_GBps, n, scale)
    T1 = S + C
    TN = S + C / (n * eta_a) + H
    with np.errstate(divide="ignore", invalid="ignore"):
        speedup = np.where(TN > 0, T1 / np.where(TN > 0, TN, 1.0), 1.0)
    shape = np.broadcast_shapes(S.shape, C.shape, eta_a.shape, H.shape)
    min_b = _min_bandwidth_n(C, eta_a, Q, latency_ms, volume_bytes, n, scale)
    min_e = _min_eta_n(C, H, n)
    values = {
        "t_one_ms": T1, "t_two_ms": TN, "comm_ms": H, "speedup": speedup, "efficiency": speedup / n,
        "break_even_C_ms": _break_even_n(eta_a, H, n), "min_bandwidth_GBps": min_b, "min_eta": min_e,
        "overlap_bound_ms": S + np.maximum(C / (n * eta_a), H),
    }
    values = {k: _out(np.broadcast_to(v, shape)) if shape else _out(v) for k, v in values.items()}
    return Budget(**values, notes=_notes(C, eta_a, Q, latency_ms, H, min_b, min_e, int(n)))


def devices_table(params: dict, world_sizes=(2, 4, 8), wire_dtypes=("fp32", "bf16")) -> "pd.DataFrame":
    """T_N, H_N, speedup, efficiency and break-even C for each N and wire dtype, the rest `params`."""
    import pandas as pd

    rows = []
    for dtype in wire_dtypes:
        for n in world_sizes:
            b = evaluate_n(**params, N=n, wire_dtype=dtype)
            rows.append({"N": n, "wire": wire_dtype_name(dtype), "ring factor 2(N-1)/N": ring_factor(n),
                         "H_N (ms)": b.comm_ms, "T_N (ms)": b.t_two_ms, "speedup": b.speedup,
                         "efficiency": b.efficiency, "break-even C (ms)": b.break_even_C_ms})
    return pd.DataFrame(rows)


# --- the break-even as a hardware ratio ---

def hardware_ratio(compute_TFLOPs, bandwidth_GBps):
    """R/B in FLOP per byte: compute rate (TFLOP/s, 1e12 FLOP/s) over link bandwidth (decimal GB/s)."""
    check_range("compute_TFLOPs", compute_TFLOPs, low=0.0, low_open=True, unit="TFLOP/s")
    check_inputs(bandwidth_GBps=bandwidth_GBps)
    return _out(_a(compute_TFLOPs) * 1e12 / (_a(bandwidth_GBps) * 1e9))


def critical_intensity(compute_TFLOPs, bandwidth_GBps, eta=0.8, N=2, Q=1):
    """FLOP per byte on the wire above which splitting pays (startups left out), in FLOP/byte:

        F/V_w > I* = Q · 2(N−1)/N / (1 − 1/(Nη)) · R/B

    from C·(1 − 1/(Nη)) > Q·2(N−1)/N·V_w/B with C = F/R. math.inf ("never") when η ≤ 1/N.
    """
    check_inputs(eta=eta, Q=Q)
    n = float(check_devices(N))
    saved = _saved_n(eta, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(saved > 0, _a(Q) * ring_factor(N) / np.where(saved > 0, saved, 1.0)
                       * hardware_ratio(compute_TFLOPs, bandwidth_GBps), math.inf)
    return _out(out)


def critical_hidden(compute_TFLOPs, bandwidth_GBps, eta=0.8, N=2, Q=1, wire_dtype="bf16", ffn_ratio=4.0,
                    batch_tokens=None, latency_ms=0.0):
    """The hidden size above which splitting the lab's MLP block over N devices pays.

    The block does F = 4·b·h·(r·h) FLOP (two linears, r = ffn/hidden) and all-reduces V = b·h
    values, V_w = b·h·w bytes in the wire dtype, so F/V_w = 4·r·h/w and, startups left out,

        h* = I* · w / (4r)          (the batch b cancels; I* from critical_intensity)

    With `batch_tokens` b and a startup ℓ (ms), C(h)·(1 − 1/(Nη)) > Q((N−1)ℓ + 2(N−1)/N·b·h·w/B)
    is a quadratic a·h² − c·h − d > 0, a = 4·b·r·s/R, c = Q·2(N−1)/N·b·w/B, d = Q(N−1)ℓ (R, B per
    ms), and h* = (c + √(c² + 4ad)) / (2a). math.inf ("never") when η ≤ 1/N.
    """
    w = WIRE_DTYPES[wire_dtype_name(wire_dtype)]
    check_range("ffn_ratio", ffn_ratio, low=0.0, low_open=True)
    check_inputs(latency_ms=latency_ms)
    intensity = critical_intensity(compute_TFLOPs, bandwidth_GBps, eta, N, Q)
    if batch_tokens is None or not np.any(_a(latency_ms) > 0):
        return _out(_a(intensity) * w / (4.0 * _a(ffn_ratio)))
    check_range("batch_tokens", batch_tokens, low=0.0, low_open=True, unit="tokens")
    n = float(check_devices(N))
    saved = _saved_n(eta, n)
    R, B = _a(compute_TFLOPs) * 1e9, _a(bandwidth_GBps) * 1e6  # FLOP per ms, bytes per ms
    a = 4.0 * _a(batch_tokens) * _a(ffn_ratio) * saved / R
    c = _a(Q) * ring_factor(N) * _a(batch_tokens) * w / B
    d = _a(Q) * (n - 1.0) * _a(latency_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(saved > 0, (c + np.sqrt(c * c + 4.0 * a * d)) / (2.0 * np.where(saved > 0, a, 1.0)), math.inf)
    return _out(h)


# --- the article's worked cases ---

def load_cases(path: str | Path = CASES_FILE) -> list[dict]:
    """The worked cases of data/budget_cases.json: name, changes, inputs (all seven), printed figures."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return [{**case, "inputs": {**doc["base_case"], **case.get("changes", {})}} for case in doc["cases"]]


def case_figures(**inputs) -> dict:
    """Every figure the article prints for one case: the Budget fields plus the intermediate steps
    (one transfer's V/B, the split compute C/(2η), the saved share 1 − 1/(2η), and D in seconds)."""
    figures = evaluate(**inputs).as_dict()
    figures.pop("notes")
    figures["transfer_ms"] = comm_ms(1, 0.0, inputs["volume_bytes"], inputs["bandwidth_GBps"])
    figures["parallel_compute_ms"] = t_two_ms(0.0, inputs["C_ms"], inputs["eta"], 0, 0.0, 0, 1.0)
    figures["saved_fraction"] = saved_fraction(inputs["eta"])
    figures["D_s"] = transfer_window_ms(inputs["C_ms"], inputs["eta"], inputs["Q"], inputs["latency_ms"]) / 1e3
    return figures


def cases_table(path: str | Path = CASES_FILE):
    """The worked cases as a pandas DataFrame: what changed, T1, H, T2, speedup, break-even."""
    import pandas as pd

    rows = []
    for case in load_cases(path):
        b = evaluate(**case["inputs"])
        rows.append({"case": case["name"],
                     "change": ", ".join(f"{k}={v:g}" for k, v in case.get("changes", {}).items()) or "-",
                     "T1 (ms)": b.t_one_ms, "H (ms)": b.comm_ms, "T2 (ms)": b.t_two_ms,
                     "speedup": b.speedup, "break-even C (ms)": b.break_even_C_ms,
                     "article prints": ", ".join(f"{k} {v}" for k, v in case["printed"].items())})
    return pd.DataFrame(rows).set_index("case")


# --- the command line ---

_FLAGS = {"S_ms": "--S-ms", "C_ms": "--C-ms", "eta": "--eta", "Q": "--Q", "latency_ms": "--latency-ms",
          "volume_bytes": "--volume-bytes", "bandwidth_GBps": "--bandwidth-GBps"}
_HELP = {"S_ms": "serial time that cannot be split (ms)", "C_ms": "divisible compute on one device (ms)",
         "eta": "local efficiency of each half, in (0, 1]", "Q": "serialised communications",
         "latency_ms": "startup cost of each communication (ms)",
         "volume_bytes": "bytes on the critical path of each communication",
         "bandwidth_GBps": "effective bandwidth (decimal GB/s)"}
_LABELS = {"t_one_ms": ("one device, T1", "ms"), "t_two_ms": ("two devices, T2", "ms"),
           "comm_ms": ("communication, H", "ms"), "speedup": ("speedup T1/T2", "x"),
           "efficiency": ("two-device efficiency", ""), "break_even_C_ms": ("break-even C", "ms"),
           "min_bandwidth_GBps": ("minimum bandwidth", "GB/s"), "min_eta": ("minimum eta", ""),
           "overlap_bound_ms": ("overlap lower bound", "ms")}


def _number(name: str, text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise LabInputError(f"{name}={text!r} is not a number ({_FLAGS[name]})") from None


def _labels(N: int) -> dict:
    if N == 2:
        return _LABELS
    return {**_LABELS, "t_two_ms": (f"{N} devices, T_N", "ms"), "speedup": ("speedup T1/T_N", "x"),
            "efficiency": (f"{N}-device efficiency", "")}


def format_table(params: dict, budget: Budget, N: int = 2, wire_dtype: str = "fp32") -> str:
    """The readable report printed by `python -m labutils budget` (N devices and the wire dtype when not 2 / fp32)."""
    shown = ", ".join(f"{name}={params[name]:.10g}" for name in PARAMETERS)
    wire = wire_dtype_name(wire_dtype)
    if N == 2 and wire == "fp32":
        head = "Two-device time budget (a model, not a measurement)"
    else:
        head = (f"Time budget on N = {N} devices, a ring all-reduce per exchange, {wire} on the wire "
                "(a model, not a measurement)")
        shown += f", N={N}, wire_dtype={wire}"
    lines = [head, f"inputs: {shown}", ""]
    for name in RESULT_FIELDS:
        label, unit = _labels(N)[name]
        value = getattr(budget, name)
        text = "never" if math.isinf(value) else f"{value:.6g} {unit}"
        lines.append(f"  {label:<24} {text}".rstrip())
    lines += ["", verdict(budget, N)]
    lines += [f"note ({k}): {v}" for k, v in budget.notes.items()]
    return "\n".join(lines)


def _devices_arg(text) -> int:
    if text is None:
        return 2
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise LabInputError(f"N={text!r} is not a number (--N)") from None
    try:
        return check_devices(value)
    except LabInputError:
        raise LabInputError(f"N={text!r} is outside the allowed range: a whole number of devices >= 2 (--N)") from None


def _cli(args) -> int:
    from labutils.results import to_json

    params = {name: _number(name, getattr(args, name)) if getattr(args, name) is not None else BASE_CASE[name]
              for name in PARAMETERS}
    N = _devices_arg(args.N)
    wire = "fp32" if args.wire_dtype is None else args.wire_dtype
    try:
        wire = wire_dtype_name(wire)
    except LabInputError as exc:
        raise LabInputError(f"{exc} (--wire-dtype)") from None
    try:
        budget = evaluate_n(**params, N=N, wire_dtype=wire)
    except LabInputError as exc:
        name = str(exc).split("=", 1)[0]
        raise LabInputError(f"{exc} ({_FLAGS[name]})" if name in _FLAGS else str(exc)) from None
    print(to_json(budget.as_dict()) if args.json else format_table(params, budget, N, wire))
    return 0


def add_cli(sub) -> None:
    """`python -m labutils budget [--S-ms ...] [--N 4] [--wire-dtype bf16] [--json]` (defaults: the article's base case)."""
    parser = sub.add_parser("budget", help="the time budget: T1, T2 (or T_N), speedup, break-even",
                            description="Evaluate the time budget of splitting work over two (or N) devices. "
                                        "Defaults are the article's base case; a 'never' is printed as never "
                                        "(null in JSON).")
    for name, flag in _FLAGS.items():
        parser.add_argument(flag, dest=name, metavar="X", default=None,
                            help=f"{_HELP[name]} [base case: {BASE_CASE[name]:g}]")
    parser.add_argument("--N", dest="N", metavar="N", default=None,
                        help="devices sharing the work, each exchange a ring all-reduce: H = Q((N-1)l + "
                             "2(N-1)/N V/B) [2: the article's model]")
    parser.add_argument("--wire-dtype", dest="wire_dtype", metavar="D", default=None,
                        help=f"dtype on the wire, one of {', '.join(WIRE_DTYPES)}; V is counted in fp32, "
                             "bf16/fp16 halve it [fp32]")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=_cli)
