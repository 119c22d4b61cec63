"""Repetitions from a time budget: counts fit the share within [min, max], the cut flag, the budget
shared over sizes, the largest sizes dropped first."""

import pytest

from labutils.model.repetitions import Reps, dropped_sentence, fit_sizes, plan_reps, share_budget


def test_reps_fill_the_share():
    plan = plan_reps(round_s=0.01, share_s=0.5, min_reps=5, max_reps=200)
    assert plan == Reps(50, budget_cut=True, fits=True)
    assert plan.reps * 0.01 <= 0.5 < (plan.reps + 1) * 0.01


def test_the_maximum_caps_a_cheap_round_and_the_budget_did_not_cut_it():
    assert plan_reps(1e-4, 2.0, 5, 400) == Reps(400, budget_cut=False, fits=True)
    assert plan_reps(0.0, 2.0, 5, 400) == Reps(400, budget_cut=False, fits=True)


def test_the_minimum_holds_when_the_budget_is_too_small():
    assert plan_reps(0.3, 1.0, 5, 100) == Reps(5, budget_cut=True, fits=False)
    assert plan_reps(0.2, 1.0, 5, 100) == Reps(5, budget_cut=True, fits=True)  # exactly fits


def test_a_smaller_budget_gives_fewer_reps():
    counts = [plan_reps(0.004, share, 2, 1000).reps for share in (0.02, 0.2, 2.0)]
    assert counts == [5, 50, 500]


def test_the_budget_is_shared_evenly_and_what_the_cap_leaves_goes_to_the_others():
    assert share_budget([0.1, 0.1], 2.0, 5, 100) == pytest.approx([1.0, 1.0])
    # the cheap size reaches 50 rounds in 0.05 s: the other two share the rest beyond their one round
    shares = share_budget([0.2, 0.001, 0.5], 3.0, 1, 50)
    assert shares == pytest.approx([1.325, 0.05, 1.625]) and sum(shares) == pytest.approx(3.0)


def test_every_kept_size_gets_its_minimum_within_the_budget():
    rounds = [0.01, 0.1]  # 5 x 0.11 = 0.55 s fits 0.6 s; an even split would give the second 3 rounds
    assert fit_sizes(rounds, 0.6, 5) == ([0, 1], [])
    shares = share_budget(rounds, 0.6, 5, 100)
    plans = [plan_reps(r, s, 5, 100) for r, s in zip(rounds, shares)]
    assert all(p.fits for p in plans) and sum(p.reps * r for p, r in zip(plans, rounds)) <= 0.6 + 1e-12
    assert [p.reps for p in plans] == [7, 5]


def test_every_size_kept_when_the_minimum_fits():
    assert fit_sizes([0.01, 0.02, 0.04], 1.0, 5) == ([0, 1, 2], [])


def test_the_largest_size_is_dropped_first():
    # 5 x (0.01 + 0.02 + 0.2) = 1.15 s > 1 s; without the largest 0.15 s fits
    assert fit_sizes([0.01, 0.02, 0.2], 1.0, 5) == ([0, 1], [2])
    assert fit_sizes([0.05, 0.01, 0.1], 0.31, 5) == ([0, 1], [2])  # the largest, even when another costs more
    assert fit_sizes([0.01, 0.3, 0.5], 0.2, 5) == ([0], [1, 2])


def test_the_smallest_size_is_always_kept():
    kept, dropped = fit_sizes([1.0, 2.0], 0.5, 5)
    assert kept == [0] and dropped == [1]
    assert not plan_reps(1.0, 0.5, 5, 100).fits


def test_the_sentence_names_the_dropped_sizes():
    assert "Every size" in dropped_sentence([], 2.0, 5)
    text = dropped_sentence([(512, 6144, 24576)], 1.5, 15)
    assert "(512, 6144, 24576)" in text and "15 repetitions" in text and "1.5 s" in text
