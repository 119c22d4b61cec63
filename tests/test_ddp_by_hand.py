"""labutils.experiments.ddp_by_hand and labutils.model.ddp_hand: the four ways and the sharded step on
2 and 3 real gloo ranks against torch DDP (gradients, updates, the collectives each rank made), and
the arithmetic of the buckets, the estimates and the memory table."""

import math

import pandas as pd
import pytest
import torch

from labutils.core.inputs import LabInputError
from labutils.experiments import ddp_by_hand as hand
from labutils.experiments.ddp_step import build_mlp
from labutils.model import ddp_hand
from labutils.model.ddp_model import mlp_bucket_sizes, mlp_param_count
from labutils.model.fit import LinkFit, allreduce_ms

SMALL = hand.Model(width=64, depth=3, batch_per_rank=8, bucket_mb=0.015)  # a layer is 16.6 kB: 3 buckets


# --- the arithmetic ------------------------------------------------------------------------------------


def test_each_way_sends_the_whole_gradient_in_its_own_pieces():
    w, d = 64, 3
    total = 4 * mlp_param_count(w, d)
    per = ddp_hand.way_allreduce_bytes("per_parameter", w, d)
    assert per == [4 * w * w, 4 * w] * d and sum(per) == total
    assert ddp_hand.way_allreduce_bytes("flat", w, d) == [total]
    assert ddp_hand.way_allreduce_bytes("overlapped", w, d) == per[::-1]
    buckets = ddp_hand.way_allreduce_bytes("bucketed", w, d, 0.015)
    assert buckets == [4 * w + 4 * w * w] * 3 == ddp_hand.way_allreduce_bytes("ddp", w, d, 0.015)
    assert buckets == mlp_bucket_sizes(w, d, 0.015)  # DDP's packing with an explicit cap
    with pytest.raises(LabInputError, match="way"):
        ddp_hand.way_allreduce_bytes("ring", w, d)


def test_the_bucket_assignment_packs_as_the_model_says():
    model = build_mlp(64, 3)
    for cap_mb in (0.001, 0.015, 0.05, 10.0):
        got = [sum(p.numel() * 4 for p in b) for b in hand.bucket_assignment(model.parameters(), cap_mb * 2**20)]
        assert got == ddp_hand.way_allreduce_bytes("bucketed", 64, 3, cap_mb), cap_mb
    last = hand.bucket_assignment(model.parameters(), 1)[0]
    assert last[0] is list(model.parameters())[-1]  # reverse order: the last layer's bias first


def test_estimates_add_one_alpha_per_allreduce_and_overlap_only_for_the_ways_during_backward():
    one = ddp_hand.way_comm_ms("flat", 64, 3, 0.015, 2, 1.0, 100.0)
    assert one == pytest.approx(allreduce_ms(4 * mlp_param_count(64, 3), 2, 1.0, 100.0))
    six = ddp_hand.way_comm_ms("per_parameter", 64, 3, 0.015, 2, 1.0, 100.0)
    assert six - one == pytest.approx(5 * 0.1)  # five more all-reduces, the same bytes
    assert ddp_hand.step_estimates_ms("flat", 1, 4, 0.5, 3) == (8.5, 8.5)
    assert ddp_hand.step_estimates_ms("bucketed", 1, 4, 0.5, 3) == (8.5, 5.5)
    assert ddp_hand.step_estimates_ms("overlapped", 1, 2, 0.5, 3) == (6.5, 4.5)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_memory_table_arithmetic(n):
    p = mlp_param_count(64, 3)
    k = math.ceil(p / n)
    table = ddp_hand.memory_table(p, n)
    assert table.loc["parameters", "DDP (bytes)"] == 4 * p and table.loc["Adam moments", "DDP (bytes)"] == 8 * p
    assert table.loc["gradients", "sharded (bytes)"] == 4 * k and table.loc["Adam moments", "sharded (bytes)"] == 8 * k
    assert table.loc["parameters", "sharded (bytes)"] == 4 * k * n >= 4 * p
    assert table.loc["total", "DDP (bytes)"] == 16 * p
    assert table.loc["total", "sharded / DDP"] == pytest.approx((4 * k * n + 12 * k) / (16 * p))
    assert ddp_hand.shard_elements(10, 3) == 4


# --- on real ranks -------------------------------------------------------------------------------------


def _numels(calls):
    return [n for _, n in calls]


@pytest.mark.parametrize("n", [2, 3])
def test_the_four_ways_and_the_sharded_step_equal_ddp_on_real_ranks(n):
    check = hand.check_ways(SMALL, n, "gloo", "cpu", timeout_s=120)
    assert check["matches_ddp"].all() and (check["max_rel_diff"] < 1e-5).all(), check
    assert check["same_calls"].all()
    w, d = SMALL.width, SMALL.depth
    per = [w * w, w] * d
    assert _numels(check.loc["per_parameter", "calls"]) == per
    assert _numels(check.loc["flat", "calls"]) == [sum(per)]
    got = _numels(check.loc["overlapped", "calls"])  # backward's order: last layer first (weight, bias either way)
    assert sorted(got) == sorted(per) and set(got[:2]) == {w * w, w}
    assert _numels(check.loc["bucketed", "calls"]) == [b // 4 for b in ddp_hand.way_allreduce_bytes(
        "bucketed", w, d, SMALL.bucket_mb)]
    assert (check["bytes"] == 4 * sum(per)).all()

    sharded = hand.check_sharded(SMALL, n, "gloo", "cpu", steps=2, timeout_s=120)
    padded = ddp_hand.shard_elements(sum(per), n) * n
    assert sharded.equal and sharded.rel_diff < 1e-5
    assert sharded.calls == [("reduce_scatter", padded), ("all_gather", padded)] * 2
    table = ddp_hand.memory_table(sum(per), n)
    assert (table[["DDP (bytes)", "sharded (bytes)"]].to_numpy() == sharded.held.to_numpy()).all()
    assert "equals DDP's" in hand.sharded_sentence(sharded, table, n)


def test_the_ways_are_timed_beside_ddp_and_set_against_their_estimates():
    times = hand.time_ways(SMALL, 0.5, 2, "gloo", "cpu", timeout_s=120, min_reps=2)
    assert list(times.index) == ["local", *ddp_hand.WAYS, "ddp"]
    assert (times["step_ms"] > 0).all() and (times["reps"] >= 2).all()
    assert (times["step_max_ms"] >= times["step_ms"] - 1e-9).all()
    link = LinkFit(alpha_us=50.0, busbw_GBps=2.0, world_size=2, backend="gloo", device="cpu")
    table = hand.estimates_table(times, SMALL, 2, link)
    assert list(table.index) == [*ddp_hand.WAYS, "ddp"]
    assert (table["ideal_overlap_est_ms"] <= table["no_overlap_est_ms"]).all()
    assert table.loc["flat", "ideal_overlap_est_ms"] == table.loc["flat", "no_overlap_est_ms"]
    assert "Fastest of the four" in hand.ways_sentence(table)


def _times(d, b, ddp):
    return pd.DataFrame({"measured_ms": [30.0, b, 20.0, d, ddp], "position": ["above", "above", "between", "between",
                                                                            "below"]},
                        index=[*ddp_hand.WAYS, "ddp"])


def test_ways_sentence_reads_the_numbers():
    text = hand.ways_sentence(_times(10.0, 12.0, 10.2))
    assert "Fastest of the four: bucketed (10 ms)" in text and "slowest: per_parameter (30 ms)" in text
    assert "0.83x the flat" in text and "as fast as DDP" in text and "2 above, 2 between, 1 below" not in text
    assert "1 below, 2 between, 2 above" in text
    assert "slower than DDP" in hand.ways_sentence(_times(15.0, 12.0, 10.0))


def test_rs_ag_table_and_sentence_from_a_sweep():
    rows = []
    for size, ar, rs, ag in ((1024, 100.0, 60.0, 50.0), (1 << 20, 1000.0, 400.0, 500.0)):
        for op, t in (("all_reduce", ar), ("reduce_scatter", rs), ("all_gather", ag)):
            rows.append({"op": op, "size_bytes": size, "time_us": t, "busbw_GBps": 1.0, "world_size": 2})
    link = LinkFit(alpha_us=10.0, busbw_GBps=1.0, world_size=2, backend="gloo", device="cpu")
    table = hand.rs_ag_table(pd.DataFrame(rows), link)
    assert table["ar_over_rs_ag"].tolist() == pytest.approx([100 / 110, 1000 / 900])
    # two phases, each alpha + (N-1)/N bytes / busbw: 2 x (10 + 0.5 x 1048.576) us
    assert table["rs_plus_ag_est_us"].iloc[-1] == pytest.approx(2 * (10 + 0.5 * 1048.576))
    text = hand.rs_ag_sentence(table)
    assert text.startswith("At 1MiB one all-reduce took 1 ms, more time than") and "1.11x their sum" in text


def test_rel_diff_is_the_worst_tensor():
    a = [torch.ones(4), torch.ones(2)]
    assert hand.rel_diff(a, a) == 0.0
    assert hand.rel_diff([torch.ones(4), torch.tensor([1.0, 1.1])], a) == pytest.approx(0.1 / math.sqrt(2), rel=1e-5)


def _check(rel=(0.0, 1e-7, 2e-7, 0.0), same=(True,) * 4):
    frame = pd.DataFrame({"max_rel_diff": rel, "all_reduces": [8, 1, 8, 4], "bytes": 4096, "same_calls": same},
                         index=list(ddp_hand.WAYS))
    frame["matches_ddp"] = frame["max_rel_diff"] < hand.GRAD_TOLERANCE
    return frame


def test_check_sentence_and_the_figures():
    text = hand.check_sentence(_check())
    assert text.startswith("All 4 ways equal torch DDP's gradients (worst relative difference 2.0e-07")
    assert "per_parameter 8, flat 1, overlapped 8, bucketed 4" in text and "the same 4KiB" in text
    assert hand.check_sentence(_check(rel=(0.0, 0.3, 0.0, 0.0))).startswith("flat do NOT equal")
    assert hand.check_sentence(_check(same=(True, True, False, True))).startswith("overlapped do NOT")
    table = _times(10.0, 12.0, 8.0).assign(error_no_overlap=[0.1, 0.3, 0.0, 0.0, 0.0])
    rs = pd.DataFrame({"ar_over_rs_ag": [0.9, 1.2], "est_error": [0.1, 0.2]}, index=["1KB", "1MB"])
    figures = hand.summary_figures(_check(), table, rs)
    assert figures["ddp_hand_max_grad_rel_diff"][0] == 2e-7 and figures["ddp_hand_bucketed_over_torch"][0] == 1.25
    assert figures["allreduce_over_rs_ag"][:2] == (1.2, "x") and figures["ddp_hand_no_overlap_error"][0] == 0.2
    assert figures["rs_ag_estimate_error"][0] == 0.2
