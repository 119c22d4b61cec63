"""The budget's break-even as a hardware ratio (notebook 08): with the startups left out,
splitting pays when the work per byte on the wire, F/V_w (FLOP/byte), exceeds
Q·2(N−1)/N / (1 − 1/(Nη)) times the ratio R/B of the compute rate to the link bandwidth. For the
lab's MLP block (F = 4·batch·hidden·ffn, V = batch·hidden values) that is a critical hidden size.
A pure model, as labutils.model.budget.
"""

from __future__ import annotations

import math

import numpy as np

from labutils.core.inputs import as_float_array, check_range, float_or_array, safe_divide
from labutils.model.budget import WIRE_DTYPES, check_devices, check_inputs, ring_factor, saved_fraction, wire_dtype_name


def hardware_ratio(compute_TFLOPs, bandwidth_GBps):
    """R/B in FLOP per byte: compute rate (TFLOP/s, 1e12 FLOP/s) over link bandwidth (decimal GB/s)."""
    check_range("compute_TFLOPs", compute_TFLOPs, low=0.0, low_open=True, unit="TFLOP/s")
    check_inputs(bandwidth_GBps=bandwidth_GBps)
    return float_or_array(as_float_array(compute_TFLOPs) * 1e12 / (as_float_array(bandwidth_GBps) * 1e9))


def critical_intensity(compute_TFLOPs, bandwidth_GBps, eta=0.8, N=2, Q=1):
    """FLOP per byte on the wire above which splitting pays (startups left out), in FLOP/byte:

        F/V_w > I* = Q · 2(N−1)/N / (1 − 1/(Nη)) · R/B

    from C·(1 − 1/(Nη)) > Q·2(N−1)/N·V_w/B with C = F/R. math.inf ("never") when η ≤ 1/N.
    """
    n = check_devices(N, "N")
    check_inputs(eta=eta, Q=Q)
    saved = saved_fraction(eta, n)
    out = safe_divide(as_float_array(Q) * ring_factor(n), saved) * hardware_ratio(compute_TFLOPs, bandwidth_GBps)
    out = np.where(saved > 0, out, math.inf)  # inf x 0 is not a number: "never" stays inf
    return float_or_array(out)


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
    if batch_tokens is None or not np.any(as_float_array(latency_ms) > 0):
        return float_or_array(as_float_array(intensity) * w / (4.0 * as_float_array(ffn_ratio)))
    check_range("batch_tokens", batch_tokens, low=0.0, low_open=True, unit="tokens")
    n = check_devices(N, "N")
    saved = saved_fraction(eta, n)
    R, B = as_float_array(compute_TFLOPs) * 1e9, as_float_array(bandwidth_GBps) * 1e6  # FLOP per ms, bytes per ms
    a = 4.0 * as_float_array(batch_tokens) * as_float_array(ffn_ratio) * saved / R
    c = as_float_array(Q) * ring_factor(n) * as_float_array(batch_tokens) * w / B
    d = as_float_array(Q) * (n - 1.0) * as_float_array(latency_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = safe_divide(c + np.sqrt(c * c + 4.0 * a * d), 2.0 * a, where=saved > 0)
    return float_or_array(h)
