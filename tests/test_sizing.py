"""labutils.model.sizing: sizes from the machine's rates (the five machines of model.run_time), and
repetitions from a time budget: counts fit the share within [min, max], the cut flag, the budget
shared over sizes, the largest sizes dropped first."""

import math

import pytest

from labutils.core.inputs import LabInputError
from labutils.model import budget, sizing
from labutils.model.run_time import MACHINES
from labutils.model.sizing import Reps, dropped_sentence, fit_sizes, plan_reps, share_budget

RATES = {key: m.rates(2) for key, m in MACHINES.items()}


@pytest.mark.parametrize("key", sorted(RATES))
def test_break_even_hidden_is_where_the_budget_breaks_even(key):
    r = RATES[key]
    for batch in (8, 64, 1024):
        h = sizing.break_even_hidden(batch, r)
        c_ms = sizing.block_flops(batch, h) / r.flops_per_s * 1e3
        # the article's budget at eta = 1, one all-reduce of V = 4 b H bytes at busbw
        be = budget.break_even_C_ms(1.0, 1, r.alpha_us / 1e3, sizing.block_volume_bytes(batch, h), r.busbw_GBps)
        assert c_ms == pytest.approx(float(be), rel=1e-9)


@pytest.mark.parametrize("key", sorted(RATES))
@pytest.mark.parametrize("quick", [False, True])
def test_layer_plan_spans_the_break_even_on_every_machine(key, quick):
    plan = sizing.layer_plan(RATES[key], quick)
    assert plan.batch & (plan.batch - 1) == 0 and 8 <= plan.batch <= 8192
    assert all(h % sizing.ROUND_TO == 0 for h in plan.hidden_sizes)
    assert list(plan.hidden_sizes) == sorted(set(plan.hidden_sizes))
    assert plan.hidden_sizes[0] < plan.break_even_hidden < plan.hidden_sizes[-1]
    wanted = sorted(plan.hidden_sizes + plan.too_big)
    assert wanted[-1] / wanted[0] >= 8  # two octaves on either side, rounded (memory may cut the top)
    assert len(plan.hidden_sizes) + len(plan.too_big) in ((4, 5) if quick else (7, 8, 9))  # rounding may merge two
    assert plan.overlap_size[1] in plan.hidden_sizes and plan.timing_size[1] in plan.hidden_sizes
    assert plan.chunk_counts[-1] <= plan.batch


def test_layer_batch_grows_with_the_device_rate():
    slow, fast = RATES["laptop"], RATES["h200"]
    assert sizing.layer_batch(fast) > sizing.layer_batch(slow)
    b = sizing.layer_batch(slow)
    assert sizing.break_even_hidden(b, slow) <= 8 * b < sizing.break_even_hidden(b // 2, slow) * 2 * 8


def test_layer_plan_leaves_out_sizes_that_do_not_fit_memory():
    r = RATES["h200"]
    small = sizing.Rates(r.flops_per_s, r.alpha_us, r.busbw_GBps, memory_bytes=3 * 48 * 6000**2)
    plan = sizing.layer_plan(small, quick=False)
    assert plan.too_big and all(sizing.layer_memory_bytes(plan.batch, h) > small.memory_bytes / 3 for h in plan.too_big)
    assert all(sizing.layer_memory_bytes(plan.batch, h) <= small.memory_bytes / 3 for h in plan.hidden_sizes)
    assert "left out" in plan.why


@pytest.mark.parametrize("key", sorted(RATES))
def test_ddp_batch_makes_compute_and_all_reduce_of_one_order(key):
    r = RATES[key]
    b = sizing.ddp_batch(r)
    for width in (256, 1024, 4096):
        compute = sizing.ddp_step_flops(width, 4, b) / r.flops_per_s
        comm = 2 * (2 - 1) / 2 * sizing.mlp_gradient_bytes(width, 4) / (r.busbw_GBps * 1e9)
        if 4 < b < 65536:  # not clamped: within the power-of-two rounding
            assert 1 / math.sqrt(2) - 0.01 <= compute / comm <= math.sqrt(2) * 1.01


@pytest.mark.parametrize("key", sorted(RATES))
def test_ddp_plan_fills_but_does_not_overrun_the_budget(key):
    r = RATES[key]
    plan = sizing.ddp_plan(r, quick=False, budget_s=24.0)
    assert len(plan.widths) == 4 and list(plan.widths) == sorted(plan.widths)
    assert plan.widths[-1] / plan.widths[0] == pytest.approx(8, rel=0.2)
    assert plan.widest_step_s * 12 * 9 <= 24.0 * 2  # the widest model's runs fit about the budget
    assert sizing.ddp_plan(r, quick=True, budget_s=8.0).widths[-1] <= plan.widths[-1]


def test_rates_refuse_impossible_values():
    with pytest.raises(LabInputError, match="busbw_GBps"):
        sizing.Rates(1e10, 100.0, 0.0, 1e9)
    with pytest.raises(LabInputError, match="flops_per_s"):
        sizing.Rates(-1.0, 100.0, 1.0, 1e9)
    with pytest.raises(LabInputError, match="budget_s"):
        sizing.ddp_plan(RATES["laptop"], quick=False, budget_s=-1)


# --- repetitions from a time budget -------------------------------------------------------------------

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


def test_compute_size_takes_about_the_target_on_any_device():
    for flops in (5e10, 2.5e13, 7.9e13):
        b, h = sizing.compute_size(flops, target_ms=2.0)
        assert b & (b - 1) == 0 and h % sizing.ROUND_TO == 0
        ms = sizing.block_flops(b, h) / flops * 1e3
        assert 0.5 <= ms <= 8.0  # b rounded to a power of two, H to 32: within a factor 4 of 2 ms


@pytest.mark.parametrize("key", sorted(RATES))
def test_the_split_pays_only_above_the_plans_break_even(key):
    """With the machine's own rates, T2 - T1 (eta 0.9) changes sign inside 09's sizes."""
    r = RATES[key]
    plan = sizing.layer_plan(r, quick=False)
    wins = []
    for b, h in plan.sizes:
        c_ms = sizing.block_flops(b, h) / r.flops_per_s * 1e3
        t = budget.evaluate(0.0, c_ms, 0.9, 1, r.alpha_us / 1e3, sizing.block_volume_bytes(b, h), r.busbw_GBps)
        wins.append(bool(t.t_two_ms < t.t_one_ms))
    assert wins[0] is False and wins[-1] is True and wins == sorted(wins)


def test_ranks_sharing_one_gpu_show_the_budgets_never_with_numbers():
    """Two ranks time-sharing an H200: eta near 0.5, and the budget says never, naming why."""
    r = RATES["h200"]
    b, h = sizing.layer_plan(r, quick=False).sizes[-1]
    c_ms = sizing.block_flops(b, h) / r.flops_per_s * 1e3
    t = budget.evaluate(0.05, c_ms, 0.5, 1, r.alpha_us / 1e3, sizing.block_volume_bytes(b, h), r.busbw_GBps)
    assert math.isinf(t.break_even_C_ms) and "eta <= 0.5" in budget.verdict(t)


def test_ddp_batch_follows_the_link_per_flop():
    cpu, one, eight = (sizing.ddp_plan(RATES[k], quick=False, budget_s=30.0) for k in ("laptop", "h200", "h100x8"))
    assert one.batch_per_rank > eight.batch_per_rank > cpu.batch_per_rank  # gloo through the host: few bytes per flop
    quick = sizing.ddp_plan(RATES["h200"], quick=True, budget_s=8.0)
    assert quick.steps < one.steps and len(quick.widths) < len(one.widths)


def test_layer_plan_why_names_the_hidden_sizes_h_and_h_star_as_notebook_08():
    plan = sizing.layer_plan(RATES["laptop"], quick=False)
    assert f"break-even near hidden size h* = {plan.break_even_hidden:.0f} (eta = 1)" in plan.why
    assert f"h = {plan.hidden_sizes[0]}..{plan.hidden_sizes[-1]} spans it" in plan.why
    assert "H =" not in plan.why  # 08's H is the communication time, not a hidden size
