"""The time budget: when does splitting one operation over N devices pay? (The article's model is N = 2.)

One device takes T1 = S + C: S ms that cannot be split, C ms that can. The article's two devices take

    T2 = S + C/(2η) + H,    H = Q·(ℓ + V/B)

where η in (0, 1] is how efficiently each half runs and H is the communication: Q serialised
exchanges, each with startup ℓ ms and V bytes over an effective bandwidth B in decimal GB/s (V/B
in ms is V / (B·1e6)). On N devices each exchange is a ring all-reduce of V bytes (counted in
fp32), sent in the wire dtype:

    T_N = S + C/(Nη) + H_N,    H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w / B],    V_w = V · (wire bytes / 4)

A ring all-reduce is 2(N−1) steps; ℓ is the startup of one exchange on two devices, whose ring has
2 steps, so each step costs ℓ/2 and N devices pay 2(N−1)·ℓ/2 = (N−1)·ℓ. Each device sends
2(N−1)/N · V_w bytes (labutils.model.ring). At N = 2 and fp32, (N−1)·ℓ = ℓ, 2(N−1)/N = 1 and
C/(Nη) = C/(2η) exactly, so every function below gives the article's figures to the last bit
there. The split pays when C·(1 − 1/(Nη)) > H_N; bf16 or fp16 on the wire halves V_w.

Every function takes numbers or numpy arrays (broadcast together) and returns a float or an
array; `n_devices` (2 by default) and `wire_dtype` ("fp32" by default) are single values. Times
are in ms, V in bytes, B in decimal GB/s. Where no value can make splitting pay the answer is
"never": math.inf, with the reason in `Budget.notes`. The public functions check their input once,
on entry (LabInputError naming the parameter, the value and the allowed range); the formulas
after them read like the physics.

C is a time. Where it comes from a layer's arithmetic, C = F/R assumes the layer is compute-bound;
labutils.model.hardware_ratio gives C = max(F/R, W/M) with the memory-bound term (the weights' reads),
and the break-even as a hardware ratio. The article's worked cases
are labutils.course.budget_cases; the `interconnect-lab budget` command is
labutils.course.budget_cli. A pure model (notebook 08, the budget dashboard): no launcher, no
files. It has stated assumptions (equal exchanges, no overlap, no competing traffic, no queue);
its numbers are arithmetic, not measurements.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labutils.core.inputs import (
    LabInputError,
    as_float_array,
    check_broadcast,
    check_range,
    check_whole,
    float_or_array,
    safe_divide,
)

# The article's base case: 12 ms of divisible work, four 2 MB exchanges over 10 GB/s.
BASE_CASE = {"S_ms": 0.8, "C_ms": 12.0, "eta": 0.8, "Q": 4, "latency_ms": 0.03,
             "volume_bytes": 2_000_000, "bandwidth_GBps": 10.0}
PARAMETERS = tuple(BASE_CASE)
RESULT_FIELDS = ("t_one_ms", "t_two_ms", "comm_ms", "speedup", "efficiency", "break_even_C_ms",
                 "min_bandwidth_GBps", "min_eta", "ideal_overlap_ms")
WIRE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per value on the wire; V is counted in fp32

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
# More devices than any machine holds (the largest hold about 10**5); N stays exact as a float.
MAX_DEVICES = 10**9
_WIRE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


# --- the door: what enters is checked here, once ---

def check_inputs(**params) -> None:
    """Raise LabInputError for the first parameter outside its range (see _RANGES): None, text, NaN,
    a negative count, an infinite time, a count of exchanges Q that is not whole (2.0 is 2, 1.5
    no count), an empty array; or for arrays that do not broadcast together."""
    for name, value in params.items():
        check_range(name, value, **_RANGES[name])
        if np.size(value) == 0:
            raise LabInputError(f"{name}={value!r} is empty: give a number, or an array of at least one")
    if "Q" in params:
        check_whole("Q", params["Q"], unit="communications")
    check_broadcast(**params)


def check_devices(n_devices, name: str = "n_devices") -> int:
    """n_devices as an int, or LabInputError (naming `name`) unless it is a whole number of devices >= 2."""
    value = n_devices.item() if isinstance(n_devices, np.generic) else n_devices
    whole = not isinstance(value, bool) and (isinstance(value, int) or isinstance(value, float) and value.is_integer())
    if not whole or not 2 <= value <= MAX_DEVICES:
        raise LabInputError(f"{name}={n_devices!r} is outside the allowed range: a whole number of devices "
                            f"in [2, {MAX_DEVICES:,}]")
    return int(value)


def wire_dtype_name(wire_dtype) -> str:
    """"fp32", "bf16" or "fp16" (torch names accepted); LabInputError naming the allowed values."""
    name = _WIRE_ALIASES.get(str(wire_dtype).lower(), str(wire_dtype).lower())
    if name not in WIRE_DTYPES:
        raise LabInputError(f"wire_dtype={wire_dtype!r} is not one of: {', '.join(WIRE_DTYPES)}")
    return name


def _ring(n_devices, wire_dtype) -> tuple[float, float]:
    """(N, V_w / V) checked: the device count as a float and the wire dtype's share of fp32."""
    return float(check_devices(n_devices)), WIRE_DTYPES[wire_dtype_name(wire_dtype)] / 4


def _quiet(fn):
    """Run a public function without numpy's RuntimeWarnings: an overflow to inf (a vanishing
    bandwidth, C near 1e308) is an answer ("never") that the notes explain, not a warning on stderr."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapper


# --- the formulas (inputs already checked; n = N as a float, w = V_w / V) ---

def _saved(eta, n):
    """1 − 1/(Nη): the share of C that splitting saves before communication."""
    return 1.0 - 1.0 / (n * eta)


def _comm(Q, latency, V, B, n, w):
    """H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w/B] ms."""
    return Q * ((n - 1.0) * latency + 2.0 * (n - 1.0) / n * (V * w) / (B * 1e6))


def _break_even(eta, H, n):
    """H_N / (1 − 1/(Nη)); inf where nothing is saved (η ≤ 1/N)."""
    return safe_divide(H, _saved(eta, n))


def _min_bandwidth(C, eta, Q, latency, V, n, w):
    """2(N−1)/N·V_w / (D_N·1e6) GB/s, D_N = (C·(1 − 1/(Nη)) − Q(N−1)ℓ)/Q; inf where D_N ≤ 0, 0 when no bytes travel."""
    saving, startups = C * _saved(eta, n), Q * ((n - 1.0) * latency)
    window_ms = safe_divide(saving - startups, Q)
    need = np.where(V > 0, 2.0 * (n - 1.0) / n * (V * w) / (window_ms * 1e6), 0.0)
    return np.where(saving > startups, need, math.inf)


def _min_eta(C, H, n):
    """C / (N(C − H_N)), written 1 / (N(1 − H_N/C)) so that C near 1e308 does not overflow to 0; inf where C ≤ H_N."""
    C, H = np.broadcast_arrays(C, H)
    return np.where(C > H, 1.0 / (n * (1.0 - H / np.where(C > H, C, 1.0))), math.inf)


# --- the notes: why a figure is "never" ---

_INF_COMM_REASON = ("the communication H is infinite: V / B overflows, the bandwidth is too low for these "
                    "bytes, so no finite compute pays for it")


def _eta_reason(N: int) -> str:
    if N == 2:
        return ("with eta <= 0.5 the two halves take at least as long as the whole (C/(2 eta) >= C), "
                "so no compute is saved to pay for the communication")
    return (f"with eta <= 1/{N} the {N} parts take at least as long as the whole (C/({N} eta) >= C), "
            "so no compute is saved to pay for the communication")


def _reason(mask, total: int, scalar_text: str, array_text: str) -> str | None:
    count = int(np.count_nonzero(mask))
    if not count:
        return None
    return f"never: {scalar_text}" if total == 1 else f"never at {count} of {total} points: {array_text}"


def _notes(C, eta, Q, latency, H, min_b, min_e, N: int) -> dict:
    """Human reasons for every "never" (and for a minimum η above 1), one line per field, for one
    value or a count over an array. N = 2 is the article's wording; other N name the ring's
    (N−1)·ℓ startups and C/(Nη)."""
    C, eta, Q, latency, H, min_b, min_e = np.broadcast_arrays(C, eta, Q, latency, H, min_b, min_e)
    total = C.size
    saved = _saved(eta, float(N))
    saving, startup = C * saved, Q * ((N - 1.0) * latency)
    first = (lambda x: float(x.ravel()[0]))
    notes = {}
    low_eta = saved <= 0
    reason = _eta_reason(N)
    startups = "Q*l" if N == 2 else f"Q*{N - 1}*l"
    kept = "C*(1 - 1/(2 eta))" if N == 2 else f"C*(1 - 1/({N} eta))"
    text = "; ".join(t for t in (_reason(low_eta, total, reason, reason),
                                 _reason(np.isinf(H) & ~low_eta, total, _INF_COMM_REASON, _INF_COMM_REASON)) if t)
    if text:
        notes["break_even_C_ms"] = text
    parts = [p for p in (
        _reason(low_eta & np.isinf(min_b), total, reason, reason),
        _reason(np.isinf(min_b) & ~low_eta, total,
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


# --- the public functions, one per quantity ---

def ring_factor(n_devices) -> float:
    """2(N−1)/N: the share of V each device sends in a ring all-reduce (1 at N = 2, towards 2)."""
    n = float(check_devices(n_devices))
    return 2.0 * (n - 1.0) / n


@_quiet
def saved_fraction(eta, n_devices=2):
    """The share of C that splitting saves before communication: 1 − 1/(2η) on two devices
    (0.375 at η = 0.8), 1 − 1/(Nη) on N; 0 or less when η ≤ 1/N."""
    check_inputs(eta=eta)
    return float_or_array(_saved(as_float_array(eta), float(check_devices(n_devices))))


@_quiet
def comm_ms(Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32"):
    """The communication in ms. Two devices (the article): H = Q·(ℓ + V/B), V/B = V / (B·1e6) ms for
    V bytes at B decimal GB/s. N devices, a ring all-reduce each: H_N = Q·[(N−1)·ℓ + 2(N−1)/N · V_w/B]."""
    check_inputs(Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    Q, latency, V, B = map(as_float_array, (Q, latency_ms, volume_bytes, bandwidth_GBps))
    return float_or_array(_comm(Q, latency, V, B, n, w))


@_quiet
def t_one_ms(S_ms, C_ms):
    """One device: T1 = S + C (ms)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms)
    return float_or_array(as_float_array(S_ms) + as_float_array(C_ms))


@_quiet
def t_two_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32"):
    """The split, no overlap (ms). Two devices (the article): T2 = S + C/(2η) + Q(ℓ + V/B).
    N devices: T_N = S + C/(Nη) + H_N (`comm_ms`)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    S, C, eta, Q, latency, V, B = map(as_float_array, (S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
    return float_or_array(S + C / (n * eta) + _comm(Q, latency, V, B, n, w))


@_quiet
def ideal_overlap_ms(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32"):
    """The perfect-overlap estimate (ms), the model's best case: S + max(C/(2η), H) on two devices,
    S + max(C/(Nη), H_N) on N. An estimate, not a bound of a real step: it assumes compute and
    communication run side by side without slowing each other (notebooks 09 and 10 test it)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    S, C, eta, Q, latency, V, B = map(as_float_array, (S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
    return float_or_array(S + np.maximum(C / (n * eta), _comm(Q, latency, V, B, n, w)))


@_quiet
def break_even_C_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32"):
    """Divisible compute at which the split takes as long as one device (ms); splitting pays above it.

    Two devices (the article): C* = Q(ℓ + V/B) / (1 − 1/(2η)). N devices: C* = H_N / (1 − 1/(Nη)).
    math.inf ("never") when η ≤ 1/N (0.5 on two): the parts then save no time at all.
    """
    check_inputs(eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    eta, Q, latency, V, B = map(as_float_array, (eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
    return float_or_array(_break_even(eta, _comm(Q, latency, V, B, n, w), n))


@_quiet
def transfer_window_ms(C_ms, eta, Q, latency_ms, n_devices=2):
    """The time each transfer may take after its startup (ms). Two devices (the article):
    D = C·(1 − 1/(2η))/Q − ℓ, and splitting pays when V/B < D. N devices: D_N = C·(1 − 1/(Nη))/Q − (N−1)ℓ,
    and splitting pays when 2(N−1)/N·V_w/B < D_N. Q = 0 gives math.inf (nothing to transfer)."""
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms)
    n = float(check_devices(n_devices))
    C, eta, Q, latency = map(as_float_array, (C_ms, eta, Q, latency_ms))
    window = C * _saved(eta, n) / np.where(Q > 0, Q, 1.0) - (n - 1.0) * latency
    return float_or_array(np.where(Q > 0, window, math.inf))


@_quiet
def min_bandwidth_GBps(C_ms, eta, Q, latency_ms, volume_bytes, n_devices=2, wire_dtype="fp32"):
    """Smallest effective bandwidth that makes splitting pay, in decimal GB/s.

    Two devices (the article): B_min = V/D with D = C·(1 − 1/(2η))/Q − ℓ (`transfer_window_ms`).
    N devices: B_min = 2(N−1)/N·V_w / (D_N·1e6). 0 when no bytes travel (or Q = 0) and the saving
    beats the startups; math.inf ("never") when D ≤ 0: the startups alone use up the compute saved,
    or η ≤ 1/N.
    """
    check_inputs(C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes)
    n, w = _ring(n_devices, wire_dtype)
    C, eta, Q, latency, V = map(as_float_array, (C_ms, eta, Q, latency_ms, volume_bytes))
    return float_or_array(_min_bandwidth(C, eta, Q, latency, V, n, w))


@_quiet
def min_eta(C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32"):
    """Smallest local efficiency that makes splitting pay (dimensionless).

    Two devices (the article): η_min = C / (2(C − H)). N devices: η_min = C / (N(C − H_N)).
    math.inf ("never") when C ≤ H. A value above 1 is impossible, since η ≤ 1.
    """
    check_inputs(C_ms=C_ms, Q=Q, latency_ms=latency_ms, volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    C, Q, latency, V, B = map(as_float_array, (C_ms, Q, latency_ms, volume_bytes, bandwidth_GBps))
    return float_or_array(_min_eta(C, _comm(Q, latency, V, B, n, w), n))


@dataclass(frozen=True)
class Budget:
    """Every figure of the budget for one set of inputs (floats, or arrays when an input was one).

    `t_two_ms` is the time of the split on `n_devices` (T2 on two, T_N on N) and `efficiency`
    speedup / N (time against resource count, not energy). `notes` maps a field name to the reason
    why it is "never" (math.inf) or impossible.
    """

    t_one_ms: float | np.ndarray
    t_two_ms: float | np.ndarray
    comm_ms: float | np.ndarray
    speedup: float | np.ndarray
    efficiency: float | np.ndarray
    break_even_C_ms: float | np.ndarray
    min_bandwidth_GBps: float | np.ndarray
    min_eta: float | np.ndarray
    ideal_overlap_ms: float | np.ndarray
    notes: dict = field(default_factory=dict)
    n_devices: int = 2

    def as_dict(self) -> dict:
        """The figures of RESULT_FIELDS as plain numbers (lists for arrays), and the notes; infinities stay math.inf."""
        out = {}
        for name in RESULT_FIELDS:
            value = getattr(self, name)
            out[name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["notes"] = dict(self.notes)
        return out


@_quiet
def evaluate(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps, n_devices=2, wire_dtype="fp32") -> Budget:
    """The whole budget in one call: T1 = S + C, T2 = S + C/(2η) + Q(ℓ + V/B) on two devices (T_N on
    N), speedup T1/T2, efficiency speedup/N, break-even C, minimum B and η, the perfect-overlap estimate; inputs
    may be numbers or arrays (broadcast together)."""
    check_inputs(S_ms=S_ms, C_ms=C_ms, eta=eta, Q=Q, latency_ms=latency_ms,
                 volume_bytes=volume_bytes, bandwidth_GBps=bandwidth_GBps)
    n, w = _ring(n_devices, wire_dtype)
    S, C, eta, Q, latency, V, B = map(as_float_array, (S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
    H = _comm(Q, latency, V, B, n, w)
    T1 = S + C
    TN = S + C / (n * eta) + H
    speedup = safe_divide(T1, TN, 1.0)  # no work at all: ratio 1
    min_b, min_e = _min_bandwidth(C, eta, Q, latency, V, n, w), _min_eta(C, H, n)
    values = {
        "t_one_ms": T1, "t_two_ms": TN, "comm_ms": H, "speedup": speedup, "efficiency": speedup / n,
        "break_even_C_ms": _break_even(eta, H, n), "min_bandwidth_GBps": min_b, "min_eta": min_e,
        "ideal_overlap_ms": S + np.maximum(C / (n * eta), H),
    }
    shape = np.broadcast_shapes(S.shape, C.shape, eta.shape, H.shape)
    values = {k: float_or_array(np.broadcast_to(v, shape)) for k, v in values.items()}
    return Budget(**values, notes=_notes(C, eta, Q, latency, H, min_b, min_e, int(n)), n_devices=int(n))


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


def verdict(budget: Budget) -> str:
    """One plain sentence on a scalar budget: does splitting (over its n_devices) pay, and by how much?
    LabInputError for an array budget (`check_scalar`)."""
    check_scalar(budget)
    t1, t2, be, N = budget.t_one_ms, budget.t_two_ms, budget.break_even_C_ms, budget.n_devices
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


def devices_table(params: dict, world_sizes=(2, 4, 8), wire_dtypes=("fp32", "bf16")) -> pd.DataFrame:
    """T_N, H_N, speedup, efficiency and break-even C for each N and wire dtype, the rest `params`."""
    rows = []
    for dtype in wire_dtypes:
        for n in world_sizes:
            b = evaluate(**params, n_devices=n, wire_dtype=dtype)
            rows.append({"N": n, "wire": wire_dtype_name(dtype), "ring factor 2(N-1)/N": ring_factor(n),
                         "H_N (ms)": b.comm_ms, "T_N (ms)": b.t_two_ms, "speedup": b.speedup,
                         "efficiency": b.efficiency, "break-even C (ms)": b.break_even_C_ms})
    return pd.DataFrame(rows)


def _change(values, ns, show) -> str:
    """The whole series in words, each value shown by `show`: "rises from a to b" or "falls from a
    to b" when it moves one way (ties at the shown figures count as no move), "stays at a" when it
    does not move, and "falls from a to m at N = 4, then rises to b at N = 8" when it turns."""
    shown = [show(v) for v in values]
    steps = []  # (direction, index of the step's end), consecutive steps of one direction merged
    for i in range(1, len(values)):
        way = "stays at" if shown[i] == shown[i - 1] else ("rises" if values[i] > values[i - 1] else "falls")
        if steps and steps[-1][0] == way:
            steps[-1] = (way, i)
        else:
            steps.append((way, i))
    moves = [s for s in steps if s[0] != "stays at"]
    if not moves:
        return f"stays at {shown[0]}"
    if len(moves) == 1 and len(steps) == 1:
        return f"{moves[0][0]} from {shown[0]} to {shown[-1]}"
    parts = []
    for k, (way, end) in enumerate(steps):
        if way == "stays at":
            parts.append(f"stays at {shown[end]} to N = {ns[end]}")
        else:
            parts.append(f"{way} {'from ' + shown[0] + ' ' if k == 0 else ''}to {shown[end]} at N = {ns[end]}")
    return ", then ".join(parts)


def devices_sentence(table: pd.DataFrame, wire_dtype="fp32") -> str:
    """How the efficiency and the break-even C change over the N of a `devices_table`, for one wire
    dtype, in one sentence built from the table's numbers: the whole series, a dip or a peak included."""
    wire = wire_dtype_name(wire_dtype)
    rows = table[table["wire"] == wire].sort_values("N")
    if rows.empty:
        raise LabInputError(f"wire_dtype={wire_dtype!r} is not in this table (it holds {sorted(set(table['wire']))})")
    first, last = rows.iloc[0], rows.iloc[-1]
    ns = [int(n) for n in rows["N"]]
    efficiency = _change(list(100 * rows["efficiency"]), ns, lambda x: f"{x:.0f}")
    even = _change(list(rows["break-even C (ms)"]), ns, lambda x: "never" if math.isinf(x) else f"{x:.3g} ms")
    return (f"With these inputs and {wire} on the wire, from N = {int(first['N'])} to N = {int(last['N'])} "
            f"the efficiency {efficiency} percent and the break-even C {even}.")
