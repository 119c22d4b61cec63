"""The two-device budget held against a measured split layer: inputs, both views of the prediction (a priori
and after the fact), break-even, the protocol on ranks."""

import math

import numpy as np
import pandas as pd
import pytest

from labutils.core.inputs import LabInputError
from labutils.experiments import split_timing as st
from labutils.experiments import validation as val
from labutils.experiments.tensor_parallel import LayerSize
from labutils.model import budget
from labutils.model.fit import LinkFit


def test_time_layers_refuses_a_rank_count_that_does_not_divide_the_layer():
    with pytest.raises(LabInputError, match="nproc=3"):
        st.time_layers([(8, 64)], 3)


def test_time_layers_refuses_a_budget_that_is_not_positive_before_starting_ranks():
    with pytest.raises(LabInputError, match="budget_s"):
        st.time_layers([(8, 64)], 2, budget_s=-1)


def test_time_layers_refuses_an_unknown_mode_before_starting_ranks():
    with pytest.raises(LabInputError, match="mode"):
        st.time_layers([(8, 64)], 2, ("whole", "halfs"))


# --- estimating the budget from measurements -------------------------------------------------------------

LINK = LinkFit(alpha_us=200.0, busbw_GBps=2.0, world_size=2, backend="gloo", device="cpu")  # latency 0.2 ms


def synthetic_frame(S_ms=0.05, eta=0.8, ms_per_mflop=0.0125, hiddens=(32, 64, 128, 256, 512, 1024), batch=16,
                    eta_halves=None):
    """Timings that follow the budget exactly: whole = S + C, split = S + C/(2 eta) + l + V/B, and
    halves (the split's compute with no all-reduce) = S + C/(2 eta_halves), eta_halves = eta unless given."""
    eta_halves = eta if eta_halves is None else eta_halves
    rows = []
    for h in hiddens:
        size = LayerSize(batch, h)
        C = size.flops / 1e6 * ms_per_mflop
        comm = LINK.latency_ms + size.output_bytes() / (LINK.busbw_GBps * 1e6)
        base = {"batch": batch, "hidden": h, "ffn": size.ffn, "dtype": "float32", "chunks": 1, "gap_ms": 0.0,
                "step_p90_ms": 0.0, "reps": 10}
        rows.append({**base, "rank": 0, "ranks": 1, "mode": "whole", "serial_ms": S_ms, "compute_ms": C,
                     "communication_ms": 0.0, "total_ms": S_ms + C, "step_ms": S_ms + C, "compute_slowest_ms": C})
        t2 = S_ms + C / (2 * eta) + comm
        for rank in (0, 1):
            rows.append({**base, "rank": rank, "ranks": 2, "mode": "split", "serial_ms": S_ms,
                         "compute_ms": C / (2 * eta) * (0.9 if rank else 1.0), "communication_ms": comm,
                         "total_ms": t2, "step_ms": t2, "compute_slowest_ms": C / (2 * eta)})
            half = C / (2 * eta_halves)
            rows.append({**base, "rank": rank, "ranks": 2, "mode": "halves", "serial_ms": S_ms,
                         "compute_ms": half * (0.9 if rank else 1.0), "communication_ms": 0.0,
                         "total_ms": S_ms + half, "step_ms": S_ms + half, "compute_slowest_ms": half})
    return pd.DataFrame(rows)


def test_estimate_inputs_recovers_the_parameters():
    frame = synthetic_frame()
    inp = val.budget_inputs_for(frame, LINK, 16, 256)
    size = LayerSize(16, 256)
    assert inp.S_ms == pytest.approx(0.05)
    assert inp.C_ms == pytest.approx(size.flops / 1e6 * 0.0125)
    assert inp.eta == pytest.approx(0.8)
    assert inp.Q == 1 and inp.volume_bytes == size.output_bytes()
    assert (inp.latency_ms, inp.bandwidth_GBps) == (0.2, 2.0)


def test_eta_uses_the_slower_half_of_each_step():
    inp = val.estimate_inputs({"serial_ms": 0.1, "compute_ms": 4.0},
                             {"compute_ms": 2.0, "compute_slowest_ms": 2.5}, LINK, 1000)
    assert inp.eta == pytest.approx(0.8)
    assert val.estimate_inputs({"serial_ms": 0.1, "compute_ms": 4.0}, {"compute_ms": 2.5}, LINK, 1000).eta == 0.8


def test_eta_above_one_is_capped_for_the_budget():
    inp = val.estimate_inputs({"serial_ms": 0.1, "compute_ms": 4.0}, {"compute_ms": 1.6}, LINK, 1000)
    assert inp.eta == 1.0 and inp.eta_measured == pytest.approx(1.25)
    budget.t_two_ms(*inp.as_args())  # accepted by the budget


def test_validation_table_predicts_budget_shaped_timings_exactly():
    table = val.validation_table(synthetic_frame(), LINK)
    assert len(table) == 6
    assert np.allclose(table["rel_error"], 0.0, atol=1e-12)
    assert np.allclose(table["comm_pred_ms"], table["comm_ms"])
    assert list(table["work_flops"]) == sorted(table["work_flops"])


def test_break_even_matches_the_budget_formula():
    table = val.validation_table(synthetic_frame(hiddens=tuple(range(32, 1025, 32))), LINK)
    found = val.break_even(table)
    # the analytic break-even C* = H / (1 - 1/(2 eta)) depends on V, so check T2 == T1 there
    row = table.iloc[(table["C_ms"] - found.C_ms).abs().argsort().iloc[0]]
    expected = budget.break_even_C_ms(0.8, 1, LINK.latency_ms, row["volume_bytes"], LINK.busbw_GBps)
    assert found.C_ms == pytest.approx(expected, rel=0.05)
    assert val.break_even(table, "T2_pred_ms").C_ms == pytest.approx(found.C_ms, rel=1e-9)


def test_break_even_outside_the_range_says_why():
    table = val.validation_table(synthetic_frame(hiddens=(32, 64)), LINK)
    never = val.break_even(table)
    assert math.isinf(never.work_flops) and "never" in never.reason
    fast = val.validation_table(synthetic_frame(hiddens=(1024, 2048)), LINK)
    assert val.break_even(fast).work_flops == 0.0


def test_summary_and_replicas_tables():
    frame = synthetic_frame()
    table = val.validation_table(frame, LINK)
    summary = val.summary_table(LINK, table, val.break_even(table), val.break_even(table, "T2_pred_ms"))
    assert list(summary["quantity"])[:3] == ["link", "break-even, measured",
                                             "break-even, after the fact (C timed beside the split)"]
    both = val.summary_table(LINK, table, val.break_even(table), val.break_even(table, "T2_pred_ms"),
                             val.apriori_table(frame, LINK))
    assert list(both["quantity"])[2] == "break-even, a priori (eta from the halves; C timed before the split)"
    assert list(both["value"])[-2:] == ["0.0%", "0.0%"]  # budget-shaped timings: both views exact
    replicas = frame[frame["mode"] == "whole"].assign(mode="replica", ranks=2)
    out = val.replicas_table(pd.concat([frame, replicas]))
    two = out[out["setup"] == "two replicas"]["throughput_rows_per_s"].to_numpy()
    one = out[out["setup"] == "one device"]["throughput_rows_per_s"].to_numpy()
    assert np.allclose(two, 2 * one, atol=1) and out["throughput_rows_per_s"].map(type).eq(int).all()


def test_overlap_table_bounds():
    frame = synthetic_frame(hiddens=(256,))
    split = frame[frame["mode"] == "split"]
    runs = [split.assign(mode="overlap", chunks=k) for k in (1, 2, 4)]
    table = val.overlap_table(pd.concat([frame[frame["mode"] == "whole"], *runs]), LINK)
    assert list(table["chunks"]) == [1, 2, 4]
    assert (table["ideal_overlap_ms"] <= table["no_overlap_ms"]).all()
    # more chunks, more latencies: the no-overlap prediction grows by l per extra chunk
    assert np.allclose(np.diff(table["no_overlap_ms"]), [LINK.latency_ms, 2 * LINK.latency_ms])
    with pytest.raises(LabInputError, match="chunks=1"):
        val.overlap_table(pd.concat([frame[frame["mode"] == "whole"], runs[1]]), LINK)


# --- a priori: predicted before the split runs ------------------------------------------------------------

def _with_split_compute(frame, factor):
    """The same runs with the split's measured compute scaled by `factor` (its T2 left as it was)."""
    split = frame["mode"] == "split"
    out = frame.copy()
    out.loc[split, ["compute_ms", "compute_slowest_ms"]] *= factor
    return out


def test_apriori_prediction_does_not_read_the_split_run():
    frame = synthetic_frame(eta=0.8, eta_halves=0.7)
    before = val.apriori_table(frame, LINK)
    for factor in (0.5, 3.0):
        changed = _with_split_compute(frame, factor)
        pd.testing.assert_frame_equal(val.apriori_table(changed, LINK), before)
        # the after-the-fact view reads it: its eta and T2 move
        assert not np.allclose(val.validation_table(changed, LINK)["T2_pred_ms"],
                               val.validation_table(frame, LINK)["T2_pred_ms"])
    # and the a-priori table needs no split run at all
    pd.testing.assert_frame_equal(val.apriori_table(frame[frame["mode"] != "split"], LINK), before)


def test_apriori_prediction_follows_the_budget_with_the_stated_etas():
    frame = synthetic_frame(eta=0.8, eta_halves=0.7, hiddens=(64, 256))
    table = val.apriori_table(frame, LINK)
    size = LayerSize(16, 256)
    C = size.flops / 1e6 * 0.0125
    row = table[table["hidden"] == 256].iloc[0]
    comm = LINK.latency_ms + size.output_bytes() / (LINK.busbw_GBps * 1e6)
    assert row["eta_halves"] == pytest.approx(0.7)
    assert row["T2_eta1_ms"] == pytest.approx(0.05 + C / 2 + comm)
    assert row["T2_apriori_ms"] == pytest.approx(0.05 + C / (2 * 0.7) + comm)
    assert row["T1_ms"] == pytest.approx(0.05 + C)
    assert row["speedup_apriori"] == pytest.approx(row["T1_ms"] / row["T2_apriori_ms"])
    with pytest.raises(LabInputError, match="halves"):
        val.apriori_table(frame[frame["mode"] != "halves"], LINK)


def test_eta_from_the_halves_above_one_is_capped():
    frame = synthetic_frame(eta=0.8, eta_halves=1.25, hiddens=(256,))
    row = val.apriori_table(frame, LINK).iloc[0]
    assert row["eta_halves"] == pytest.approx(1.25)
    assert row["T2_apriori_ms"] == pytest.approx(row["T2_eta1_ms"])


def test_both_views_side_by_side():
    # the halves ran better than the split's halves did (eta 0.9 before, 0.6 in the split run)
    frame = synthetic_frame(eta=0.6, eta_halves=0.9, hiddens=(64, 128, 256, 512, 1024))
    apriori, table = val.apriori_table(frame, LINK), val.validation_table(frame, LINK)
    views = val.compare_views(apriori, table)
    assert len(views) == 5 and list(views["work_flops"]) == sorted(views["work_flops"])
    assert np.allclose(views["err_after"], 0.0, atol=1e-12)  # after the fact: exact by construction
    assert (views["err_apriori"] < 0).all() and (views["err_eta1"] <= views["err_apriori"]).all()
    summary = val.views_summary(apriori, table).set_index("view")
    assert list(summary.index) == [v[0] for v in val.VIEWS] + ["measured"]
    assert summary.loc["after the fact", "median_abs_T2_error_pct"] == pytest.approx(0.0, abs=1e-9)
    expected = 100 * np.median(np.abs(views["err_apriori"]))
    assert summary.loc["a priori, eta from the halves", "median_abs_T2_error_pct"] == pytest.approx(expected)
    # an optimistic eta predicts the split wins at smaller layers than it does
    assert (summary.loc["a priori, eta from the halves", "break_even_MFLOP"]
            < summary.loc["measured", "break_even_MFLOP"])
    with pytest.raises(LabInputError, match="share no layer size"):
        val.compare_views(apriori[apriori["hidden"] == 64], table[table["hidden"] == 128])


# --- on ranks ------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_time_layers_protocol_structure():
    frame = st.time_layers([(4, 32), (4, 64)], 2, ("whole", "split", "halves"), quick=True, timeout_s=120)
    assert set(frame["mode"]) == {"whole", "split", "halves"}
    assert len(frame[frame["mode"] == "whole"]) == 2  # rank 0 only
    assert len(frame[frame["mode"] == "split"]) == 4  # both ranks
    halves = frame[frame["mode"] == "halves"]
    assert len(halves) == 4 and (halves["communication_ms"] < 0.05).all()  # no all-reduce
    assert (frame[frame["mode"] == "whole"]["communication_ms"] < 0.05).all()
    parts = frame[["serial_ms", "compute_ms", "communication_ms"]].sum(axis=1)
    assert (parts > 0).all() and (frame["reps"] >= 5).all() and (frame["reps"] <= 100).all()
    assert frame["budget_cut"].dtype == bool and frame.attrs["dropped_sizes"] == []
    assert frame.groupby("hidden")["reps"].nunique().eq(1).all()  # every mode and rank of a size alike
    assert frame.attrs["budget_s"] == pytest.approx(0.6) and len(frame.attrs["round_s"]) == 2
    table = val.validation_table(frame, LINK)
    assert len(table) == 2 and np.isfinite(table["T2_pred_ms"]).all()
    apriori = val.apriori_table(frame[frame["mode"] != "split"], LINK)
    assert len(apriori) == 2 and np.isfinite(apriori["T2_apriori_ms"]).all() and (apriori["eta_halves"] > 0).all()


@pytest.mark.distributed
def test_a_small_budget_gives_the_minimum_and_drops_the_largest_size():
    frame = st.time_layers([(4, 32), (4, 512)], 2, ("whole", "split"), quick=True, budget_s=1e-4, timeout_s=120)
    assert set(frame["hidden"]) == {32}  # the largest size did not fit even 5 repetitions
    assert frame.attrs["dropped_sizes"] == [(4, 512, 2048)]
    assert (frame["reps"] == 5).all() and frame["budget_cut"].all()
    rounds = frame.attrs["round_s"]
    assert len(rounds) == 2 and rounds[1] > 0 and "(4, 512, 2048)" in st.budget_note(frame)


# --- what the run showed, in words built from its numbers -------------------------------------------------

def _slower_communication(frame, extra_ms):
    """The same runs with `extra_ms` more communication in every split step (T2 too): a link slower in the
    step than the sweep measured, the budget's "no competitors" failing."""
    out = frame.copy()
    split = out["mode"] == "split"
    for col in ("communication_ms", "total_ms", "step_ms"):
        out.loc[split, col] += extra_ms
    return out


def test_error_terms_split_each_error_into_its_terms():
    frame = _slower_communication(synthetic_frame(eta=0.8, eta_halves=0.7, hiddens=(64, 128, 256)), 0.1)
    apriori, table = val.apriori_table(frame, LINK), val.validation_table(frame, LINK)
    terms = val.error_terms(apriori, table).set_index("view")
    views = val.compare_views(apriori, table)
    for view, err in (("a priori", "err_apriori"), ("after the fact", "err_after")):
        assert terms.loc[view, "median_abs_T2_error_pct"] == pytest.approx(100 * np.median(np.abs(views[err])))
    after = terms.loc["after the fact"]
    assert after["compute_pct"] == pytest.approx(0.0, abs=1e-9) and after["S_pct"] == pytest.approx(0.0, abs=1e-9)
    assert after["communication_pct"] == pytest.approx(-after["median_abs_T2_error_pct"])  # predicted too low
    assert after["driver"] == "the communication l + V/B"
    assert after["communication_pct"] == pytest.approx(-100 * np.median(0.1 / views["T2_ms"]))
    assert terms.loc["a priori", "compute_pct"] > 0  # eta_halves 0.7 against 0.8 in the split: too much compute
    assert "predicted too low (-" in val.errors_sentence(val.error_terms(apriori, table))


def test_error_terms_names_the_compute_when_eta_was_wrong():
    frame = synthetic_frame(eta=0.6, eta_halves=1.0, hiddens=(512, 1024))  # the halves ran far better
    terms = val.error_terms(val.apriori_table(frame, LINK), val.validation_table(frame, LINK)).set_index("view")
    assert terms.loc["a priori", "driver"] == "the compute C/(2 eta)"


def _terms(apriori_pct, after_pct, apriori_driver="the communication l + V/B", after_driver=None):
    rows = []
    for view, pct, driver in (("a priori", apriori_pct, apriori_driver),
                              ("after the fact", after_pct, after_driver or apriori_driver)):
        shares = {c: (-pct if name == driver else 1.0) for c, name in val.TERMS}
        rows.append({"view": view, "median_abs_T2_error_pct": pct, **shares, "driver": driver})
    return pd.DataFrame(rows)


def test_errors_sentence_says_which_prediction_was_closer_both_ways_and_ties():
    apriori_closer = val.errors_sentence(_terms(14.9, 16.6))
    assert apriori_closer.startswith("The a-priori prediction of T2 was the closer: median error 14.9% against 16.6%")
    assert ("largest term of the a-priori error: the communication l + V/B, predicted too low (-14.9% of the "
            "measured T2; the serial part S +1.0%, the compute C/(2 eta) +1.0%)") in apriori_closer
    after_closer = val.errors_sentence(_terms(16.6, 14.9, "the compute C/(2 eta)", "the serial part S"))
    assert after_closer.startswith("The after-the-fact prediction of T2 was the closer: median error 14.9% against "
                                   "16.6% a priori")
    assert "a-priori error: the compute C/(2 eta), predicted too low" in after_closer
    assert "after-the-fact error: the serial part S, predicted too low (-14.9%" in after_closer
    tie = val.errors_sentence(_terms(15.02, 14.98))  # both print as 15.0%
    assert tie.startswith("The two predictions of T2 were off by the same median 15.0%")
    assert "closer" not in tie


def _row(t1, t2, pred):
    return pd.Series({"batch": 64, "hidden": 448, "T1_ms": t1, "T2_ms": t2, "T2_pred_ms": pred})


def test_pays_sentence_from_the_measured_and_the_predicted_speedup():
    text = val.pays_sentence(_row(3.70, 7.40, 2.53))  # the run's case: measured slower, the budget said faster
    assert "the split took 7.4 ms against 3.7 ms on one device (0.50x: it does not pay)" in text
    assert "predicted 2.53 ms (1.46x: it pays)" in text
    assert "(2.00x: it pays)" in val.pays_sentence(_row(4.0, 2.0, 8.0))
    assert "(0.50x: it does not pay)." in val.pays_sentence(_row(4.0, 2.0, 8.0))
    tie = val.pays_sentence(_row(4.0, 4.001, 4.0))
    assert tie.count("1.00x: as fast as one device") == 2 and "pay" not in tie


def _overlap(*measured):
    return pd.DataFrame({"chunks": [1, 2, 4][:len(measured)], "measured_ms": measured,
                         "no_overlap_ms": [1.0, 1.2, 1.6][:len(measured)],
                         "ideal_overlap_ms": [0.6, 0.7, 0.9][:len(measured)]})


def test_overlap_sentence_gain_none_and_loss():
    assert val.overlap_sentence(_overlap(1.0, 0.8, 0.9)).startswith("Overlap bought 20%: k = 2 chunks took 0.8 ms "
                                                                    "against 1 ms with k = 1")
    same = val.overlap_sentence(_overlap(1.0, 1.003, 1.2))
    assert same.startswith("Overlap bought nothing measurable: k = 2") and "within 0.5%" in same
    loss = val.overlap_sentence(_overlap(1.0, 1.6, 2.7))
    assert "every chunk count took longer than k = 1" in loss and "k = 2, took 60% longer" in loss


def _replicas(one_ms, replica_ms, split_ms, batch=64):
    return pd.DataFrame([{"setup": s, "batch": batch, "hidden": 448, "latency_ms": ms,
                          "throughput_rows_per_s": n * batch / (ms / 1e3)}
                         for s, n, ms in (("one device", 1, one_ms), ("two replicas", 2, replica_ms),
                                          ("one split layer", 1, split_ms))])


def test_replicas_sentence_both_ways_and_ties():
    run = val.replicas_sentence(_replicas(3.70, 3.55, 7.40))
    assert "the replicas finish more rows per second (two replicas 2.08x, the split 0.50x" in run
    assert "the split answers one batch later than one device (7.4 ms against 3.7 ms" in run
    big = val.replicas_sentence(_replicas(4.0, 8.0, 1.0))  # replicas that slow each other, a split that flies
    assert "the split finishes more rows per second" in big and "sooner than one device" in big
    tie = val.replicas_sentence(_replicas(4.0, 4.0, 2.0))
    assert "both finish as many rows per second" in tie
    assert "as soon as one device" in val.replicas_sentence(_replicas(4.0, 4.0, 4.0001))
    small = _replicas(1.0, 1.0, 1.0, batch=8)
    small["hidden"] = 64
    assert val.replicas_sentence(pd.concat([small, _replicas(3.70, 3.55, 7.40)])).startswith("Layer 64x448")


def test_layer_frame_budget_note_rounds_the_budget_to_three_figures():
    out = {"rows": [{"rank": 0, "mode": "whole"}], "round_s": [0.1], "dropped": []}
    frame = st.layer_frame([out], 11.394433, 5)
    assert st.budget_note(frame) == "Every size fitted the 11.4 s budget."
    assert frame.attrs["budget_s"] == 11.394433  # the budget itself is kept whole


def test_replicas_sentence_says_how_much_longer_a_replica_waited():
    run = val.replicas_sentence(_replicas(28.5287, 31.4566, 16.7143))
    assert "a replica 31.5 ms, 10% longer than on one device alone)." in run
    shorter = val.replicas_sentence(_replicas(3.70, 3.55, 7.4))
    assert "a replica 3.55 ms, 4% shorter than on one device alone)." in shorter
    assert "as long as on one device alone" in val.replicas_sentence(_replicas(4.0, 4.001, 2.0))


def test_describe_break_even_keeps_three_figures():
    b = val.BreakEven(95.0e6, 1.26, "")
    assert val.describe_break_even(b) == "95.0 MFLOP (one-rank compute C = 1.26 ms)"
    assert val.describe_break_even(val.BreakEven(245.4e6, 3.8, "")) == "245 MFLOP (one-rank compute C = 3.80 ms)"
