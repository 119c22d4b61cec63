"""Tensor parallelism: the toy split, the MLP block on ranks, precision, the step timer, tp-check."""

import math
import time

import numpy as np
import pandas as pd
import pytest
import torch

from labutils.core.inputs import LabInputError
from labutils.experiments import tensor_parallel as tp
from labutils.model import toy_split as toy

# --- the toy split ---------------------------------------------------------------------------------


def test_toy_split_is_exact_in_integers():
    split = toy.toy_split()
    assert split.pre_activations[0].tolist() == [[1, 1]]
    assert split.hidden[1].tolist() == [[0, 4]]  # ReLU([-1, 4])
    assert min(int(p.min()) for p in split.pre_activations) < 0, "ReLU must matter in the example"
    assert [c.tolist() for c in split.contributions] == [[[1, 1]], [[-4, 8]]]
    assert split.total.dtype == np.int64
    assert split.total.tolist() == toy.toy_whole().tolist() == [[-3, 9]]


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_toy_split_any_even_cut_sums_to_the_whole(parts):
    assert np.array_equal(toy.toy_split(parts=parts).total, toy.toy_whole())


def test_toy_split_rejects_an_uneven_cut():
    with pytest.raises(LabInputError, match="parts=3"):
        toy.toy_split(parts=3)


def test_launchers_refuse_a_rank_count_that_does_not_divide_the_layer():
    with pytest.raises(LabInputError, match="nproc=3"):
        tp.run_tp_check(3, size=(8, 64))


def test_wrong_split_across_relu_differs():
    assert toy.relu_of_sum_vs_sum_of_relu(2, -3) == (0, 2)
    wrong = toy.toy_wrong_split()
    assert not np.array_equal(wrong.total, toy.toy_whole())
    # without ReLU the row split would be right: the sum of partial pre-activations is x A
    assert np.array_equal(sum(wrong.pre_activations), toy.TOY_X @ toy.TOY_A)


# --- the MLP block -----------------------------------------------------------------------------------


def test_shards_are_slices_of_the_same_full_weights():
    full = tp.mlp_weights(16, 64, seed=3)
    parts = [tp.shard(full, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p.W1 for p in parts], dim=1), full.W1)
    assert torch.equal(torch.cat([p.W2 for p in parts], dim=0), full.W2)
    assert torch.equal(tp.mlp_weights(16, 64, seed=3).W1, full.W1)
    assert not torch.equal(tp.mlp_weights(16, 64, seed=4).W1, full.W1)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shards", [2, 4])
def test_summed_partials_match_the_whole_within_dtype_tolerance(dtype, shards):
    w = tp.mlp_weights(64, 256, seed=1, dtype=dtype)
    x = tp.mlp_input(8, 64, seed=1, dtype=dtype)
    diff = tp.compare(tp.summed_partials(x, w, shards), tp.summed_partials(x, w, 1))
    assert diff["max_rel"] <= tp.tolerance(dtype, 256, shards)


def test_tolerance_separates_rounding_from_a_wrong_split():
    w = tp.mlp_weights(64, 256, seed=2, dtype="bfloat16")
    x = tp.mlp_input(8, 64, seed=2, dtype="bfloat16")
    right = tp.summed_partials(x, w, 1)
    # the wrong split: ReLU applied to each half of a row-split pre-activation
    halves = [x[:, :32] @ w.W1[:32] + w.b1 / 2, x[:, 32:] @ w.W1[32:] + w.b1 / 2]
    wrong = sum(torch.relu(h) for h in halves) @ w.W2 + w.b2
    assert tp.compare(wrong, right)["max_rel"] > 5 * tp.tolerance("bfloat16", 256, 2)
    assert tp.tolerance("float32", 256) < tp.tolerance("float16", 256) < tp.tolerance("bfloat16", 256)


def test_precision_study_shapes_and_ordering():
    frame = tp.precision_study((8, 64), shard_counts=(1, 2, 4))
    assert set(frame["dtype"]) == {"float32", "bfloat16", "float16"}
    assert frame["within"].all()
    assert (frame[frame["shards"] == 1]["vs_whole_rel"] == 0).all()
    worst = frame.groupby("dtype")["max_rel"].max()
    assert worst["float32"] < worst["float16"] < worst["bfloat16"]
    assert len(frame[frame["shards"] == 4]) == 2 * 3  # both summation orders, three dtypes


def _errors(dtype_errors):
    """A precision_study-shaped table: {dtype: [(shards, max_rel), ...]} (several rows per count: the orders)."""
    import pandas as pd
    return pd.DataFrame([{"dtype": d, "shards": n, "max_rel": e} for d, rows in dtype_errors.items() for n, e in rows])


@pytest.mark.parametrize("rows, words", [
    ([(1, 6.8e-3), (2, 9.4e-3), (8, 1.2e-2), (8, 1.1e-2)], "it grows with the number of partials, 1.76x"),
    ([(1, 6.8e-3), (2, 9.4e-3), (4, 8.2e-3)], "larger with 4 shards than whole, though not at every step"),
    ([(1, 6.8e-3), (2, 6.8e-3), (4, 8.2e-3)], "larger with 4 shards than whole, though not at every step, 1.21x"),
    ([(1, 6.83e-3), (2, 6.83e-3), (4, 6.81e-3)], "the same whole and with 4 shards"),
    ([(1, 3.0e-7), (2, 3.2e-7), (4, 2.9e-7)], "smaller with 4 shards than whole, by 1.03x"),
    ([(1, 6.8e-3)], "one shard count only"),
])
def test_shard_error_sentence_says_what_the_numbers_say(rows, words):
    sentence = tp.shard_error_sentence(_errors({"bfloat16": rows, "float32": [(1, 1.0), (2, 9.0)]}), "bfloat16")
    assert sentence.startswith("bfloat16: largest error against float64 ") and words in sentence, sentence
    if len(rows) > 1:
        assert "6.8e-03 whole" in sentence or "3.0e-07 whole" in sentence


def test_shard_error_sentence_takes_the_worse_order_and_refuses_a_missing_dtype():
    sentence = tp.shard_error_sentence(_errors({"float16": [(1, 1e-3), (4, 9e-4), (4, 2e-3)]}), "float16")
    assert "2.0e-03 with 4 shards" in sentence and "grows" in sentence
    with pytest.raises(LabInputError, match="dtype='float32'"):
        tp.shard_error_sentence(_errors({"float16": [(1, 1e-3)]}), "float32")


def test_shard_error_sentence_on_a_measured_table():
    frame = tp.precision_study((8, 64), dtypes=("bfloat16",), shard_counts=(1, 2, 4))
    sentence = tp.shard_error_sentence(frame, "bfloat16")
    worst = frame.groupby("shards")["max_rel"].max()
    assert f"{worst[1]:.1e} whole" in sentence and f"{worst[4]:.1e} with 4 shards" in sentence


@pytest.mark.parametrize("whole, split, comm, compute, words", [
    (4.0, 2.5, 0.5, 2.0, ["speedup 1.60x, the split faster than the whole", "0.25x its compute", "shorter than"]),
    (3.0, 4.0, 3.0, 1.5, ["speedup 0.75x, the split slower than the whole", "2.00x its compute", "longer than"]),
    (3.0, 2.999, 1.0, 1.001, ["speedup 1.00x, the split as fast as the whole", "1.00x its compute", "as long as"]),
    (3.0, 2.0, 0.0, 1.0, ["0 us, 0.00x its compute", "shorter than"]),
])
def test_split_step_sentence_both_ways_and_ties(whole, split, comm, compute, words):
    sentence = tp.split_step_sentence(whole, split, comm, compute, 2)
    assert sentence.startswith("The split over 2 ranks took")
    for w in words:
        assert w in sentence, (w, sentence)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_split_step_sentence_refuses_times_that_are_not_times(bad):
    with pytest.raises(LabInputError, match="split_ms"):
        tp.split_step_sentence(1.0, bad, 0.1, 0.5, 2)


def test_layer_size_bytes_and_flops():
    size = tp.as_size((32, 64))
    assert size.ffn == 256
    assert size.flops == 4 * 32 * 64 * 256
    assert size.output_bytes("float32") == 32 * 64 * 4
    assert size.output_bytes("bfloat16") == 32 * 64 * 2
    with pytest.raises(LabInputError, match="batch"):
        tp.LayerSize(0, 64)


# --- the step timer ----------------------------------------------------------------------------------


def test_timer_parts_sum_to_the_total():
    def step(timer):
        with timer.section("compute"):
            time.sleep(0.02)
        with timer.section("communication"):
            time.sleep(0.01)
        time.sleep(0.005)  # untimed: lands in serial
        with timer.section("serial"):
            time.sleep(0.003)
        return "done"

    result, t = tp.timed_step(step)
    assert result == "done"
    assert math.isclose(t.serial_ms + t.compute_ms + t.communication_ms, t.total_ms, rel_tol=1e-9)
    assert t.compute_ms >= 20 and t.communication_ms >= 10
    assert t.serial_ms >= 8 and t.gap_ms >= 5
    assert t.total_ms >= 38


def test_timer_rejects_unknown_sections():
    def step(timer):
        with timer.section("computing"):
            pass

    with pytest.raises(LabInputError, match="computing"):
        tp.timed_step(step)


def test_block_step_on_one_process_is_the_whole_block():
    w = tp.mlp_weights(32, 128, seed=0)
    x = tp.mlp_input(4, 32, seed=0)
    out, t = tp.timed_step(lambda timer: tp.tp_block_step(x, w, "relu", timer))
    assert torch.allclose(out, tp.mlp_block(x, w))
    assert t.compute_ms > 0 and t.communication_ms >= 0


def test_weights_are_drawn_in_float32_on_the_device_and_cast():
    w = tp.mlp_weights(16, 64, seed=7, device="cpu")
    assert w.W1.dtype == torch.float32 and w.W1.device.type == "cpu" and w.W1.shape == (16, 64)
    # every dtype slices the same numbers: float64 holds the float32 draw exactly
    assert torch.equal(tp.mlp_weights(16, 64, seed=7, dtype="float64").W1, w.W1.double())
    assert abs(float(w.W1.std()) * math.sqrt(16) - 1.0) < 0.1  # scaled 1 / sqrt(fan_in)
    x = tp.mlp_input(4, 16, seed=7)
    assert x.dtype == torch.float32 and not torch.equal(x, w.W1[:4, :16])


def test_weights_come_from_the_cache_and_the_cache_stays_bounded(monkeypatch):
    tp._weight_cache.clear()
    first = tp.mlp_weights(16, 64, seed=11)
    assert tp.mlp_weights(16, 64, seed=11) is first  # not drawn again
    assert tp.mlp_weights(16, 64, seed=11, dtype="bfloat16") is not first  # the dtype is part of the key
    one = sum(t.numel() * t.element_size() for t in (first.W1, first.b1, first.W2, first.b2))
    monkeypatch.setattr(tp, "WEIGHT_CACHE_LIMIT_BYTES", int(1.5 * one))
    tp._weight_cache.clear()
    tp.mlp_weights(16, 64, seed=11)
    tp.mlp_weights(16, 64, seed=12)  # two would pass the limit: the cache is emptied first
    assert len(tp._weight_cache) == 1
    assert torch.equal(tp.mlp_weights(16, 64, seed=11).W1, first.W1)  # drawn again, the same numbers
    tp._weight_cache.clear()


# --- on ranks ------------------------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_weights_are_drawn_on_the_gpu_alike_on_two_ranks():
    from rank_workers import weights_worker

    from labutils.measure.pool import launch

    out = launch(weights_worker, 2, backend="gloo", device="cuda", timeout_s=120)
    assert out[0]["checksum"] == out[1]["checksum"] and out[0]["first"] == out[1]["first"]
    assert all(o["dtype"] == "torch.float32" and o["device"].startswith("cuda") and o["cached"] for o in out)


@pytest.mark.distributed
def test_two_ranks_draw_the_same_weights_in_float32_on_their_device():
    from rank_workers import weights_worker

    from labutils.measure.pool import launch

    out = launch(weights_worker, 2, timeout_s=90)
    assert out[0]["checksum"] == out[1]["checksum"] and out[0]["first"] == out[1]["first"]
    assert out[0]["checksum"] == pytest.approx(tp.weights_checksum(tp.mlp_weights(32, 128, 5)))
    assert all(o["dtype"] == "torch.float32" and o["device"] == "cpu" and o["cached"] for o in out)



@pytest.mark.distributed
def test_toy_on_four_ranks_is_exact():
    """One hidden column per rank; ranks 0+1 hold device 1's half of the article, 2+3 device 2's."""
    from labutils.measure.pool import launch

    out = launch(tp.toy_worker, 4, timeout_s=90)
    parts = [np.array(r["contribution"]) for r in out]
    assert (parts[0] + parts[1]).tolist() == [[1, 1]] and (parts[2] + parts[3]).tolist() == [[-4, 8]]
    assert all(r["total"] == [[-3, 9]] for r in out)


@pytest.mark.distributed
def test_two_rank_block_equals_the_whole():
    frame = tp.run_tp_check(2, size=(8, 64), dtypes=("float32", "bfloat16"), timeout_s=60)
    assert len(frame) == 4 and frame["ok"].all()
    assert set(frame["dtype"]) == {"float32", "bfloat16"}
    assert (frame["max_rel"] <= frame["tolerance"]).all()


def test_cli_rejects_bad_input_with_exit_status_2(capsys):
    from labutils.cli import main

    assert main(["tp-check", "--dtypes", "float8"]) == 2
    assert "float8" in capsys.readouterr().err
    assert main(["tp-check", "--nproc", "3"]) == 2


def test_split_step_sentence_names_the_rank_whose_all_reduce_and_compute_it_compares():
    sentence = tp.split_step_sentence(3.883, 2.977, 0.5757, 1.9376, 2, rank=1)
    assert "took 2.977 ms" in sentence and "(step_ms:" in sentence
    assert "On rank 1, the slower, the all-reduce took 576 us, 0.30x that rank's compute (1938 us)" in sentence


def test_slower_split_rank_is_the_split_rank_with_the_longest_total():
    steps = pd.DataFrame({"mode": ["whole", "split", "split"], "rank": [0, 0, 1], "total_ms": [9.0, 2.86, 2.90],
                          "communication_ms": [0.0, 0.772, 0.576], "compute_ms": [3.7, 1.77, 1.94]})
    row = tp.slower_split_rank(steps)
    assert row["rank"] == 1 and row["communication_ms"] == 0.576 and row["compute_ms"] == 1.94
    with pytest.raises(LabInputError, match="split"):
        tp.slower_split_rank(steps[steps["mode"] == "whole"])


def test_timing_size_sentence_predicts_the_chosen_block_from_the_rate():
    # 16 * 128 * 384^2 = 302 MFLOP at 98.5 GFLOP/s: 3.07 ms, not the 2 ms compute_size aims at before rounding
    sentence = tp.timing_size_sentence(98.5e9, 128, 384)
    assert "the 128x384 block" in sentence and "= 302 MFLOP" in sentence and "about 3.1 ms" in sentence
    with pytest.raises(LabInputError, match="flops_per_s"):
        tp.timing_size_sentence(0.0, 128, 384)


def test_ulps_apart_counts_rounding_steps_at_the_largest_output():
    ref = torch.tensor([1.5, -0.25, 0.0], dtype=torch.bfloat16)  # max 1.5: spacing 2^-7 in [1, 2)
    one_step = ref.clone()
    one_step[0] = 1.5 + 2.0 ** -7
    assert tp.ulps_apart(one_step, ref) == 1.0
    assert tp.ulps_apart(ref, ref) == 0.0


def test_vs_whole_sentence_says_ulps_and_whether_every_split_agreed():
    frame = pd.DataFrame({"dtype": ["bfloat16"] * 4, "shards": [1, 2, 4, 4],
                          "order": ["0..0", "0..1", "0..3", "3..0"],
                          "vs_whole_rel": [0.0, 8.8106e-3, 8.8106e-3, 8.8106e-3],
                          "vs_whole_ulps": [0.0, 1.0, 1.0, 1.0]})
    sentence = tp.vs_whole_sentence(frame, "bfloat16")
    assert sentence == ("split vs whole at most 8.8e-03 of max|whole| (vs_whole_rel): one ulp of bfloat16 at its "
                        "largest output, the same at every shard count and order")
    frame.loc[3, ["vs_whole_rel", "vs_whole_ulps"]] = [1.76e-2, 2.0]
    assert "2 ulps of bfloat16" in tp.vs_whole_sentence(frame, "bfloat16")
    assert "the same" not in tp.vs_whole_sentence(frame, "bfloat16")
    with pytest.raises(LabInputError, match="float16"):
        tp.vs_whole_sentence(frame, "float16")


def test_precision_study_orders_reversed_from_three_shards_on():
    frame = tp.precision_study((8, 32), ("bfloat16",), (1, 2, 4), 0)
    assert list(frame["order"]) == ["ranks 0..0", "ranks 0..1", "ranks 0..3", "ranks 3..0"]
    assert (frame["vs_whole_ulps"] >= 0).all() and frame["vs_whole_ulps"].iloc[0] == 0.0
