"""The time-budget model: every figure the article prints, vectorised calls, bad input, "never"."""

import math
from decimal import Decimal

import numpy as np
import pytest

from labutils.core.inputs import LabInputError
from labutils.course import budget_cli
from labutils.model import budget as bm

CASES = budget_cli.load_cases()
BASE = dict(bm.BASE_CASE)
PRINTED = [(case["name"], key, text) for case in CASES for key, text in case["printed"].items()]


def _matches_print(value: float, text: str) -> bool:
    """The article prints a figure with k decimals: the model rounded to k decimals must equal it."""
    decimals = max(-Decimal(text).as_tuple().exponent, 0)
    return round(value, decimals) == float(text)


@pytest.mark.parametrize("name,key,text", PRINTED, ids=[f"{n}:{k}" for n, k, _ in PRINTED])
def test_every_printed_figure_is_reproduced(name, key, text):
    case = next(c for c in CASES if c["name"] == name)
    value = budget_cli.case_figures(**case["inputs"])[key]
    assert _matches_print(value, text), f"{name}: {key} = {value!r}, the article prints {text}"


def test_the_cases_file_holds_the_figures_the_article_prints():
    printed = {float(text) for _, _, text in PRINTED}
    for figure in (9.22, 1.388, 0.694, 2.45333, 2.345, 16.42, 8.58, 108.42, 1.033, 8.3, 1.82648,
                   0.001095, 0.54152, 6.25, 12.8, 0.92, 8.12, 0.28, 112, 0.375, 7.5, 0.2):
        assert figure in printed, f"{figure} is missing from data/budget_cases.json"


def test_cases_start_from_the_module_base_case():
    assert CASES[0]["inputs"] == BASE
    assert {c["name"] for c in CASES} >= {"base case", "little compute, C = 1 ms", "slow link, B = 1 GB/s",
                                          "fast link, B = 50 GB/s", "large serial part, S = 100 ms"}


def test_base_case_budget_fields_and_their_relations():
    b = bm.evaluate(**BASE)
    assert b.t_one_ms == pytest.approx(12.8)
    assert b.t_two_ms == pytest.approx(9.22)
    assert b.comm_ms == pytest.approx(0.92)
    assert b.efficiency == pytest.approx(b.speedup / 2)
    assert b.break_even_C_ms == pytest.approx(0.92 / 0.375)
    assert b.overlap_bound_ms == pytest.approx(8.3)
    assert b.notes == {}
    assert set(b.as_dict()) == set(bm.RESULT_FIELDS) | {"notes"}
    assert all(isinstance(getattr(b, f), float) for f in bm.RESULT_FIELDS)


def test_single_functions_agree_with_evaluate():
    b = bm.evaluate(**BASE)
    link = {k: BASE[k] for k in ("Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    assert bm.comm_ms(**link) == pytest.approx(b.comm_ms)
    assert bm.t_one_ms(BASE["S_ms"], BASE["C_ms"]) == pytest.approx(b.t_one_ms)
    assert bm.t_two_ms(**BASE) == pytest.approx(b.t_two_ms)
    assert bm.overlap_bound_ms(**BASE) == pytest.approx(b.overlap_bound_ms)
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
    assert math.isinf(bm.min_bandwidth_GBps(1.0, 0.8, 3.75, 0.1, 2e6))


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


def test_cases_table_lists_every_case():
    table = budget_cli.cases_table()
    assert list(table.index) == [c["name"] for c in CASES]
    assert table.loc["base case", "T2 (ms)"] == pytest.approx(9.22)
    assert table.loc["large serial part, S = 100 ms", "speedup"] == pytest.approx(112 / 108.42)
