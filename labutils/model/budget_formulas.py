"""The formulas of labutils.model.budget, unchecked (inputs already validated there), for 2 and N devices.

budget.py checks every input and names it in a LabInputError, then calls these; the names and
units are those of labutils.model.budget's module docstring (ms, bytes, decimal GB/s). A leaf: it imports
only the array helpers and the input error.
"""

from __future__ import annotations

import math

import numpy as np

from labutils.core.arrays import as_float_array, safe_divide
from labutils.core.inputs import LabInputError


def _comm(Q, latency_ms, volume_bytes, bandwidth_GBps):
    return as_float_array(Q) * (as_float_array(latency_ms)
                                + as_float_array(volume_bytes) / (as_float_array(bandwidth_GBps) * 1e6))


def _saved_fraction(eta):
    return 1.0 - 1.0 / (2.0 * as_float_array(eta))


def _break_even(eta, H):
    frac = _saved_fraction(eta)
    return safe_divide(H, frac)


def _min_bandwidth(C_ms, eta, Q, latency_ms, volume_bytes):
    saving = as_float_array(C_ms) * _saved_fraction(eta)
    startup = as_float_array(Q) * as_float_array(latency_ms)
    possible = saving > startup
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        window = safe_divide(saving - startup, Q)
        need = np.where(as_float_array(volume_bytes) > 0, as_float_array(volume_bytes) / (window * 1e6), 0.0)
    return np.where(possible, need, math.inf)


def _min_eta(C_ms, H):
    return _min_eta_n(C_ms, H, 2.0)


WIRE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per value on the wire; V is counted in fp32


_WIRE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def wire_dtype_name(wire_dtype) -> str:
    """"fp32", "bf16" or "fp16" (torch names accepted); LabInputError naming the allowed values."""
    name = _WIRE_ALIASES.get(str(wire_dtype).lower(), str(wire_dtype).lower())
    if name not in WIRE_DTYPES:
        raise LabInputError(f"wire_dtype={wire_dtype!r} is not one of: {', '.join(WIRE_DTYPES)}")
    return name


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
    return as_float_array(Q) * ((n - 1.0) * as_float_array(latency_ms)
                                + factor * (as_float_array(volume_bytes) * scale)
                                / (as_float_array(bandwidth_GBps) * 1e6))


def saved_fraction_n(eta, n: float):
    """1 - 1/(N eta): the share of C that splitting over N devices saves (unchecked)."""
    return 1.0 - 1.0 / (n * as_float_array(eta))


def _break_even_n(eta, H, n: float):
    frac = saved_fraction_n(eta, n)
    return safe_divide(H, frac)


def _min_bandwidth_n(C_ms, eta, Q, latency_ms, volume_bytes, n: float, scale: float):
    saving = as_float_array(C_ms) * saved_fraction_n(eta, n)
    startup = as_float_array(Q) * ((n - 1.0) * as_float_array(latency_ms))
    possible = saving > startup
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        window = safe_divide(saving - startup, Q)
        sent = 2.0 * (n - 1.0) / n * (as_float_array(volume_bytes) * scale)
        need = np.where(as_float_array(volume_bytes) > 0, sent / (window * 1e6), 0.0)
    return np.where(possible, need, math.inf)


def _min_eta_n(C_ms, H, n: float):
    """C / (n (C - H)) written as 1 / (n (1 - H/C)), so that C near 1e308 does not overflow to 0."""
    C, H = np.broadcast_arrays(as_float_array(C_ms), as_float_array(H))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(C > H, 1.0 / (n * (1.0 - H / np.where(C > H, C, 1.0))), math.inf)
