"""labutils.course.plans: the notebooks' budgets, handed out as a clock."""

import pytest

from labutils.core.inputs import LabInputError
from labutils.course.plans import FULL_BUDGET_S, QUICK_BUDGET_S, SHARES, Budget, budget_s


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_budget_s_defaults_and_checks():
    assert budget_s(False) == FULL_BUDGET_S == 40.0 and budget_s(True) == QUICK_BUDGET_S == 12.0
    assert budget_s(True, 30) == 30.0
    for bad in (0, -5, 1e6, float("nan"), "40"):
        with pytest.raises(LabInputError, match="budget_s"):
            budget_s(False, bad)


def test_shares_come_out_of_what_is_left():
    clock = FakeClock()
    budget = Budget("07_validating_the_budget", 40.0, clock)
    clock.now += 4.0  # rank start-up and the link: paid from the budget
    first = budget.share("before the split")
    assert first == pytest.approx(36.0 * 0.3)
    clock.now += 20.0  # the first experiment overran its share
    second = budget.share("the split")
    assert second == pytest.approx(16.0 * 0.45 / 0.7)
    clock.now += second
    assert budget.share("overlap") == pytest.approx(40.0 - 24.0 - second)
    with pytest.raises(LabInputError, match="overlap"):
        budget.share("overlap")  # each once


def test_an_exhausted_budget_gives_zero_not_a_negative_share():
    clock = FakeClock()
    budget = Budget("08_data_parallel_training", 12.0, clock)
    clock.now += 30.0
    assert budget.share("one rank") == 0.0 and budget.left_s() < 0


def test_every_measuring_notebook_shares_all_of_its_budget():
    for name, fractions in SHARES.items():
        assert sum(fractions.values()) == pytest.approx(1.0), name
    with pytest.raises(LabInputError, match="06_time_budget"):
        Budget("06_time_budget", 10.0)
