"""The time-budget model: the article's two-device figures, N devices and the wire dtype, vectorised
calls, bad input, "never". (The worked cases of the article: tests/test_budget_cases.py.)"""

import math
import warnings

import numpy as np
import pytest

from labutils.core.inputs import LabInputError
from labutils.model import budget as bm

BASE = dict(bm.BASE_CASE)


def stable_id(value) -> str:
    """A test id that is the same in every process (an object()'s repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


def test_base_case_budget_fields_and_their_relations():
    b = bm.evaluate(**BASE)
    assert b.t_one_ms == pytest.approx(12.8)
    assert b.t_two_ms == pytest.approx(9.22)
    assert b.comm_ms == pytest.approx(0.92)
    assert b.efficiency == pytest.approx(b.speedup / 2)
    assert b.break_even_C_ms == pytest.approx(0.92 / 0.375)
    assert b.ideal_overlap_ms == pytest.approx(8.3)
    assert b.notes == {}
    assert set(b.as_dict()) == set(bm.RESULT_FIELDS) | {"notes"}
    assert all(isinstance(getattr(b, f), float) for f in bm.RESULT_FIELDS)


def test_single_functions_agree_with_evaluate():
    b = bm.evaluate(**BASE)
    link = {k: BASE[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    assert bm.comm_ms(**link) == pytest.approx(b.comm_ms)
    assert bm.t_one_ms(BASE["S_ms"], BASE["C_ms"]) == pytest.approx(b.t_one_ms)
    assert bm.t_two_ms(**BASE) == pytest.approx(b.t_two_ms)
    assert bm.ideal_overlap_ms(**BASE) == pytest.approx(b.ideal_overlap_ms)
    assert bm.break_even_C_ms(BASE["eta"], **link) == pytest.approx(b.break_even_C_ms)
    assert bm.min_bandwidth_GBps(BASE["C_ms"], BASE["eta"], BASE["Q"], BASE["latency_ms"],
                                 BASE["volume_bytes"]) == pytest.approx(b.min_bandwidth_GBps)
    assert bm.min_eta(BASE["C_ms"], **link) == pytest.approx(b.min_eta)
    assert bm.transfer_window_ms(12.0, 0.8, 4, 0.03) == pytest.approx(1.095)


def test_break_even_makes_the_times_equal():
    be = bm.evaluate(**BASE).break_even_C_ms
    at = bm.evaluate(**{**BASE, "C_ms": be})
    assert at.t_two_ms == pytest.approx(at.t_one_ms, rel=1e-12)
    assert bm.evaluate(**{**BASE, "C_ms": be * 1.01}).t_two_ms < bm.evaluate(**{**BASE, "C_ms": be * 1.01}).t_one_ms
    assert bm.evaluate(**{**BASE, "C_ms": be * 0.99}).t_two_ms > bm.evaluate(**{**BASE, "C_ms": be * 0.99}).t_one_ms


def test_infinite_bandwidth_leaves_the_startups():
    assert bm.comm_ms(4, 0.03, 2_000_000, math.inf) == pytest.approx(0.12)
    assert bm.evaluate(**{**BASE, "bandwidth_GBps": math.inf}).t_two_ms == pytest.approx(0.8 + 7.5 + 0.12)


# --- vectorised calls ---

def test_array_inputs_give_arrays_matching_scalar_calls():
    bandwidth = np.array([1.0, 10.0, 50.0, 1000.0])
    b = bm.evaluate(**{**BASE, "bandwidth_GBps": bandwidth})
    for name in bm.RESULT_FIELDS:
        values = getattr(b, name)
        assert isinstance(values, np.ndarray) and values.shape == (4,), name
        for i, gbps in enumerate(bandwidth):
            assert values[i] == pytest.approx(getattr(bm.evaluate(**{**BASE, "bandwidth_GBps": gbps}), name)), name
    assert b.t_two_ms[[0, 2]] == pytest.approx([16.42, 8.58])


def test_arrays_broadcast_together():
    C = np.linspace(0.5, 20, 5)[:, None]
    eta = np.array([0.4, 0.6, 0.8, 1.0])[None, :]
    b = bm.evaluate(**{**BASE, "C_ms": C, "eta": eta})
    assert b.t_two_ms.shape == (5, 4)
    assert b.t_one_ms.shape == (5, 4)  # T1 does not depend on eta but is broadcast to the grid
    assert b.break_even_C_ms.shape == (5, 4)
    assert np.all(np.isinf(b.break_even_C_ms[:, 0]))  # eta = 0.4: never
    assert np.all(np.isfinite(b.break_even_C_ms[:, 1:]))
    assert bm.t_two_ms(0.8, C, eta, 4, 0.03, 2e6, 10.0).shape == (5, 4)
    assert bm.comm_ms(np.arange(5), 0.03, 2e6, 10.0) == pytest.approx(0.23 * np.arange(5))


def test_array_never_elements_are_counted_in_the_notes():
    b = bm.evaluate(**{**BASE, "eta": np.array([0.3, 0.5, 0.8, 1.0])})
    assert np.isinf(b.break_even_C_ms).tolist() == [True, True, False, False]
    assert "never at 2 of 4 points" in b.notes["break_even_C_ms"]
    assert "eta <= 0.5" in b.notes["break_even_C_ms"]


# --- invalid input ---

BAD = [("S_ms", -1.0, "[0, inf)"), ("S_ms", math.nan, "[0, inf)"), ("C_ms", -0.5, "[0, inf)"),
       ("C_ms", math.nan, "[0, inf)"), ("latency_ms", -0.01, "[0, inf)"), ("latency_ms", math.nan, "[0, inf)"),
       ("S_ms", math.inf, "[0, inf)"), ("eta", 0.0, "(0, 1]"), ("eta", 1.2, "(0, 1]"), ("eta", -0.5, "(0, 1]"),
       ("eta", math.nan, "(0, 1]"), ("bandwidth_GBps", 0.0, "(0, inf]"), ("bandwidth_GBps", -3.0, "(0, inf]"),
       ("bandwidth_GBps", math.nan, "(0, inf]"), ("Q", -1, "[0, inf)"), ("volume_bytes", -1, "[0, inf)"),
       ("volume_bytes", math.nan, "[0, inf)")]


@pytest.mark.parametrize("name,value,allowed", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_invalid_input_names_parameter_value_and_range(name, value, allowed):
    with pytest.raises(LabInputError) as err:
        bm.evaluate(**{**BASE, name: value})
    text = str(err.value)
    assert isinstance(err.value, ValueError)
    assert text.startswith(f"{name}=") and allowed in text and repr(float(value)) in text


def test_invalid_element_inside_an_array_is_caught():
    with pytest.raises(LabInputError, match=r"eta=1\.5 .*\(0, 1\]"):
        bm.evaluate(**{**BASE, "eta": np.array([0.8, 1.5])})
    with pytest.raises(LabInputError, match="C_ms"):
        bm.t_one_ms(1.0, np.array([1.0, -2.0]))
    with pytest.raises(LabInputError, match="bandwidth_GBps"):
        bm.comm_ms(4, 0.03, 2e6, 0)
    with pytest.raises(LabInputError, match="volume_bytes"):
        bm.min_bandwidth_GBps(12, 0.8, 4, 0.03, -5)
    with pytest.raises(LabInputError, match="must be a number"):
        bm.evaluate(**{**BASE, "Q": "four"})


# --- every "never" ---

@pytest.mark.parametrize("eta", [0.5, 0.3, 0.01])
def test_low_efficiency_never_pays(eta):
    b = bm.evaluate(**{**BASE, "eta": eta})
    assert math.isinf(b.break_even_C_ms) and math.isinf(b.min_bandwidth_GBps)
    assert b.t_two_ms > b.t_one_ms
    for key in ("break_even_C_ms", "min_bandwidth_GBps"):
        assert b.notes[key].startswith("never:") and "eta <= 0.5" in b.notes[key]
    assert math.isinf(bm.break_even_C_ms(eta, 4, 0.03, 2e6, 10.0))


def test_startups_that_eat_the_saving_need_infinite_bandwidth():
    # saving C(1 - 1/(2 eta)) = 0.375 ms at C = 1; startups Q*l = 4 * 0.1 = 0.4 ms: D < 0
    b = bm.evaluate(**{**BASE, "C_ms": 1.0, "latency_ms": 0.1})
    assert bm.transfer_window_ms(1.0, 0.8, 4, 0.1) < 0
    assert math.isinf(b.min_bandwidth_GBps)
    assert "startups alone" in b.notes["min_bandwidth_GBps"] and "0.4 ms" in b.notes["min_bandwidth_GBps"]
    # D exactly zero is never too
    assert math.isinf(bm.min_bandwidth_GBps(1.0, 0.8, 3, 0.125, 2e6))  # Q·ℓ = 3 × 0.125 = 0.375 ms: D = 0


def test_communication_at_least_the_compute_needs_impossible_eta():
    b = bm.evaluate(**{**BASE, "C_ms": 0.5})  # H = 0.92 >= C
    assert math.isinf(b.min_eta)
    assert b.notes["min_eta"].startswith("never:") and "H = 0.92 ms" in b.notes["min_eta"]
    assert math.isinf(bm.min_eta(0.92, 4, 0.03, 2e6, 10.0))  # C == H exactly
    assert math.isinf(bm.min_eta(0.0, 0, 0.0, 0, 10.0))  # nothing to split


def test_minimum_eta_above_one_is_finite_but_flagged_impossible():
    b = bm.evaluate(**{**BASE, "C_ms": 1.0})
    assert b.min_eta == pytest.approx(6.25)
    assert "impossible since eta <= 1" in b.notes["min_eta"]


def test_no_communication_edge_cases():
    # nothing travels: any C > 0 pays once eta > 0.5, and no bandwidth is needed
    assert bm.break_even_C_ms(0.8, 0, 0.03, 2e6, 10.0) == 0.0
    assert bm.min_bandwidth_GBps(12.0, 0.8, 0, 0.03, 2e6) == 0.0
    assert bm.min_bandwidth_GBps(12.0, 0.8, 4, 0.03, 0) == 0.0
    assert math.isinf(bm.min_bandwidth_GBps(0.1, 0.8, 4, 0.03, 0))  # startups alone still lose
    assert math.isinf(bm.transfer_window_ms(12.0, 0.8, 0, 0.03))
    assert bm.min_eta(12.0, 0, 0.03, 2e6, 10.0) == pytest.approx(0.5)


def test_no_work_at_all_has_ratio_one_not_a_division_error():
    b = bm.evaluate(S_ms=0, C_ms=0, eta=1.0, Q=0, latency_ms=0, volume_bytes=0, bandwidth_GBps=1.0)
    assert b.t_one_ms == b.t_two_ms == 0.0 and b.speedup == 1.0 and b.efficiency == 0.5


# --- verdict, table, exercises ---

def test_verdict_says_whether_splitting_pays():
    assert bm.verdict(bm.evaluate(**BASE)).startswith("Splitting pays")
    assert "2.453 ms" in bm.verdict(bm.evaluate(**{**BASE, "C_ms": 1.0}))
    assert "no amount of compute" in bm.verdict(bm.evaluate(**{**BASE, "eta": 0.5}))
    zero = bm.evaluate(S_ms=1, C_ms=0, eta=1.0, Q=0, latency_ms=0, volume_bytes=0, bandwidth_GBps=1.0)
    assert bm.verdict(zero).startswith("Break-even")


BAD_VALUES = [None, "3", "fast", math.nan, math.inf, -1.0, True, [1, 2, 3]]


@pytest.mark.parametrize("value", BAD_VALUES, ids=stable_id)
def test_a_bad_value_of_any_kind_is_named_without_warnings(value):
    params = dict(BASE)
    name = "Q" if value != math.inf else "C_ms"
    params[name] = value
    if isinstance(value, list):
        params["eta"] = np.array([0.7, 0.8])  # (3,) against (2,): they do not broadcast
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LabInputError, match=name if not isinstance(value, list) else "broadcast"):
            bm.evaluate(**params)


def test_never_reason_and_huge_C_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = bm.evaluate(**{**BASE, "bandwidth_GBps": 1e-320})
        assert "eta <=" not in bm.verdict(b) and "bandwidth is too low" in bm.verdict(b)
        low = bm.evaluate(**{**BASE, "eta": 0.4})
        assert "eta <= 0.5" in bm.verdict(low)
        huge = bm.evaluate(**{**BASE, "C_ms": 1e308})
        assert huge.min_eta == pytest.approx(0.5)
    arrays = bm.evaluate(**{**BASE, "C_ms": np.array([1.0, 12.0])})
    with pytest.raises(LabInputError, match="arrays of shape"):
        bm.verdict(arrays)


# --- N devices: the ring all-reduce per exchange, the wire dtype ---

def test_ring_startups_and_bytes_grow_with_N():
    link = {k: BASE[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    h = [bm.comm_ms(**link, n_devices=n) for n in (2, 4, 8)]
    assert h == pytest.approx([4 * (0.03 + 0.2), 4 * (3 * 0.03 + 1.5 * 0.2), 4 * (7 * 0.03 + 1.75 * 0.2)])
    assert bm.comm_ms(**link, n_devices=4, wire_dtype="bf16") == pytest.approx(0.96)
    assert bm.ring_factor(2) == 1.0 and bm.ring_factor(8) == 1.75
    table = bm.devices_table(BASE)
    assert list(table["N"]) == [2, 4, 8, 2, 4, 8] and list(table["wire"]) == ["fp32"] * 3 + ["bf16"] * 3
    assert table["T_N (ms)"].iloc[0] == pytest.approx(9.22)


def test_every_quantity_on_four_devices():
    """The article's base case on N = 4: H_4 = 4(3 * 0.03 + 1.5 * 0.2) = 1.56 ms, C/(4 * 0.8) = 3.75 ms."""
    b = bm.evaluate(**BASE, n_devices=4)
    link = {k: BASE[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    saved = 1 - 1 / 3.2
    assert b.n_devices == 4
    assert b.comm_ms == pytest.approx(1.56) == bm.comm_ms(**link, n_devices=4)
    assert b.t_two_ms == pytest.approx(0.8 + 3.75 + 1.56) == bm.t_two_ms(**BASE, n_devices=4)
    assert b.efficiency == pytest.approx(b.speedup / 4)
    assert b.ideal_overlap_ms == pytest.approx(0.8 + 3.75) == bm.ideal_overlap_ms(**BASE, n_devices=4)
    assert bm.saved_fraction(0.8, n_devices=4) == pytest.approx(saved)
    assert b.break_even_C_ms == pytest.approx(1.56 / saved) == bm.break_even_C_ms(0.8, **link, n_devices=4)
    window = 12.0 * saved / 4 - 3 * 0.03
    assert bm.transfer_window_ms(12.0, 0.8, 4, 0.03, n_devices=4) == pytest.approx(window)
    need = 1.5 * 2e6 / (window * 1e6)
    assert b.min_bandwidth_GBps == pytest.approx(need)
    assert bm.min_bandwidth_GBps(12.0, 0.8, 4, 0.03, 2e6, n_devices=4) == pytest.approx(need)
    assert b.min_eta == pytest.approx(12.0 / (4 * (12.0 - 1.56))) == bm.min_eta(12.0, **link, n_devices=4)
    bf16 = bm.evaluate(**BASE, n_devices=4, wire_dtype="bf16")
    assert bf16.comm_ms == pytest.approx(4 * (3 * 0.03 + 1.5 * 0.1))
    assert bm.min_bandwidth_GBps(12.0, 0.8, 4, 0.03, 2e6, n_devices=4, wire_dtype="bf16") == pytest.approx(need / 2)


def test_never_on_N_devices():
    assert math.isinf(bm.break_even_C_ms(0.25, 4, 0.03, 2e6, 10.0, n_devices=4))  # eta <= 1/4
    assert math.isfinite(bm.break_even_C_ms(0.3, 4, 0.03, 2e6, 10.0, n_devices=4))
    assert math.isinf(bm.min_bandwidth_GBps(0.3, 0.8, 4, 0.03, 2e6, n_devices=8))  # startups 4 * 7 * 0.03 > saving
    assert math.isinf(bm.min_eta(1.0, 4, 0.03, 2e6, 10.0, n_devices=8))


@pytest.mark.parametrize("kwargs,needle", [
    ({"n_devices": 1}, "n_devices=1"), ({"n_devices": 2.5}, "n_devices=2.5"), ({"n_devices": "4"}, "n_devices='4'"),
    ({"n_devices": True}, "n_devices=True"), ({"wire_dtype": "int8"}, "wire_dtype='int8'")])
def test_bad_N_or_dtype_is_refused_naming_it(kwargs, needle):
    with pytest.raises(LabInputError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        bm.evaluate(**BASE, **kwargs)
    with pytest.raises(LabInputError, match=needle.replace(".", r"\.")):
        bm.comm_ms(4, 0.03, 2e6, 10.0, **kwargs)
    assert bm.check_devices(np.int64(4)) == 4


def test_n_device_notes_and_verdict_name_N():
    b = bm.evaluate(**{**BASE, "eta": 0.2}, n_devices=4)
    assert "eta <= 1/4" in b.notes["break_even_C_ms"]
    assert "4 devices" in bm.verdict(b) and "eta <= 1/4" in bm.verdict(b)
    tight = bm.evaluate(**{**BASE, "C_ms": 0.3}, n_devices=8)
    assert "Q*7*l" in tight.notes["min_bandwidth_GBps"]
    assert "not 8x" in bm.verdict(bm.evaluate(**{**BASE, "C_ms": 100.0}, n_devices=8))


def test_devices_sentence_from_the_table_both_ways_and_the_tie():
    table = bm.devices_table(BASE)
    fp32 = bm.devices_sentence(table, "fp32")
    assert "efficiency falls from 69 to 33 percent" in fp32
    # the break-even dips at N = 4 (2.45, 2.27, 2.65 ms): the sentence says so, not "rises"
    assert "break-even C falls from 2.45 ms to 2.27 ms at N = 4, then rises to 2.65 ms at N = 8." in fp32
    assert "break-even C rises from 1.39 ms to 1.83 ms" in bm.devices_sentence(table, "bf16")  # one way: no N named
    fast = bm.devices_table({**BASE, "latency_ms": 0.0, "bandwidth_GBps": 1000.0}, world_sizes=(2, 8))
    assert "break-even C falls from" in bm.devices_sentence(fast)  # no startups: the ring's bytes grow slower
    free = bm.devices_table({**BASE, "Q": 0}, world_sizes=(2, 8))  # no exchange: break-even 0 for every N
    assert "break-even C stays at 0 ms" in bm.devices_sentence(free)
    never = bm.devices_table({**BASE, "eta": 0.2}, world_sizes=(2, 4))
    assert "stays at never" in bm.devices_sentence(never)
    with pytest.raises(LabInputError, match="not in this table"):
        bm.devices_sentence(bm.devices_table(BASE, wire_dtypes=("fp32",)), "bf16")


def test_change_describes_the_whole_series_a_flat_stretch_included():
    show = lambda x: f"{x:g}"  # noqa: E731
    assert bm._change([1.0, 1.0, 2.0], [2, 4, 8], show) == "stays at 1 to N = 4, then rises to 2 at N = 8"
    assert bm._change([3.0, 2.0, 1.0], [2, 4, 8], show) == "falls from 3 to 1"
    assert bm._change([1.0, 1.0], [2, 4], show) == "stays at 1"
