"""The budget on N devices: exactly the article's model at N = 2, the ring's bytes and startups,
the wire dtype, the break-even as a hardware ratio, and `budget --N --wire-dtype` on the command line."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labutils.cli import main
from labutils.core.inputs import LabInputError
from labutils.model import budget as bm
from labutils.model import hardware_ratio

times = st.floats(0.0, 1e3, allow_nan=False)
inputs = st.fixed_dictionaries({"S_ms": times, "C_ms": times, "eta": st.floats(0.01, 1.0), "Q": st.integers(0, 64),
                                "latency_ms": st.floats(0.0, 10.0), "volume_bytes": st.floats(0.0, 1e10),
                                "bandwidth_GBps": st.floats(0.01, 1e4)})
SETTINGS = settings(max_examples=400, deadline=None)


def _same(a, b) -> bool:
    """Equal to the last bit (inf == inf; NaN never appears here)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isinf(a) and math.isinf(b) and a == b)


@SETTINGS
@given(inputs)
def test_n_devices_at_two_is_exactly_the_article_s_model(p):
    two, general = bm.evaluate(**p), bm.evaluate_n(**p, N=2, wire_dtype="fp32")
    for key in bm.RESULT_FIELDS:
        assert _same(getattr(general, key), getattr(two, key)), key
    assert general.notes == two.notes
    link = {k: p[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    assert bm.comm_n_ms(**link, N=2) == bm.comm_ms(**link)
    assert bm.t_n_ms(**p, N=2) == bm.t_two_ms(**p)
    assert _same(bm.break_even_C_n_ms(p["eta"], **link, N=2), bm.break_even_C_ms(p["eta"], **link))
    assert _same(bm.min_bandwidth_n_GBps(p["C_ms"], p["eta"], p["Q"], p["latency_ms"], p["volume_bytes"], N=2),
                 bm.min_bandwidth_GBps(p["C_ms"], p["eta"], p["Q"], p["latency_ms"], p["volume_bytes"]))
    assert _same(bm.min_eta_n(p["C_ms"], **link, N=2), bm.min_eta(p["C_ms"], **link))


@SETTINGS
@given(inputs, st.integers(2, 64))
def test_the_n_device_formula(p, n):
    b = bm.evaluate_n(**p, N=n)
    H = p["Q"] * ((n - 1) * p["latency_ms"] + 2 * (n - 1) / n * p["volume_bytes"] / (p["bandwidth_GBps"] * 1e6))
    assert b.comm_ms == pytest.approx(H, rel=1e-12, abs=1e-12)
    assert b.t_two_ms == pytest.approx(p["S_ms"] + p["C_ms"] / (n * p["eta"]) + H, rel=1e-12, abs=1e-12)
    assert b.efficiency == pytest.approx(b.speedup / n)
    assert b.speedup <= n * (1 + 1e-12)
    assert math.isinf(b.break_even_C_ms) == (p["eta"] <= 1 / n)


@SETTINGS
@given(inputs, st.integers(2, 16))
def test_bf16_on_the_wire_is_half_the_bytes(p, n):
    half = bm.evaluate_n(**{**p, "volume_bytes": p["volume_bytes"] / 2}, N=n, wire_dtype="fp32")
    bf16 = bm.evaluate_n(**p, N=n, wire_dtype="bf16")
    for key in bm.RESULT_FIELDS:
        assert _same(getattr(bf16, key), getattr(half, key)), key
    assert bm.evaluate_n(**p, N=n, wire_dtype="float16").comm_ms == bf16.comm_ms


@SETTINGS
@given(inputs, st.integers(2, 16))
def test_splitting_pays_exactly_above_the_n_device_break_even(p, n):
    b = bm.evaluate_n(**p, N=n)
    be = b.break_even_C_ms
    margin = lambda a, c: abs(a - c) > 1e-9 * max(abs(a), abs(c), 1.0)  # noqa: E731
    if (math.isinf(be) or margin(p["C_ms"], be)) and margin(b.t_one_ms, b.t_two_ms):
        assert (b.t_two_ms < b.t_one_ms) == (p["C_ms"] > be)


def test_ring_startups_and_bytes_grow_with_N():
    base = dict(bm.BASE_CASE)
    h = [bm.comm_n_ms(base["Q"], base["latency_ms"], base["volume_bytes"], base["bandwidth_GBps"], N=n)
         for n in (2, 4, 8)]
    assert h == pytest.approx([4 * (0.03 + 0.2), 4 * (3 * 0.03 + 1.5 * 0.2), 4 * (7 * 0.03 + 1.75 * 0.2)])
    assert bm.ring_factor(2) == 1.0 and bm.ring_factor(8) == 1.75
    table = bm.devices_table(base)
    assert list(table["N"]) == [2, 4, 8, 2, 4, 8] and list(table["wire"]) == ["fp32"] * 3 + ["bf16"] * 3
    assert table["T_N (ms)"].iloc[0] == pytest.approx(9.22)
    assert bm.wire_bytes(2e6, "bf16") == 1e6


@pytest.mark.parametrize("kwargs,needle", [({"N": 1}, "N=1"), ({"N": 2.5}, "N=2.5"), ({"N": "4"}, "N='4'"),
                                           ({"N": True}, "N=True"), ({"wire_dtype": "int8"}, "wire_dtype='int8'")])
def test_bad_N_or_dtype_is_refused_naming_it(kwargs, needle):
    with pytest.raises(LabInputError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        bm.evaluate_n(**bm.BASE_CASE, **kwargs)
    assert bm.check_devices(np.int64(4)) == 4


def test_n_device_notes_and_verdict_name_N():
    b = bm.evaluate_n(**{**bm.BASE_CASE, "eta": 0.2}, N=4)
    assert "eta <= 1/4" in b.notes["break_even_C_ms"]
    assert "4 devices" in bm.verdict(b, 4) and "eta <= 1/4" in bm.verdict(b, 4)
    tight = bm.evaluate_n(**{**bm.BASE_CASE, "C_ms": 0.3}, N=8)
    assert "Q*7*l" in tight.notes["min_bandwidth_GBps"]


# --- the hardware ratio ---

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


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 2000.0), st.floats(1.0, 1000.0), st.floats(0.55, 1.0), st.integers(2, 8),
       st.integers(1, 8), st.sampled_from(["fp32", "bf16"]), st.floats(1.0, 4096.0), st.floats(0.0, 0.2))
def test_at_the_critical_hidden_size_the_budget_breaks_even(tflops, gbps, eta, n, q, wire, batch, latency):
    """Build the MLP block's C and V at h* and feed them to the budget: T_N == T1 there."""
    h = hardware_ratio.critical_hidden(tflops, gbps, eta, n, q, wire, 4.0, batch_tokens=batch, latency_ms=latency)
    C_ms = 4 * batch * h * 4 * h / (tflops * 1e9)
    V = batch * h * 4  # fp32-counted values; the wire dtype resizes them
    b = bm.evaluate_n(0.0, C_ms, eta, q, latency, V, gbps, N=n, wire_dtype=wire)
    assert b.t_two_ms == pytest.approx(b.t_one_ms, rel=1e-7)
    below = bm.evaluate_n(0.0, C_ms * 0.81, eta, q, latency, V * 0.9, gbps, N=n, wire_dtype=wire)
    assert below.t_two_ms > below.t_one_ms  # a smaller hidden size (0.9 h*) loses


# --- the command line ---

def test_cli_N_and_wire_dtype(capsys):
    assert main(["budget", "--N", "4", "--wire-dtype", "bf16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = bm.evaluate_n(**bm.BASE_CASE, N=4, wire_dtype="bf16")
    assert data["t_two_ms"] == pytest.approx(expected.t_two_ms) and data["comm_ms"] == pytest.approx(0.96)
    assert main(["budget", "--N", "8"]) == 0
    out = capsys.readouterr().out
    assert "N = 8 devices" in out and "8 devices, T_N" in out and "not 8x" in out
    assert main(["budget", "--N", "2", "--wire-dtype", "fp32"]) == 0
    assert "Two-device time budget" in capsys.readouterr().out


@pytest.mark.parametrize("argv,name", [(["--N", "1"], "--N"), (["--N", "2.5"], "--N"), (["--N", "many"], "--N"),
                                       (["--wire-dtype", "int8"], "--wire-dtype"),
                                       (["--N", "4", "--eta", "0"], "--eta")])
def test_cli_bad_N_or_dtype_exits_2_with_one_line(capsys, argv, name):
    assert main(["budget", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and captured.out == ""
