"""The two-device budget held against a measured split layer: inputs, predictions, break-even, the protocol."""

import math

import numpy as np
import pandas as pd
import pytest

from labutils import budget
from labutils import validation as val
from labutils.fit import LinkFit
from labutils.inputs import LabInputError
from labutils.tensor_parallel import LayerSize


def test_measure_refuses_a_rank_count_that_does_not_divide_the_layer():
    with pytest.raises(LabInputError, match="nproc=3"):
        val.measure([(8, 64)], 3)


# --- estimating the budget from measurements -------------------------------------------------------------

LINK = LinkFit(alpha_us=200.0, busbw_GBps=2.0, world_size=2, backend="gloo", device="cpu")  # latency 0.2 ms


def synthetic_frame(S_ms=0.05, eta=0.8, ms_per_mflop=0.0125, hiddens=(32, 64, 128, 256, 512, 1024), batch=16):
    """Timings that follow the budget exactly: whole = S + C, split = S + C/(2 eta) + l + V/B."""
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
    assert list(summary["quantity"])[:3] == ["link", "break-even, measured", "break-even, predicted"]
    replicas = frame[frame["mode"] == "whole"].assign(mode="replica", ranks=2)
    out = val.replicas_table(pd.concat([frame, replicas]))
    two = out[out["setup"] == "two replicas"]["throughput_rows_per_s"].to_numpy()
    one = out[out["setup"] == "one device"]["throughput_rows_per_s"].to_numpy()
    assert np.allclose(two, 2 * one)


def test_overlap_table_bounds():
    frame = synthetic_frame(hiddens=(256,))
    split = frame[frame["mode"] == "split"]
    runs = [split.assign(mode="overlap", chunks=k) for k in (1, 2, 4)]
    table = val.overlap_table(pd.concat([frame[frame["mode"] == "whole"], *runs]), LINK)
    assert list(table["chunks"]) == [1, 2, 4]
    assert (table["overlap_bound_ms"] <= table["no_overlap_ms"]).all()
    # more chunks, more latencies: the no-overlap prediction grows by l per extra chunk
    assert np.allclose(np.diff(table["no_overlap_ms"]), [LINK.latency_ms, 2 * LINK.latency_ms])
    with pytest.raises(LabInputError, match="chunks=1"):
        val.overlap_table(pd.concat([frame[frame["mode"] == "whole"], runs[1]]), LINK)


# --- on ranks ------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_measure_protocol_structure():
    frame = val.measure([(4, 32), (4, 64)], 2, ("whole", "split"), quick=True, timeout_s=120)
    assert set(frame["mode"]) == {"whole", "split"}
    assert len(frame[frame["mode"] == "whole"]) == 2  # rank 0 only
    assert len(frame[frame["mode"] == "split"]) == 4  # both ranks
    assert (frame[frame["mode"] == "whole"]["communication_ms"] < 0.05).all()
    parts = frame[["serial_ms", "compute_ms", "communication_ms"]].sum(axis=1)
    assert (parts > 0).all() and (frame["reps"] >= 5).all()
    table = val.validation_table(frame, LINK)
    assert len(table) == 2 and np.isfinite(table["T2_pred_ms"]).all()
