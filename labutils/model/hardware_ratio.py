"""The budget's break-even as a hardware ratio (notebook 08), in both regimes of a layer's time.

A layer's time on one device is the longer of its arithmetic and its memory traffic (the roofline):

    C = max(F/R, W/M)

F FLOP at a compute rate R (TFLOP/s), W bytes read from the device's memory (HBM) at a memory
bandwidth M (decimal GB/s). The lab's MLP block (hidden h, ffn r·h, b tokens) does F = 4·b·r·h²
FLOP and reads its weights once per step, W = 2·r·h²·w_p bytes (w_p bytes per weight: 2 in bf16);
its activations, about 2·b·(r + 1)·h·w_p bytes, are left out (they are small while b ≪ h). Each
weight does 2 FLOP per token, so F/R = W/M at the **turning point**

    b* = R·w_p / (2M) tokens                       (`turning_tokens`)

below which the block is memory-bound (decoding a few tokens), above which it is compute-bound
(training, prefill). b* depends on neither h nor N: a shard over N devices does F/N FLOP and reads
W/N bytes, so splitting divides the memory-bound time too. That is why tensor parallelism cuts
the latency of decoding: at h = 8192 and 8 tokens on an A100 80GB, F/R ≈ 27.5 µs but reading the
16·h² bytes of bf16 weights takes ≈ 0.53 ms, and each of two devices reads half of them.

Compute-bound, with the startups left out, splitting pays when the work per byte on the wire,
F/V_w (FLOP/byte), exceeds I* = Q·2(N−1)/N / (1 − 1/(Nη)) · R/B, R/B the ratio of the compute rate
to the link bandwidth; for the MLP block (V = b·h values, F/V_w = 4·r·h/w) that is a critical
hidden size h* = I*·w/(4r), the batch cancelled. Memory-bound it does not cancel: C grows with h²
whatever b, so a few tokens carry a large C and the break-even hidden size falls (`critical_hidden`
with `memory_GBps` and `batch_tokens`).

`labutils.model.sizing.break_even_hidden` (notebook 09's H*) solves the same inequality with F/R
alone, η = 1, fp32 on the wire and the measured startup α of the whole all-reduce: at N = 2 it is
`critical_hidden(R, B, eta=1, N=2, Q=1, wire_dtype="fp32", batch_tokens=b, latency_ms=α)`; at N > 2
the two differ, since this module scales the two-device startup ℓ by the ring's N − 1 and 09's α is
measured on its own N. Expect 08's default h* (η = 0.8, bf16) and 09's H* to differ for these reasons.

The GPU figures (`GPUS`) are vendor peaks from NVIDIA's datasheets: dense BF16 tensor-core TFLOP/s
(the datasheets' 624 and 1,979 are with sparsity) and HBM bandwidth (A100 80GB SXM 2,039 GB/s, its
PCIe card 1,935; H100 SXM 3.35 TB/s, its PCIe card 2 TB/s; H200 SXM 4.8 TB/s). Achieved rates are
lower. A pure model, as labutils.model.budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labutils.core.inputs import LabInputError, as_float_array, check_range, float_or_array, safe_divide
from labutils.model.budget import (
    WIRE_DTYPES,
    Budget,
    check_devices,
    check_inputs,
    check_scalar,
    ring_factor,
    saved_fraction,
    wire_dtype_name,
)


@dataclass(frozen=True)
class Gpu:
    """One device's vendor peaks: dense BF16 compute (TFLOP/s) and memory bandwidth (decimal GB/s)."""

    name: str
    compute_TFLOPs: float
    memory_GBps: float


GPUS = {g.name: g for g in (Gpu("A100 80GB SXM", 312.0, 2039.0), Gpu("H100 SXM", 989.0, 3350.0),
                            Gpu("H200 SXM", 989.0, 4800.0))}


MAX_RATE = 1e9  # TFLOP/s or GB/s: a million times any device's; 1e300 would overflow to inf


def _check_rates(compute_TFLOPs, memory_GBps=None) -> None:
    check_range("compute_TFLOPs", compute_TFLOPs, low=0.0, low_open=True, high=MAX_RATE, unit="TFLOP/s")
    if memory_GBps is not None:
        check_range("memory_GBps", memory_GBps, low=0.0, low_open=True, high=MAX_RATE, unit="GB/s (decimal)")


def _check_block(hidden, ffn_ratio, batch_tokens=1.0) -> None:
    """The MLP block's sizes: positive, and small enough that 4·b·r·h² stays a finite number."""
    check_range("batch_tokens", batch_tokens, low=0.0, low_open=True, high=1e12, unit="tokens")
    check_range("hidden", hidden, low=0.0, low_open=True, high=1e7)
    check_range("ffn_ratio", ffn_ratio, low=0.0, low_open=True, high=1e3)


def hardware_ratio(compute_TFLOPs, bandwidth_GBps):
    """R/B in FLOP per byte: compute rate (TFLOP/s, 1e12 FLOP/s) over link bandwidth (decimal GB/s)."""
    _check_rates(compute_TFLOPs)
    check_inputs(bandwidth_GBps=bandwidth_GBps)
    check_range("bandwidth_GBps", bandwidth_GBps, high=MAX_RATE, unit="GB/s (decimal)")
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


def layer_ms(flops, bytes_read, compute_TFLOPs, memory_GBps=None):
    """C = max(F/R, W/M) in ms: `flops` at R TFLOP/s (F / (R·1e9) ms) or `bytes_read` from memory at
    M decimal GB/s (W / (M·1e6) ms), whichever takes longer. Without `memory_GBps`, F/R alone (the
    compute-bound assumption)."""
    _check_rates(compute_TFLOPs, memory_GBps)
    check_range("flops", flops, low=0.0, unit="FLOP")
    check_range("bytes_read", bytes_read, low=0.0, unit="bytes")
    compute = as_float_array(flops) / (as_float_array(compute_TFLOPs) * 1e9)
    if memory_GBps is None:
        return float_or_array(compute)
    return float_or_array(np.maximum(compute, as_float_array(bytes_read) / (as_float_array(memory_GBps) * 1e6)))


def mlp_flops(batch_tokens, hidden, ffn_ratio=4.0):
    """F = 4·b·r·h² FLOP: the MLP block's two linears (h -> r·h -> h), 2 FLOP per multiply-add."""
    _check_block(hidden, ffn_ratio, batch_tokens)
    return 4.0 * as_float_array(batch_tokens) * as_float_array(ffn_ratio) * as_float_array(hidden) ** 2


def mlp_weight_bytes(hidden, ffn_ratio=4.0, weight_dtype="bf16"):
    """W = 2·r·h²·w_p bytes: the block's two weight matrices, read once per step (16·h² in bf16 at r = 4)."""
    _check_block(hidden, ffn_ratio)
    w_p = WIRE_DTYPES[wire_dtype_name(weight_dtype)]
    return 2.0 * as_float_array(ffn_ratio) * as_float_array(hidden) ** 2 * w_p


def mlp_ms(batch_tokens, hidden, compute_TFLOPs, memory_GBps=None, ffn_ratio=4.0, weight_dtype="bf16"):
    """One device's time for the MLP block (ms): max(F/R, W/M) (`layer_ms`), F/R alone without `memory_GBps`."""
    return layer_ms(mlp_flops(batch_tokens, hidden, ffn_ratio), mlp_weight_bytes(hidden, ffn_ratio, weight_dtype),
                    compute_TFLOPs, memory_GBps)


def turning_tokens(compute_TFLOPs, memory_GBps, weight_dtype="bf16"):
    """b* = R·w_p / (2M) tokens per step: below it a layer that reads each weight once and does 2 FLOP
    per weight and token is memory-bound, above it compute-bound (153 tokens on an A100 80GB in bf16)."""
    if memory_GBps is None:
        raise LabInputError("memory_GBps=None: give the memory bandwidth in GB/s (decimal)")
    _check_rates(compute_TFLOPs, memory_GBps)
    w_p = WIRE_DTYPES[wire_dtype_name(weight_dtype)]
    return float_or_array(as_float_array(compute_TFLOPs) * 1e12 * w_p / (2.0 * as_float_array(memory_GBps) * 1e9))


def regime_sentence(batch_tokens, compute_ms, memory_ms, turning) -> str:
    """Which regime holds, from the two times of `layer_ms` (F/R and W/M, ms) and the turning point b*."""
    numbers = (f"reading the weights takes {memory_ms:.3g} ms, the arithmetic F/R {compute_ms:.3g} ms "
               f"(the turning point is b* = {turning:.0f} tokens)")
    if memory_ms > compute_ms:
        return f"At {batch_tokens:g} tokens the block is memory-bound: {numbers}."
    if memory_ms < compute_ms:
        return f"At {batch_tokens:g} tokens the block is compute-bound: {numbers}."
    return f"At {batch_tokens:g} tokens the block is balanced, memory and arithmetic alike: {numbers}."


def regimes_verdict(compute_only: Budget, roofline: Budget) -> str:
    """Does the split pay when C is counted as F/R alone, and when as max(F/R, W/M)? Two scalar
    budgets (`labutils.model.budget.evaluate`) in, one sentence out, saying whether the two counts agree."""
    check_scalar(compute_only, "regimes_verdict")
    check_scalar(roofline, "regimes_verdict")

    def word(b: Budget) -> str:
        return "pays" if b.t_two_ms < b.t_one_ms else "breaks even" if b.t_two_ms == b.t_one_ms else "loses"

    def times(b: Budget) -> str:
        return f"{b.t_two_ms:.3g} ms on {b.n_devices} devices against {b.t_one_ms:.3g} ms on one"

    said = (f"With C = F/R alone the split {word(compute_only)} ({times(compute_only)}); with "
            f"C = max(F/R, W/M) it {word(roofline)} ({times(roofline)})")
    if word(compute_only) == word(roofline):
        return f"{said}: both counts agree here."
    return f"{said}: counting the arithmetic alone gets the answer wrong here."


def critical_hidden(compute_TFLOPs, bandwidth_GBps, eta=0.8, N=2, Q=1, wire_dtype="bf16", ffn_ratio=4.0,
                    batch_tokens=None, latency_ms=0.0, memory_GBps=None, weight_dtype="bf16"):
    """The hidden size above which splitting the lab's MLP block over N devices pays.

    The block does F = 4·b·h·(r·h) FLOP (two linears, r = ffn/hidden) and all-reduces V = b·h
    values, V_w = b·h·w bytes in the wire dtype, so F/V_w = 4·r·h/w and, compute-bound with the
    startups left out,

        h* = I* · w / (4r)          (the batch b cancels; I* from critical_intensity)

    With `batch_tokens` b and a startup ℓ (ms), C(h)·(1 − 1/(Nη)) > Q((N−1)ℓ + 2(N−1)/N·b·h·w/B)
    is a quadratic a·h² − c·h − d > 0 with C(h) = k·h², c = Q·2(N−1)/N·b·w/B, d = Q(N−1)ℓ (R, B, M per
    ms), a = k·(1 − 1/(Nη)), and h* = (c + √(c² + 4ad)) / (2a). k = 4·b·r/R counts the arithmetic
    alone; with `memory_GBps` M, k = max(4·b·r/R, 2·r·w_p/M) counts the weights' reads too (C =
    max(F/R, W/M), `layer_ms`), which needs `batch_tokens`. math.inf ("never") when η ≤ 1/N.
    The module's docstring says how this differs from labutils.model.sizing.break_even_hidden.
    """
    w = WIRE_DTYPES[wire_dtype_name(wire_dtype)]
    w_p = WIRE_DTYPES[wire_dtype_name(weight_dtype)]
    check_range("ffn_ratio", ffn_ratio, low=0.0, low_open=True, high=1e3)
    check_inputs(latency_ms=latency_ms)
    _check_rates(compute_TFLOPs, memory_GBps)
    intensity = critical_intensity(compute_TFLOPs, bandwidth_GBps, eta, N, Q)
    if memory_GBps is not None and batch_tokens is None:
        raise LabInputError("memory_GBps needs batch_tokens: the memory-bound time does not cancel the batch")
    if batch_tokens is None or (memory_GBps is None and not np.any(as_float_array(latency_ms) > 0)):
        return float_or_array(as_float_array(intensity) * w / (4.0 * as_float_array(ffn_ratio)))
    check_range("batch_tokens", batch_tokens, low=0.0, low_open=True, unit="tokens")
    n = check_devices(N, "N")
    saved = saved_fraction(eta, n)
    R, B = as_float_array(compute_TFLOPs) * 1e9, as_float_array(bandwidth_GBps) * 1e6  # FLOP per ms, bytes per ms
    r, b = as_float_array(ffn_ratio), as_float_array(batch_tokens)
    k = 4.0 * b * r / R
    if memory_GBps is not None:
        k = np.maximum(k, 2.0 * r * w_p / (as_float_array(memory_GBps) * 1e6))
    a = k * saved
    c = as_float_array(Q) * ring_factor(n) * b * w / B
    d = as_float_array(Q) * (n - 1.0) * as_float_array(latency_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = safe_divide(c + np.sqrt(c * c + 4.0 * a * d), 2.0 * a, where=saved > 0)
    return float_or_array(h)
