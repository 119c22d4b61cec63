"""The alpha-beta link model: the article's numbers, the fit, held-out error, the saved "link"."""

import json
import math

import numpy as np
import pandas as pd
import pytest

import labutils.core.busbw as busbw
import labutils.measure.sweep as sweep
from labutils.core.inputs import LabInputError
from labutils.core.results import DATA_DIR, list_results
from labutils.measure.my_link import load_link, save_link
from labutils.measure.sweep import ensure_link
from labutils.model.fit import (
    LinkFit,
    allreduce_ms,
    article_table,
    crossover_bytes,
    fit_alpha_beta,
    heldout_errors,
    heldout_sentence,
    heldout_table,
    interpolate_time_us,
    latency_term_us,
    split_largest,
)
from labutils.readers.nccl_tests import parse_nccl_tests


def _sweep(alpha_us, busbw_GBps, n=2, noise=0.0, op="all_reduce", sizes=None, seed=0):
    sizes = np.asarray(sizes if sizes is not None else [1024 * 2**k for k in range(17)], dtype=float)
    factor = busbw.bus_factor(op, n)
    t = alpha_us + factor * sizes / (busbw_GBps * 1e3)
    t *= 1 + noise * np.random.default_rng(seed).standard_normal(len(sizes))
    return pd.DataFrame({"op": op, "size_bytes": sizes.astype(int), "time_us": t, "world_size": n,
                         "backend": "gloo", "device": "cpu", "wrong": 0})


def test_article_numbers():
    assert allreduce_ms(200e6, 2, 22.0) == pytest.approx(9.09, abs=0.01)
    assert allreduce_ms(200e6, 8, 22.0) == pytest.approx(15.91, abs=0.01)
    table = article_table()
    assert list(table.world_size) == [2, 4, 8] and list(table.factor) == [1.0, 1.5, 1.75]
    assert allreduce_ms(200e6, 1, 22.0) == 0.0
    assert allreduce_ms(200e6, 2, 0.0) == math.inf  # no bandwidth: never


@pytest.mark.parametrize("n", [2, 4])
def test_exact_data_is_recovered(n):
    fit = fit_alpha_beta(_sweep(35.0, 22.0, n=n))
    assert fit.alpha_us == pytest.approx(35.0, rel=1e-6) and fit.busbw_GBps == pytest.approx(22.0, rel=1e-6)
    assert fit.world_size == n and fit.heldout_median_error < 1e-9 and fit.n_points == 17
    assert fit.latency_ms == pytest.approx(0.035)


def test_relative_weighting_keeps_small_sizes_right():
    frame = _sweep(50.0, 10.0, noise=0.03, seed=3)
    fit = fit_alpha_beta(frame)
    assert fit.alpha_us == pytest.approx(50.0, rel=0.1) and fit.busbw_GBps == pytest.approx(10.0, rel=0.1)
    assert fit.heldout_median_error < 0.06
    part, table = heldout_table(frame)
    assert table["held_out"].sum() == 8 and table["rel_error"].median() < 0.06


def test_bandwidth_only_fit_when_the_latency_comes_out_negative():
    """Large sizes only: a pure-bandwidth law, and one that bends to a negative intercept."""
    sizes = [2**20 * 2**k for k in range(8)]  # 1 MiB .. 128 MiB
    pure = fit_alpha_beta(_sweep(0.0, 2.0, sizes=sizes))
    assert pure.alpha_us == pytest.approx(0.0, abs=1e-6) and pure.busbw_GBps == pytest.approx(2.0, rel=1e-6)
    assert pure.heldout_median_error < 1e-6
    frame = _sweep(0.0, 2.0, sizes=sizes)
    frame["time_us"] -= 20.0  # the straight line through these meets size 0 below zero
    bent = fit_alpha_beta(frame)
    assert bent.alpha_us == 0.0, "a negative fixed cost is clipped to zero"
    assert bent.busbw_GBps == pytest.approx(2.0, rel=0.05)
    assert bent.heldout_median_error < 0.05


def test_other_collectives_fit_the_same_link():
    fit = fit_alpha_beta(_sweep(20.0, 5.0, n=4, op="all_gather"))
    assert fit.busbw_GBps == pytest.approx(5.0) and fit.alpha_us == pytest.approx(20.0)


def test_fit_drops_wrong_rows_and_refuses_too_little():
    frame = _sweep(10.0, 3.0)
    frame.loc[4, "time_us"] *= 50
    frame.loc[4, "wrong"] = 7
    assert fit_alpha_beta(frame).busbw_GBps == pytest.approx(3.0)
    with pytest.raises(LabInputError, match="at least 2"):
        fit_alpha_beta(frame.iloc[:1])
    mixed = pd.concat([_sweep(10, 3, n=2), _sweep(10, 3, n=4)])
    with pytest.raises(LabInputError, match="one world size"):
        fit_alpha_beta(mixed)
    with pytest.raises(LabInputError, match="lacks"):
        fit_alpha_beta(frame.drop(columns="time_us"))


def test_latency_only_data_gives_infinite_bandwidth():
    frame = _sweep(40.0, 1.0, sizes=[8, 16, 32, 64])
    frame["time_us"] = 40.0
    fit = fit_alpha_beta(frame)
    assert fit.busbw_GBps == math.inf and fit.alpha_us == pytest.approx(40.0)
    assert crossover_bytes(fit) == math.inf


def test_the_sample_nccl_tests_log_fits_the_article_link():
    log = parse_nccl_tests(DATA_DIR / "nccl_tests" / "sample_all_reduce_2x5090_sys.log")
    fit = fit_alpha_beta(log.frame, source="nccl-tests sample")
    assert 20 < fit.busbw_GBps < 24 and 10 < fit.alpha_us < 30 and fit.heldout_median_error < 0.05
    assert fit.backend == "nccl" and fit.device == "cuda" and fit.source == "nccl-tests sample"


def test_predictions_and_latency_terms():
    fit = LinkFit(20.0, 22.0, 2, "nccl", "cuda")
    assert allreduce_ms(200e6, 2, fit.busbw_GBps, fit.alpha_us) * 1e3 == pytest.approx(20.0 + 9090.9, rel=1e-4)
    assert list(allreduce_ms(np.array([0, 22e3]), 4, fit.busbw_GBps, fit.alpha_us) * 1e3) == pytest.approx([20.0, 21.5])
    assert allreduce_ms(1e6, 1, fit.busbw_GBps, fit.alpha_us) * 1e3 == 0.0
    assert crossover_bytes(fit) == pytest.approx(20 * 22e3)
    assert list(latency_term_us([2, 4, 8, 16], 5.0, "ring")) == [10, 30, 70, 150]
    assert list(latency_term_us([2, 4, 8, 16], 5.0, "tree")) == [10, 20, 30, 40]
    assert latency_term_us(6, 1.0, "tree") == 6.0  # ceil(log2 6) = 3 levels
    with pytest.raises(LabInputError, match="algorithm"):
        latency_term_us(4, 1.0, "butterfly")
    with pytest.raises(LabInputError, match="world_size"):
        allreduce_ms(1e6, 0, fit.busbw_GBps, fit.alpha_us) * 1e3
    assert allreduce_ms(0, 2, 0.0) == 0.0  # nothing to send: 0 ms, not NaN
    assert allreduce_ms(1e6, 2, 10.0, alpha_us=50.0, buckets=4) == pytest.approx(4 * 0.05 + 0.1)


@pytest.mark.parametrize("call, name", [
    (lambda: allreduce_ms(1e6, 2, -1.0), "busbw_GBps"),
    (lambda: allreduce_ms(1e6, 2, 10.0, alpha_us=-5), "alpha_us"),
    (lambda: allreduce_ms(1e6, 2, 10.0, buckets=0), "buckets"),
    (lambda: allreduce_ms(1e6, 2, 10.0, buckets=1.5), "buckets"),
    (lambda: allreduce_ms(None, 2, 10.0), "size_bytes"),
    (lambda: allreduce_ms(np.ones(3), np.array([2, 4]), 10.0), "broadcast"),
    (lambda: latency_term_us(4, math.nan), "alpha_step_us"),
])
def test_bad_values_are_refused_naming_them(call, name):
    with pytest.raises(LabInputError, match=name):
        call()


def test_save_and_load_the_link_contract():
    fit = fit_alpha_beta(_sweep(35.0, 1.7))
    path = save_link(fit)
    meta = json.loads(path.read_text())["meta"]
    for key in ("name", "alpha_us", "busbw_GBps", "world_size", "backend", "device", "source"):
        assert key in meta
    assert "latency_ms" not in meta and "bandwidth_GBps" not in meta  # one set of names on disk
    assert meta["name"] == "my link: gloo/cpu, 2 ranks" and meta["busbw_GBps"] == pytest.approx(1.7)
    assert meta["alpha_us"] == pytest.approx(35.0) and meta["source"].startswith("measured on ")
    assert fit.budget_params() == pytest.approx({"latency_ms": 0.035, "bandwidth_GBps": 1.7})
    back = load_link()
    assert back == fit
    assert load_link(world_size=8) is None or load_link(world_size=8).world_size == 8
    inf = LinkFit(5.0, math.inf, 3, "gloo", "cpu")
    save_link(inf, name="flat")
    assert load_link(world_size=3).busbw_GBps == math.inf


def test_ensure_link_reuses_a_saved_link_else_measures(monkeypatch):
    calls = []

    def fake_sweep(**kwargs):
        calls.append(kwargs)
        return sweep.SweepResult(_sweep(12.0, 4.0, n=kwargs["nproc"]), {})

    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    before = len(list_results("link"))
    fit = ensure_link(nproc=5, backend="gloo", device="cpu")
    assert calls and calls[0]["max_bytes"] == "4M" and fit.busbw_GBps == pytest.approx(4.0)
    assert len(list_results("link")) == before + 1
    again = ensure_link(nproc=5, backend="gloo", device="cpu")
    assert len(calls) == 1 and again == fit


def test_a_saved_link_reads_back_and_a_foreign_one_is_skipped(tmp_path):
    from labutils.core.results import save_result
    from labutils.measure.my_link import load_link, saved_links

    save_result("link", None, {"name": "mine", "alpha_us": 50.0, "busbw_GBps": 3.0, "world_size": 2,
                               "backend": "gloo", "device": "cpu"}, tmp_path)
    save_result("link", None, {"name": "foreign", "latency_ms": 0.05}, tmp_path)  # no fields of a link: skipped
    link = load_link(directory=tmp_path, world_size=2)
    assert (link.alpha_us, link.busbw_GBps) == (50.0, 3.0)
    assert [name for name, _, _ in saved_links(tmp_path)] == ["mine"]


# --- the measured curve, interpolated -------------------------------------------------------------

def test_interpolation_follows_a_curve_one_line_misses(synthetic_sweep, true_us):
    sweep = synthetic_sweep()
    between = [int(1.5 * 2**k) for k in range(11, 26)]  # never measured
    reading = interpolate_time_us(sweep, between)
    truth = np.array([true_us(s) for s in between])
    assert not reading.any_extrapolated and reading.note() == ""
    assert np.max(np.abs(reading.time_us - truth) / truth) < 0.06
    line = fit_alpha_beta(sweep, holdout=False)
    line_us = line.alpha_us + np.array(between) / (line.busbw_GBps * 1e3)
    assert np.max(np.abs(line_us - truth) / truth) > 0.3  # one alpha-beta line over the range misses
    exact = interpolate_time_us(sweep, [2**20])
    assert exact.time_us[0] == pytest.approx(true_us(2**20))


def test_interpolation_extrapolates_carefully_and_says_so(synthetic_sweep, true_us):
    sweep = synthetic_sweep()
    reading = interpolate_time_us(sweep, [512, 2**27])
    assert reading.extrapolated.tolist() == [True, True]
    assert reading.time_us[0] == pytest.approx(true_us(1024))  # no smaller than the smallest measured
    assert reading.time_us[1] == pytest.approx(2 * true_us(2**26))  # the largest size's bandwidth
    assert "outside the measured" in reading.note() and "512" in reading.note()
    with pytest.raises(LabInputError, match="size_bytes"):
        interpolate_time_us(sweep, [0])


# --- the two held-out checks: interpolation and extrapolation -------------------------------------

def _bent_sweep(slower_above_bytes=2**24, factor=1.3):
    """A link whose bandwidth drops by `factor` above a size: one line fits between sizes, not past them."""
    frame = _sweep(20.0, 5.0)
    big = frame["size_bytes"] > slower_above_bytes
    frame.loc[big, "time_us"] = 20.0 + frame.loc[big, "size_bytes"] * factor / 5e3
    return frame


def test_the_largest_sizes_are_held_out_for_the_extrapolation_check():
    frame = _sweep(20.0, 5.0)
    train, held = split_largest(frame)
    assert held["size_bytes"].tolist() == [2**25, 2**26] and train["size_bytes"].max() == 2**24
    train, held = split_largest(frame.iloc[:3])
    assert len(train) == 2 and len(held) == 1  # two sizes always remain to fit
    part, table = heldout_table(frame, held="largest")
    assert table["held_out"].sum() == 2 and heldout_errors(table)[0] < 1e-9
    with pytest.raises(LabInputError, match="held"):
        heldout_table(frame, held="random")


def test_interpolation_and_extrapolation_errors_differ_on_a_bending_link():
    frame = _bent_sweep()
    inside, beyond = heldout_table(frame)[1], heldout_table(frame, held="largest")[1]
    (i_med, _), (b_med, b_max) = heldout_errors(inside), heldout_errors(beyond)
    assert b_max >= b_med
    assert b_med > 2 * i_med and 0.2 < b_med < 0.25  # 1 - 1/1.3 = 23 %
    said = heldout_sentence(inside, beyond, 200e6)
    assert f"median error {i_med:.1%}" in said and f"median error {b_med:.1%}" in said
    assert f"{b_med / i_med:.2g} times the interpolation's" in said
    assert "a fit up to 16M predicting 32M and 64M, up to 4x past it" in said
    assert "200 MB is 3x the largest measured size (64M): its prediction is an extrapolation" in said
    assert "or more" not in said  # 3x past the sweep is within the check's 4x
    assert "further past the sweep than the check did (4x)" in heldout_sentence(inside, beyond, 1e9)
    assert "inside the measured range" in heldout_sentence(inside, beyond, 1e6)
    assert "interpolation error" in heldout_sentence(inside, beyond, 1e6)
    assert "below the smallest measured size" in heldout_sentence(inside, beyond, 100)


def test_heldout_sentence_says_smaller_and_the_same_from_the_numbers():
    frame = _bent_sweep()
    inside, beyond = heldout_table(frame)[1], heldout_table(frame, held="largest")[1]
    calm = beyond.assign(rel_error=heldout_errors(inside)[0] * 0.3)
    assert "0.3 times the interpolation's" in heldout_sentence(inside, calm, 200e6)
    same = beyond.assign(rel_error=heldout_errors(inside)[0] * 1.05)
    assert "about the same as the interpolation's" in heldout_sentence(inside, same, 200e6)
    none = inside.assign(held_out=False)
    assert heldout_sentence(none, beyond, 200e6).startswith("Too few sizes")
    assert all(math.isnan(e) for e in heldout_errors(none))
