"""The article's worked cases (data/budget_cases.json): every figure the article prints is reproduced
by labutils.model.budget, and the cases table of notebook 06."""

from decimal import Decimal

import pytest

from labutils.course.budget_cases import cases_table, load_cases
from labutils.model import budget as bm

CASES = load_cases()
PRINTED = [(case["name"], key, text) for case in CASES for key, text in case["printed"].items()]


def _figures(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps) -> dict:
    """Every figure the article prints for one case: the Budget fields plus the intermediate steps
    (one transfer's V/B, the split compute C/(2η), the saved share 1 − 1/(2η), and D in seconds)."""
    figures = bm.evaluate(S_ms, C_ms, eta, Q, latency_ms, volume_bytes, bandwidth_GBps).as_dict()
    figures["transfer_ms"] = bm.comm_ms(1, 0.0, volume_bytes, bandwidth_GBps)
    figures["parallel_compute_ms"] = bm.t_two_ms(0.0, C_ms, eta, 0, 0.0, 0, 1.0)
    figures["saved_fraction"] = bm.saved_fraction(eta)
    figures["D_s"] = bm.transfer_window_ms(C_ms, eta, Q, latency_ms) / 1e3
    return figures


def _matches_print(value: float, text: str) -> bool:
    """The article prints a figure with k decimals: the model rounded to k decimals must equal it."""
    decimals = max(-Decimal(text).as_tuple().exponent, 0)
    return round(value, decimals) == float(text)


@pytest.mark.parametrize("name,key,text", PRINTED, ids=[f"{n}:{k}" for n, k, _ in PRINTED])
def test_every_printed_figure_is_reproduced(name, key, text):
    case = next(c for c in CASES if c["name"] == name)
    value = _figures(**case["inputs"])[key]
    assert _matches_print(value, text), f"{name}: {key} = {value!r}, the article prints {text}"


def test_the_cases_file_holds_the_figures_the_article_prints():
    printed = {float(text) for _, _, text in PRINTED}
    for figure in (9.22, 1.388, 0.694, 2.45333, 2.345, 16.42, 8.58, 108.42, 1.033, 8.3, 1.82648,
                   0.001095, 0.54152, 6.25, 12.8, 0.92, 8.12, 0.28, 112, 0.375, 7.5, 0.2):
        assert figure in printed, f"{figure} is missing from data/budget_cases.json"


def test_cases_start_from_the_module_base_case():
    assert CASES[0]["inputs"] == bm.BASE_CASE
    assert {c["name"] for c in CASES} >= {"base case", "little compute, C = 1 ms", "slow link, B = 1 GB/s",
                                          "fast link, B = 50 GB/s", "large serial part, S = 100 ms"}


def test_cases_table_lists_every_case():
    table = cases_table()
    assert list(table.index) == [c["name"] for c in CASES]
    assert table.loc["base case", "T2 (ms)"] == pytest.approx(9.22)
    assert table.loc["large serial part, S = 100 ms", "speedup"] == pytest.approx(112 / 108.42)
    assert table.loc["slow link, B = 1 GB/s", "change"] == "bandwidth_GBps=1"
