"""The budget's break-even as a hardware ratio: R/B, the critical intensity I*, the critical hidden size."""

import math

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
