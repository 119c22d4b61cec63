"""labutils.model.sizing: sizes from the machine's rates, for the five machines of model.run_time."""

import math

import pytest

from labutils.core.inputs import LabInputError
from labutils.model import budget, sizing
from labutils.model.run_time import MACHINES

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
        comm = 2 * (2 - 1) / 2 * sizing.ddp_gradient_bytes(width, 4) / (r.busbw_GBps * 1e9)
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
        sizing.ddp_plan(RATES["laptop"], quick=False, budget_s=0)
