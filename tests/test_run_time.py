"""labutils.model.run_time with labutils.course.plans: every notebook in bounded time on five machines."""

import pytest

from labutils.course.plans import notebook_plan
from labutils.course.runner import find_notebooks, notebook_parameters
from labutils.model.run_time import MACHINES, Machine, Measurement, NotebookPlan, predict

NOTEBOOKS = {p.stem: notebook_parameters(p) for p in find_notebooks()}


@pytest.mark.parametrize("key", sorted(MACHINES))
@pytest.mark.parametrize("quick, limit_s", [(False, 60.0), (True, 20.0)])
def test_every_notebook_fits_its_limit_on_every_machine(key, quick, limit_s):
    machine = MACHINES[key]
    for name, params in NOTEBOOKS.items():
        got = predict(machine, notebook_plan(name, machine, {**params, "quick": quick}))
        assert got.total_s < limit_s, (name, got.parts_s)
        assert got.total_s == pytest.approx(sum(got.parts_s.values()))


def test_the_plans_read_the_notebooks_parameters():
    machine = MACHINES["laptop"]
    params = NOTEBOOKS["04_ring_by_hand"]
    few = predict(machine, notebook_plan("04_ring_by_hand", machine, {**params, "sizes": [4096]}))
    many = predict(machine, notebook_plan("04_ring_by_hand", machine, params))
    assert len(notebook_plan("04_ring_by_hand", machine, params).measurements[0].rounds_s) == len(params["sizes"])
    # the budget bounds the measuring, whatever the number of sizes
    assert few.parts_s["hand ring"] <= many.parts_s["hand ring"] * 1.5
    longer = predict(machine, notebook_plan("09_validating_the_budget", machine, {"budget_s": 80.0}))
    shorter = predict(machine, notebook_plan("09_validating_the_budget", machine, {"budget_s": 20.0}))
    assert longer.total_s > shorter.total_s + 15  # the small sizes reach their repetition cap


def _machine(**kw):
    base = dict(name="m", cores=4, gpus=0, flops_per_s=1e10, alpha_us=100.0, busbw_GBps=1.0, memory_bytes=1e10,
                startup_s=2.0, kernel_s=1.0, call_s=0.0, figure_s=0.0)
    return Machine(**{**base, **kw})


def test_startup_comes_out_of_the_budget():
    m = Measurement("x", (0.01,), 1.0, warmup=0, min_reps=1, max_reps=10**6)
    plan = NotebookPlan("n", budget_s=10.0, rank_sets=1, calls=0, figures=0, measurements=(m,))
    fast, slow = predict(_machine(startup_s=1.0), plan), predict(_machine(startup_s=5.0), plan)
    assert fast.parts_s["x"] == pytest.approx(9.0, abs=0.02)
    assert slow.parts_s["x"] == pytest.approx(5.0, abs=0.02)
    assert fast.total_s == pytest.approx(slow.total_s, abs=0.05)  # the clock bounds both


def test_a_size_whose_minimum_does_not_fit_is_dropped():
    m = Measurement("x", (0.1, 5.0), 1.0, warmup=1, min_reps=3, max_reps=100)
    got = predict(_machine(startup_s=0.0), NotebookPlan("n", 20.0, 0, 0, 0, (m,)))
    assert got.dropped == ("x",)
    # both sizes warmed up and probed (10.2 s of the 20); 4 rounds of both would not fit the 9.8 s
    # left, so the large one is dropped and the small one gets 1 untimed round and 97 repetitions
    assert got.parts_s["x"] == pytest.approx(2 * (0.1 + 5.0) + (1 + 97) * 0.1)
    assert got.parts_s["x"] <= 20.0 + 1e-9


def test_ranks_sharing_one_gpu_share_its_rate():
    one = _machine(gpus=1, flops_per_s=4e13)
    assert one.route == "one-gpu" and one.rates(2).flops_per_s == 2e13
    assert _machine(gpus=8, flops_per_s=4e13).rates(2).flops_per_s == 4e13
    assert _machine(gpus=0).route == "cpu"
