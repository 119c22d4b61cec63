"""Ring all-reduce by hand: the simulation sums, the bytes give 2(N-1)/N, trees, and a real 4-rank run."""

import math

import matplotlib
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError
from labutils.experiments import hand_ring
from labutils.model import ring
from labutils.model.fit import latency_term_us
from labutils.show import ring_draw

matplotlib.use("Agg")


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_simulation_equals_the_plain_sum_and_sends_2_N_minus_1_over_N(n):
    run = ring.simulate_ring(ring.small_inputs(n, chunk_elements=3, seed=n))
    assert run.is_correct()
    assert (run.result == run.inputs.sum(axis=0)).all()
    ring.check_ring_run(run)
    assert len(run.steps) == 2 * (n - 1)
    size = run.inputs.shape[1]
    for sent in (run.elements_sent(), run.elements_received()):
        assert sent.tolist() == [2 * (n - 1) * size // n] * n
        assert sent[0] / size == pytest.approx(bus_factor("all_reduce", n))
    assert run.bytes_sent(4)[0] == pytest.approx(ring.ring_bytes_per_rank(4 * size, n))


def test_each_step_every_rank_sends_one_chunk_to_its_right_neighbour():
    run = ring.simulate_ring(ring.digit_inputs(4))
    for step in run.steps:
        assert sorted(t.src for t in step.transfers) == [0, 1, 2, 3]
        assert all(t.dst == (t.src + 1) % 4 for t in step.transfers)
    after_rs = run.steps[2]  # after reduce-scatter, rank r holds the full sum of chunk r+1
    for r in range(4):
        c = (r + 1) % 4
        assert after_rs.contributors[r, c].all()
        assert after_rs.values[r, c] == (c + 1) * 1111
    assert run.steps[0].values[1].tolist() == [11, 20, 30, 40]  # rank 0's chunk 0 arrived and was added
    assert [s.phase for s in run.steps] == ["reduce-scatter"] * 3 + ["all-gather"] * 3


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 9), st.integers(0, 11), st.integers(0, 2**31 - 1))
def test_any_inputs_and_uneven_chunks_sum_exactly(n, extra, seed):
    data = np.random.default_rng(seed).integers(-50, 50, size=(n, n + extra))
    run = ring.simulate_ring(data)
    assert run.is_correct()
    assert int(run.elements_sent().sum()) == 2 * (n - 1) * (n + extra)  # every element goes round twice


def test_bad_inputs_are_refused():
    with pytest.raises(LabInputError, match="integers"):
        ring.simulate_ring(np.ones((2, 4)))
    with pytest.raises(LabInputError, match="2-D"):
        ring.simulate_ring(np.ones(4, dtype=int))
    with pytest.raises(LabInputError, match="length"):
        ring.simulate_ring(np.ones((4, 3), dtype=int))
    with pytest.raises(LabInputError, match="world_size"):
        ring.digit_inputs(7)


def test_bytes_table_derives_the_factor():
    table = ring.bytes_table((2, 3, 4, 8), size_bytes=1e6)
    assert table["sent_per_rank_bytes"].tolist() == pytest.approx(table["formula_2(N-1)/N_x_size"].tolist())
    assert table["steps"].tolist() == [2, 4, 6, 14]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 16, 33, 64])
def test_trees_are_trees_with_at_most_two_children(n):
    for parents in (ring.btree_parents(n), *ring.double_tree_parents(n)):
        assert sum(p < 0 for p in parents) == 1
        assert max((parents.count(r) for r in range(n)), default=0) <= 2
        for r in range(n):  # every rank reaches the root, no cycle
            seen, x = set(), r
            while x >= 0:
                assert x not in seen
                seen.add(x)
                x = parents[x]
        depth = max(len(_path(parents, r)) for r in range(n)) - 1
        assert depth <= math.ceil(math.log2(n)) if n > 1 else depth == 0


def _path(parents, r):
    out = [r]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out


@pytest.mark.parametrize("n", [4, 5, 8, 16, 31, 64])
def test_double_tree_sends_the_ring_s_bytes_a_plain_tree_does_not(n):
    size = 1e6
    ring_max = ring.bytes_sent_per_rank("ring", size, n).max()
    double = ring.bytes_sent_per_rank("double_tree", size, n).max()
    plain = ring.bytes_sent_per_rank("tree", size, n).max()
    assert ring_max == pytest.approx(2 * (n - 1) / n * size)
    assert double == pytest.approx(2 * size)  # 2 size, the ring's limit
    assert plain == pytest.approx(3 * size)  # an inner rank: one copy up, two down


def test_latency_terms_and_model():
    ns = np.array([2, 4, 8, 16])
    assert ring.steps_each_way("ring", ns).tolist() == [1, 3, 7, 15]
    assert ring.steps_each_way("tree", ns).tolist() == [1, 2, 3, 4]
    t = ring.allreduce_model_us("ring", 1e6, 8, 5.0, 10.0)
    assert t == pytest.approx(latency_term_us(8, 5.0, "ring") + 1.75e6 / 1e4)
    assert ring.allreduce_model_us("double_tree", 0, 64, 5.0, 10.0) == pytest.approx(latency_term_us(64, 5.0, "tree"))
    assert ring.allreduce_model_us("ring", 1e6, 1, 5.0, 10.0) == 0.0
    table = ring.ring_vs_tree_table()
    assert (table["tree latency_us"] <= table["ring latency_us"]).all()
    with pytest.raises(LabInputError, match="algorithm"):
        ring.steps_each_way("star", 4)


def test_drawing_has_one_panel_per_step_with_the_numbers():
    run = ring.simulate_ring(ring.digit_inputs(4))
    fig = ring_draw.draw_ring(run)
    drawn = [ax for ax in fig.axes if ax.patches]
    assert len(drawn) == 7
    texts = {t.get_text() for t in drawn[-1].texts}
    assert {"1111", "2222", "3333", "4444"} <= texts
    assert "step 3: reduce-scatter 3/3" in drawn[3].get_title()


def test_real_ring_on_four_gloo_ranks_equals_all_reduce():
    frame = hand_ring.run_hand_ring(sizes=(16, 1000, 40000), nproc=4, time_it=False, timeout_s=90)
    assert frame["wrong"].tolist() == [0, 0, 0]
    assert frame["size_bytes"].tolist() == [16, 1000, 40000]
    assert (frame["world_size"] == 4).all()


def test_real_ring_is_timed_against_the_library():
    frame = hand_ring.run_hand_ring(sizes=(4096,), nproc=3, budget_ms=5, timeout_s=90)
    row = frame.iloc[0]
    assert row["wrong"] == 0 and row["hand_ring_us"] > 0 and row["all_reduce_us"] > 0
    assert row["ratio"] == pytest.approx(row["hand_ring_us"] / row["all_reduce_us"])
    assert row["hand_ring_busbw_GBps"] == pytest.approx(4096 / row["hand_ring_us"] / 1e3 * 4 / 3)


def test_table_lists_every_message_with_the_numbers_sent():
    run = ring.simulate_ring(ring.digit_inputs(3))
    table = run.table()
    assert len(table) == 3 * 2 * 2
    first = table.iloc[0]
    assert (first["from rank"], first["to rank"], first["chunk"], first["sent"], first["receiver's chunk after"]) == (
        0, 1, 0, "1", "11")
    gathered = table[table["phase"] == "all-gather"]
    assert (gathered["sent"] == gathered["receiver's chunk after"]).all()


def test_bytes_sentence_says_more_the_same_or_less_from_the_numbers():
    table = ring.ring_vs_tree_table((2, 4, 128), size_bytes=64e6)
    said = ring.bytes_sentence(table)
    assert "1.00 at N = 2, 1.33 at N = 4, 1.01 at N = 128" in said
    assert "as much as the ring at N = 2; more than the ring at N = 4 to 128" in said
    assert "2.00 at N = 4" in ring.bytes_sentence(table, "tree")
    fewer = table.assign(**{"double_tree sent/size": table["ring sent/size"] * [1.0, 0.5, 0.5]})
    assert "as much as the ring at N = 2; less than the ring at N = 4 to 128" in ring.bytes_sentence(fewer)
    with pytest.raises(LabInputError, match="algorithm"):
        ring.bytes_sentence(table, "ring")


def test_fastest_sentence_names_the_winner_per_n_and_the_ties():
    large = ring.fastest_sentence(ring.ring_vs_tree_table(size_bytes=64e6), 64e6)
    assert large == ("In this model, a 64 MB all-reduce: at N = 2 all three take the same time; at N = 4 to 16 "
                     "the ring is the fastest; at N = 32 to 128 the double binary tree is the fastest.")
    small = ring.fastest_sentence(ring.ring_vs_tree_table((2, 8), size_bytes=1e3), 1e3)
    assert "at N = 8 the plain binary tree and the double binary tree tie as the fastest" in small
    assert "a 1 kB all-reduce" in small and ring.decimal_size(512) == "512 bytes"
    assert ring.times_words(2.0, 1.5) == "1.33x" and ring.times_words(1.0, 1.004) == "the same as"


def test_ratio_sentence_says_slower_as_fast_or_faster_from_the_ratios():
    import pandas as pd

    frame = pd.DataFrame({"size_bytes": [16 << 20, 4096, 65536, 1 << 20], "ratio": [0.8, 3.1, 1.5, 1.05]})
    said = hand_ring.ratio_sentence(frame)
    assert said == ("Hand ring time over the library's all_reduce time: 3.10 at 4K, 1.50 at 64K, 1.05 at 1M, "
                    "0.80 at 16M. The hand ring was slower at 4K to 64K; about as fast (within 10%) at 1M; "
                    "faster at 16M.")
    tie = hand_ring.ratio_sentence(pd.DataFrame({"size_bytes": [4096], "ratio": [0.95], "backend": "gloo"}))
    assert tie.startswith("Hand ring time over gloo's all_reduce time: 0.95 at 4K.")
    assert tie.endswith("The hand ring was about as fast (within 10%) at 4K.")
