"""Invariants of the time-budget model, checked on many generated inputs (hypothesis)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from labutils.model import budget as bm

times = st.floats(0.0, 1e3, allow_nan=False)
positive_times = st.floats(1e-3, 1e3)
etas = st.floats(0.01, 1.0)
counts = st.integers(0, 64)
volumes = st.floats(0.0, 1e10)
bandwidths = st.floats(0.01, 1e4)

inputs = st.fixed_dictionaries({"S_ms": times, "C_ms": times, "eta": etas, "Q": counts,
                                "latency_ms": st.floats(0.0, 10.0), "volume_bytes": volumes,
                                "bandwidth_GBps": bandwidths})
SETTINGS = settings(max_examples=300, deadline=None)


def _margin(a, b):
    return abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0)


@SETTINGS
@given(inputs)
def test_two_devices_win_exactly_when_C_exceeds_break_even(p):
    b = bm.evaluate(**p)
    be = b.break_even_C_ms
    assume(math.isinf(be) or _margin(p["C_ms"], be))
    assume(_margin(b.t_one_ms, b.t_two_ms))
    assert (b.t_two_ms < b.t_one_ms) == (p["C_ms"] > be)


@SETTINGS
@given(inputs, bandwidths, bandwidths)
def test_speedup_never_falls_as_bandwidth_rises(p, b1, b2):
    low, high = sorted((b1, b2))
    slow = bm.evaluate(**{**p, "bandwidth_GBps": low}).speedup
    fast = bm.evaluate(**{**p, "bandwidth_GBps": high}).speedup
    assert fast >= slow * (1 - 1e-12)


@SETTINGS
@given(inputs, etas, etas)
def test_speedup_never_falls_as_efficiency_rises(p, e1, e2):
    low, high = sorted((e1, e2))
    assert bm.evaluate(**{**p, "eta": high}).speedup >= bm.evaluate(**{**p, "eta": low}).speedup * (1 - 1e-12)


@SETTINGS
@given(inputs)
def test_ideal_overlap_lies_between_the_larger_block_and_T2(p):
    b = bm.evaluate(**p)
    assert b.ideal_overlap_ms <= b.t_two_ms * (1 + 1e-12)
    assert b.ideal_overlap_ms >= p["S_ms"] + b.comm_ms * (1 - 1e-12)
    assert b.ideal_overlap_ms >= p["S_ms"] + p["C_ms"] / (2 * p["eta"]) * (1 - 1e-12)


@SETTINGS
@given(inputs)
def test_efficiency_is_half_the_speedup_and_speedup_below_two(p):
    b = bm.evaluate(**p)
    assert b.efficiency == pytest.approx(b.speedup / 2)
    assert 0 <= b.speedup <= 2.0 + 1e-12  # even a perfect split of everything is at most 2x


# inputs where splitting can pay at some finite bandwidth, so little is filtered out
payable = st.fixed_dictionaries({"S_ms": times, "C_ms": st.floats(1.0, 1e3), "eta": st.floats(0.55, 1.0),
                                 "Q": st.integers(1, 64), "latency_ms": st.floats(0.0, 0.01),
                                 "volume_bytes": st.floats(1e3, 1e9), "bandwidth_GBps": bandwidths})


@SETTINGS
@given(payable)
def test_minimum_bandwidth_makes_the_times_equal(p):
    need = bm.evaluate(**p).min_bandwidth_GBps
    assume(math.isfinite(need) and 1e-6 < need < 1e9 and p["Q"] > 0 and p["volume_bytes"] > 0)
    at = bm.evaluate(**{**p, "bandwidth_GBps": need})
    assert at.t_two_ms == pytest.approx(at.t_one_ms, rel=1e-9, abs=1e-9)
    assert bm.evaluate(**{**p, "bandwidth_GBps": need * 1.01}).speedup >= at.speedup


@SETTINGS
@given(inputs)
def test_minimum_eta_makes_the_times_equal(p):
    need = bm.evaluate(**p).min_eta
    assume(math.isfinite(need) and need <= 1.0)
    at = bm.evaluate(**{**p, "eta": need})
    assert at.t_two_ms == pytest.approx(at.t_one_ms, rel=1e-9, abs=1e-9)
    assert need >= 0.5


@SETTINGS
@given(inputs)
def test_never_answers_come_with_a_reason(p):
    b = bm.evaluate(**p)
    for key in ("break_even_C_ms", "min_bandwidth_GBps", "min_eta"):
        value = getattr(b, key)
        assert value >= 0 and not math.isnan(value)
        if math.isinf(value):
            assert b.notes[key].startswith("never")
    assert (math.isinf(b.break_even_C_ms)) == (p["eta"] <= 0.5)


@SETTINGS
@given(inputs)
def test_serial_time_cancels_from_break_even_but_dilutes_speedup(p):
    b = bm.evaluate(**p)
    more = bm.evaluate(**{**p, "S_ms": p["S_ms"] + 100.0})
    assert more.break_even_C_ms == b.break_even_C_ms
    assert abs(more.speedup - 1) <= abs(b.speedup - 1) + 1e-12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 1e4), min_size=1, max_size=20), inputs)
def test_vectorised_call_equals_elementwise_calls(bandwidth, p):
    arr = bm.evaluate(**{**p, "bandwidth_GBps": np.array(bandwidth)})
    for i, gbps in enumerate(bandwidth):
        one = bm.evaluate(**{**p, "bandwidth_GBps": gbps})
        for key in bm.RESULT_FIELDS:
            assert getattr(arr, key)[i] == pytest.approx(getattr(one, key), nan_ok=False)


# --- N devices ---

def _same(a, b) -> bool:
    """Equal to the last bit (inf == inf; NaN never appears here)."""
    return a == b or (math.isinf(a) and math.isinf(b) and a == b)


@SETTINGS
@given(inputs, st.integers(2, 64))
def test_the_n_device_formula(p, n):
    b = bm.evaluate(**p, n_devices=n)
    H = p["Q"] * ((n - 1) * p["latency_ms"] + 2 * (n - 1) / n * p["volume_bytes"] / (p["bandwidth_GBps"] * 1e6))
    assert b.comm_ms == pytest.approx(H, rel=1e-12, abs=1e-12)
    assert b.t_two_ms == pytest.approx(p["S_ms"] + p["C_ms"] / (n * p["eta"]) + H, rel=1e-12, abs=1e-12)
    assert b.efficiency == pytest.approx(b.speedup / n)
    assert b.speedup <= n * (1 + 1e-12)
    assert math.isinf(b.break_even_C_ms) == (p["eta"] <= 1 / n)


@SETTINGS
@given(inputs, st.integers(2, 16))
def test_bf16_on_the_wire_is_half_the_bytes(p, n):
    half = bm.evaluate(**{**p, "volume_bytes": p["volume_bytes"] / 2}, n_devices=n, wire_dtype="fp32")
    bf16 = bm.evaluate(**p, n_devices=n, wire_dtype="bf16")
    for key in bm.RESULT_FIELDS:
        assert _same(getattr(bf16, key), getattr(half, key)), key
    assert bm.evaluate(**p, n_devices=n, wire_dtype="float16").comm_ms == bf16.comm_ms


@SETTINGS
@given(inputs, st.integers(2, 16))
def test_splitting_pays_exactly_above_the_n_device_break_even(p, n):
    b = bm.evaluate(**p, n_devices=n)
    be = b.break_even_C_ms
    if (math.isinf(be) or _margin(p["C_ms"], be)) and _margin(b.t_one_ms, b.t_two_ms):
        assert (b.t_two_ms < b.t_one_ms) == (p["C_ms"] > be)


@SETTINGS
@given(inputs, st.integers(2, 16), st.sampled_from(["fp32", "bf16"]))
def test_single_functions_equal_the_budget_on_n_devices(p, n, wire):
    b = bm.evaluate(**p, n_devices=n, wire_dtype=wire)
    link = {k: p[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    nw = {"n_devices": n, "wire_dtype": wire}
    assert bm.comm_ms(**link, **nw) == b.comm_ms
    assert bm.t_two_ms(**p, **nw) == b.t_two_ms
    assert bm.ideal_overlap_ms(**p, **nw) == b.ideal_overlap_ms
    assert _same(bm.break_even_C_ms(p["eta"], **link, **nw), b.break_even_C_ms)
    assert _same(bm.min_bandwidth_GBps(p["C_ms"], p["eta"], p["Q"], p["latency_ms"], p["volume_bytes"], **nw),
                 b.min_bandwidth_GBps)
    assert _same(bm.min_eta(p["C_ms"], **link, **nw), b.min_eta)
