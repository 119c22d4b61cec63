"""The budget's break-even as a hardware ratio: R/B, the critical intensity I*, the critical hidden size."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labutils.core.inputs import LabInputError
from labutils.model import budget as bm
from labutils.model import hardware_ratio


def test_critical_intensity_and_hidden_size():
    ratio = hardware_ratio.hardware_ratio(312.0, 24.0)  # 312e12 FLOP/s over 24e9 B/s
    assert ratio == pytest.approx(13000.0)
    assert hardware_ratio.critical_intensity(312.0, 24.0, eta=0.8, N=2, Q=1) == pytest.approx(13000 / 0.375)
    h = hardware_ratio.critical_hidden(312.0, 24.0, eta=0.8, N=2, Q=1, wire_dtype="bf16")
    assert h == pytest.approx(13000 / 0.375 * 2 / 16)
    assert hardware_ratio.critical_hidden(312.0, 24.0, wire_dtype="fp32") == pytest.approx(2 * h)
    assert math.isinf(hardware_ratio.critical_hidden(312.0, 24.0, eta=0.5))
    assert (hardware_ratio.critical_hidden(312.0, 24.0, N=4, eta=0.8)
            == pytest.approx(13000 * 1.5 / (1 - 1 / 3.2) * 2 / 16))


def test_bad_N_is_named_N():
    with pytest.raises(LabInputError, match="N=1 "):
        hardware_ratio.critical_intensity(312.0, 24.0, N=1)


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 2000.0), st.floats(1.0, 1000.0), st.floats(0.55, 1.0), st.integers(2, 8),
       st.integers(1, 8), st.sampled_from(["fp32", "bf16"]), st.floats(1.0, 4096.0), st.floats(0.0, 0.2))
def test_at_the_critical_hidden_size_the_budget_breaks_even(tflops, gbps, eta, n, q, wire, batch, latency):
    """Build the MLP block's C and V at h* and feed them to the budget: T_N == T1 there."""
    h = hardware_ratio.critical_hidden(tflops, gbps, eta, n, q, wire, 4.0, batch_tokens=batch, latency_ms=latency)
    C_ms = 4 * batch * h * 4 * h / (tflops * 1e9)
    V = batch * h * 4  # fp32-counted values; the wire dtype resizes them
    b = bm.evaluate(0.0, C_ms, eta, q, latency, V, gbps, n_devices=n, wire_dtype=wire)
    assert b.t_two_ms == pytest.approx(b.t_one_ms, rel=1e-7)
    below = bm.evaluate(0.0, C_ms * 0.81, eta, q, latency, V * 0.9, gbps, n_devices=n, wire_dtype=wire)
    assert below.t_two_ms > below.t_one_ms  # a smaller hidden size (0.9 h*) loses


# --- both regimes: C = max(F/R, W/M) ---

A100 = hardware_ratio.GPUS["A100 80GB SXM"]


def test_the_vendor_figures():
    assert {g.name: (g.compute_TFLOPs, g.memory_GBps) for g in hardware_ratio.GPUS.values()} == {
        "A100 80GB SXM": (312.0, 2039.0), "H100 SXM": (989.0, 3350.0), "H200 SXM": (989.0, 4800.0)}


def test_decoding_eight_tokens_at_hidden_8192_is_memory_bound():
    """The issue's case: F/R is about 27 us, reading 16 h^2 bytes of bf16 weights about 0.5 ms."""
    F, W = hardware_ratio.mlp_flops(8, 8192), hardware_ratio.mlp_weight_bytes(8192)
    assert F == 16 * 8 * 8192**2 and W == 16 * 8192**2
    assert hardware_ratio.layer_ms(F, W, 312.0) == pytest.approx(0.027532, rel=1e-4)  # F/R alone
    assert hardware_ratio.layer_ms(F, W, 312.0, 2039.0) == pytest.approx(0.526602, rel=1e-5)  # W/M wins
    assert hardware_ratio.mlp_ms(8, 8192, 312.0, 2039.0) == hardware_ratio.layer_ms(F, W, 312.0, 2039.0)
    assert hardware_ratio.mlp_ms(4096, 8192, 312.0, 2039.0) == pytest.approx(4096 / 8 * 0.027532, rel=1e-4)
    assert hardware_ratio.mlp_weight_bytes(8192, weight_dtype="fp32") == 2 * W


def test_the_turning_point_is_where_both_terms_meet():
    assert hardware_ratio.turning_tokens(312.0, 2039.0) == pytest.approx(153.016, rel=1e-5)
    assert hardware_ratio.turning_tokens(989.0, 3350.0) == pytest.approx(295.224, rel=1e-5)
    assert hardware_ratio.turning_tokens(989.0, 4800.0) == pytest.approx(206.042, rel=1e-5)
    b = hardware_ratio.turning_tokens(312.0, 2039.0)
    F, W = hardware_ratio.mlp_flops(b, 4096), hardware_ratio.mlp_weight_bytes(4096)
    assert F / 312e9 == pytest.approx(W / 2039e6)  # F/R == W/M at b*, whatever the hidden size


def test_regime_sentence_both_ways_and_the_tie():
    assert "memory-bound" in hardware_ratio.regime_sentence(8, 0.0275, 0.527, 153)
    assert "compute-bound" in hardware_ratio.regime_sentence(4096, 14.1, 0.527, 153)
    assert "balanced" in hardware_ratio.regime_sentence(153, 0.5, 0.5, 153)
    assert "0.527 ms" in hardware_ratio.regime_sentence(8, 0.0275, 0.527, 153)


def _split(C_ms, hidden=8192):
    """Two A100s over NVLink 3 (230 GB/s), one all-reduce of 8 tokens x hidden values in bf16."""
    return bm.evaluate(0.0, C_ms, 0.8, 1, 0.03, 8 * hidden * 4, 230.0, wire_dtype="bf16")


def test_regimes_verdict_from_the_numbers():
    f_over_r = hardware_ratio.mlp_ms(8, 8192, 312.0)
    roofline = hardware_ratio.mlp_ms(8, 8192, 312.0, 2039.0)
    wrong = hardware_ratio.regimes_verdict(_split(f_over_r), _split(roofline))
    assert "F/R alone the split loses" in wrong and "W/M) it pays" in wrong and "gets the answer wrong" in wrong
    assert "both counts agree" in hardware_ratio.regimes_verdict(_split(20.0), _split(20.0))  # both pay
    agree_lose = hardware_ratio.regimes_verdict(_split(0.01), _split(0.02))
    assert "loses" in agree_lose and "pays" not in agree_lose and "agree" in agree_lose
    even = bm.evaluate(0.0, 0.0, 0.8, 0, 0.0, 0.0, 230.0)  # nothing to split or send: T2 == T1
    assert "breaks even" in hardware_ratio.regimes_verdict(even, _split(20.0))
    with pytest.raises(LabInputError, match="arrays"):
        hardware_ratio.regimes_verdict(_split(np.array([1.0, 2.0])), _split(1.0))


def test_the_memory_bound_break_even_hidden_size_is_smaller_at_few_tokens():
    args = (312.0, 230.0, 0.8, 2, 1, "bf16", 4.0)
    compute_only = hardware_ratio.critical_hidden(*args, batch_tokens=8, latency_ms=0.03)
    roofline = hardware_ratio.critical_hidden(*args, batch_tokens=8, latency_ms=0.03, memory_GBps=2039.0)
    assert roofline < compute_only / 4
    for h in (roofline, compute_only):  # each is where its own C(h) breaks even
        memory = None if h == compute_only else 2039.0
        b = _split(hardware_ratio.mlp_ms(8, h, 312.0, memory), hidden=h)
        assert b.t_two_ms == pytest.approx(b.t_one_ms, rel=1e-9)
    # far above the turning point the memory term is hidden: the same h* as F/R alone
    big = dict(batch_tokens=8192, latency_ms=0.03)
    assert (hardware_ratio.critical_hidden(*args, **big, memory_GBps=2039.0)
            == pytest.approx(hardware_ratio.critical_hidden(*args, **big)))
    with pytest.raises(LabInputError, match="memory_GBps needs batch_tokens"):
        hardware_ratio.critical_hidden(312.0, 230.0, memory_GBps=2039.0)
    with pytest.raises(LabInputError, match="memory_GBps=0"):
        hardware_ratio.critical_hidden(312.0, 230.0, batch_tokens=8, memory_GBps=0.0)


def test_sizing_break_even_hidden_is_the_two_device_case_at_eta_one_in_fp32():
    """09's H* (sizing.break_even_hidden) and 08's h* agree at N = 2, eta = 1, fp32, l = alpha."""
    from labutils.model import sizing

    rates = sizing.Rates(flops_per_s=312e12, alpha_us=30.0, busbw_GBps=230.0, memory_bytes=2**34)
    ours = hardware_ratio.critical_hidden(312.0, 230.0, eta=1.0, N=2, Q=1, wire_dtype="fp32",
                                          batch_tokens=64, latency_ms=0.03)
    assert sizing.break_even_hidden(64, rates, nproc=2) == pytest.approx(ours, rel=1e-12)
    # 08's defaults (eta = 0.8, bf16) move it, and at N = 4 the startups are counted differently
    assert hardware_ratio.critical_hidden(312.0, 230.0, batch_tokens=64, latency_ms=0.03) != pytest.approx(ours)
    four = hardware_ratio.critical_hidden(312.0, 230.0, 1.0, 4, 1, "fp32", batch_tokens=64, latency_ms=0.03)
    assert sizing.break_even_hidden(64, rates, nproc=4) != pytest.approx(four)
