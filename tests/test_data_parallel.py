"""Data-parallel training: DDP gradients equal one-rank gradients, timing adds up, predictions hold."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from rank_workers import bucket_layout_worker, gradient_worker, reference_gradient

from labutils.core.busbw import binary_size
from labutils.core.inputs import LabInputError
from labutils.course import machine
from labutils.experiments import data_parallel, ddp_step
from labutils.experiments import split_timing as st
from labutils.measure.pool import launch
from labutils.model import ddp_model
from labutils.model.fit import allreduce_ms

NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# --- the model and its gradient size ---------------------------------------------------------

@pytest.mark.parametrize("target_mb", [1, 16, 200])
def test_width_for_gradient_size_lands_close(target_mb):
    target = target_mb * 2**20
    width = ddp_model.mlp_for_gradient_bytes(target, depth=4)
    assert abs(ddp_model.mlp_gradient_bytes(width, 4) - target) / target < 0.01


def test_gradient_bytes_count_the_real_parameters():
    model = ddp_step.build_mlp(96, 3)
    assert ddp_model.mlp_gradient_bytes(96, 3) == 4 * sum(p.numel() for p in model.parameters())


def test_bad_inputs_name_the_parameter():
    with pytest.raises(LabInputError, match="target_bytes"):
        ddp_model.mlp_for_gradient_bytes(10)
    with pytest.raises(LabInputError, match="mode"):
        ddp_step.StepConfig(64, mode="fast")
    with pytest.raises(LabInputError, match="busbw_GBps"):
        allreduce_ms(1e6, 2, -1)
    with pytest.raises(LabInputError, match="global_batch"):
        ddp_step.rank_slice(7, 0, 2)


def test_bucket_count_follows_ddp_packing():
    mib = 2**20
    # reverse order: 1 MiB fills the first (1 MiB) bucket, then 25 MiB buckets
    assert len(ddp_model.ddp_bucket_sizes([10 * mib] * 6 + [mib], 25)) == 1 + 2
    assert len(ddp_model.ddp_bucket_sizes([40 * mib] * 3, 25)) == 3  # a tensor over the cap closes its bucket
    assert len(ddp_model.ddp_bucket_sizes([mib // 4] * 3, 25)) == 1  # all fits in the first
    assert len(ddp_model.ddp_bucket_sizes([mib // 4] * 8, 25)) == 2  # 1 MiB, then the rest
    width = ddp_model.mlp_for_gradient_bytes(64 * mib)
    assert ddp_model.mlp_bucket_count(width, 4, 1000) < ddp_model.mlp_bucket_count(width, 4, 1)


def test_only_the_default_cap_has_a_small_first_bucket():
    assert ddp_model.first_bucket_mb(ddp_model.DEFAULT_BUCKET_MB) == ddp_model.FIRST_BUCKET_MB == 1.0
    assert ddp_model.first_bucket_mb(4) == 4.0
    assert ddp_step.ddp_cap_mb(25) is None and ddp_step.ddp_cap_mb(4) == 4.0
    # 4 layers of 512: 1,050,624 bytes each; the default cap closes a first bucket of one layer
    assert ddp_model.mlp_bucket_sizes(512, 4, 25) == [1050624, 3151872]
    assert ddp_model.mlp_bucket_sizes(512, 4, 4) == [4202496]
    assert ddp_model.mlp_bucket_sizes(512, 4, 1) == [1050624] * 4


@pytest.mark.distributed
def test_the_bucket_model_matches_the_buckets_ddp_builds():
    if not hasattr(torch.distributed, "GradBucket"):
        pytest.skip("this PyTorch does not expose DDP's buckets")
    caps = [25.0, 4.0, 1.0]
    built = launch(bucket_layout_worker, 2, kwargs={"width": 512, "depth": 4, "caps": caps}, timeout_s=120)[0]
    for cap in caps:
        assert sorted(built[cap]) == sorted(ddp_model.mlp_bucket_sizes(512, 4, cap)), cap


# --- prediction formulas ------------------------------------------------------------------------

def test_comm_formula_matches_the_article():
    # 200 MB on a 22 GB/s link: ~9 ms on 2 ranks, ~16 ms on 8
    assert allreduce_ms(200e6, 2, 22) == pytest.approx(200e6 / 22e6, rel=1e-9)
    assert allreduce_ms(200e6, 8, 22) == pytest.approx(1.75 * 200e6 / 22e6, rel=1e-9)
    assert allreduce_ms(200e6, 1, 22, alpha_us=500, buckets=8) == 0.0
    assert allreduce_ms(1e6, 2, 1, alpha_us=100, buckets=4) == pytest.approx(0.4 + 1.0)
    assert math.isinf(allreduce_ms(1e6, 2, 0))
    arr = allreduce_ms(np.array([1e6, 2e6]), 2, 1.0)
    assert np.allclose(arr, [1.0, 2.0])


def test_step_prediction_bounds():
    row = {"gradient_bytes": 10e6, "forward_ms": 2.0, "backward_ms": 4.0, "optimizer_ms": 1.0}
    p = ddp_model.predict_step(row, 2, busbw_GBps=1.0, alpha_us=0.0)
    assert p.comm_ms == pytest.approx(10.0)
    assert p.no_overlap_ms == pytest.approx(17.0)  # sum
    assert p.overlap_ms == pytest.approx(13.0)  # 2 + max(4, 10) + 1
    fast = ddp_model.predict_step(row, 2, busbw_GBps=100.0)
    assert fast.overlap_ms == pytest.approx(7.0)  # comm hidden entirely behind backward
    assert fast.overlap_ms <= fast.no_overlap_ms


def test_predicted_efficiency_limits_and_scaling_kinds():
    n = np.array([2, 4, 8])
    weak = ddp_model.predicted_efficiency(100e6, 10.0, 50.0, n)  # comm 10, 15, 17.5 ms
    assert np.allclose(weak, 50 / (50 + np.array([10, 15, 17.5])))
    assert np.all(np.diff(weak) < 0)  # more ranks, more traffic per rank
    assert ddp_model.predicted_efficiency(100e6, 10.0, 50.0, 1) == 1.0
    assert ddp_model.predicted_efficiency(100e6, 10.0, 50.0, 2, hideable=1.0) == 1.0  # comm 10 < compute 50
    strong = ddp_model.predicted_efficiency(100e6, 10.0, 50.0, 2, scaling="strong")
    assert strong == pytest.approx(50 / (2 * (25 + 10)))
    assert strong < weak[0]  # the same comm behind half the compute
    assert ddp_model.predicted_efficiency(1e6, 0.0, 5.0, 2) == 0.0  # no link: never


def test_min_busbw_inverts_the_efficiency():
    bw = ddp_model.min_busbw_for_efficiency(64e6, 60.0, 4, efficiency=0.9, alpha_us=200, buckets=3)
    assert ddp_model.predicted_efficiency(64e6, bw, 60.0, 4, alpha_us=200, buckets=3) == pytest.approx(0.9)
    assert math.isinf(ddp_model.min_busbw_for_efficiency(64e6, 1.0, 2, efficiency=0.9, alpha_us=1e6))


# --- tables from a summary (synthetic numbers, no processes) ------------------------------------

def _summary():
    base = {"width": 512, "depth": 4, "gradient_bytes": ddp_model.mlp_gradient_bytes(512, 4), "bucket_cap_mb": 25.0,
            "exposed_comm_ms": 0.0, "allreduce_ms": 0.0, "wait_ms": 0.0, "other_ms": 0.1}
    rows = [dict(base, run=0, mode="single", world_size=1, batch_per_rank=32, forward_ms=1, backward_ms=2,
                 optimizer_ms=0.5, step_ms=3.6),
            dict(base, run=1, mode="single", world_size=1, batch_per_rank=64, forward_ms=2, backward_ms=4,
                 optimizer_ms=0.5, step_ms=6.6),
            dict(base, run=2, mode="ddp", world_size=2, batch_per_rank=32, forward_ms=1, backward_ms=5,
                 optimizer_ms=0.5, step_ms=6.6, exposed_comm_ms=3.0),
            dict(base, run=3, mode="no_overlap", world_size=2, batch_per_rank=32, forward_ms=1, backward_ms=2,
                 optimizer_ms=0.5, step_ms=8.6, allreduce_ms=4.5, wait_ms=0.5, exposed_comm_ms=5.0)]
    return pd.DataFrame(rows)


def test_scaling_table_weak_and_strong():
    table = data_parallel.scaling_table(_summary()).set_index(["mode", "scaling"])
    assert table.loc[("ddp", "weak"), "efficiency"] == pytest.approx(3.6 / 6.6)
    assert table.loc[("ddp", "weak"), "speedup"] == pytest.approx(2 * 3.6 / 6.6)
    assert table.loc[("ddp", "strong"), "speedup"] == pytest.approx(1.0)
    assert table.loc[("no_overlap", "strong"), "efficiency"] == pytest.approx(6.6 / 8.6 / 2)


def test_breakdown_adds_up_and_prediction_table():
    summary = _summary()
    parts = data_parallel.time_breakdown(summary)
    assert np.allclose(parts.drop(columns="step_ms").sum(axis=1), parts["step_ms"])
    assert parts["exposed comm"].tolist() == [0.0, 0.0, 3.0, 4.5]
    assert parts["wait for slowest rank"].tolist() == [0.0, 0.0, 0.0, 0.5]
    pred = data_parallel.prediction_table(summary, busbw_GBps=1.0, alpha_us=0.0).set_index("mode")
    comm = summary["gradient_bytes"][0] / 1e6
    assert pred.loc["no_overlap", "no_overlap_pred_ms"] == pytest.approx(3.5 + comm)
    assert pred.loc["ddp", "overlap_pred_ms"] == pytest.approx(1.5 + max(2.0, comm))
    assert pred.loc["no_overlap", "buckets"] == 1


# --- real ranks -------------------------------------------------------------------------------------

WIDTH, DEPTH, PER_RANK = 48, 3, 8


@pytest.fixture(scope="module")
def two_rank_gradients():
    """One launch: each rank's gradient for both modes, fresh and after 3 training steps."""
    runs = [(mode, steps) for mode in ("ddp", "no_overlap") for steps in (0, 3)]
    return launch(gradient_worker, 2, args=(WIDTH, DEPTH, PER_RANK, runs), timeout_s=120, threads_per_rank=1)


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["ddp", "no_overlap"])
def test_two_rank_gradients_equal_one_rank_gradients(two_rank_gradients, mode):
    reference = reference_gradient(WIDTH, DEPTH, 2 * PER_RANK)
    for rank in two_rank_gradients:
        assert rank[(mode, 0)].shape == reference.shape
        np.testing.assert_allclose(rank[(mode, 0)], reference, rtol=1e-4, atol=1e-6)
    # and one half of the batch alone differs: the all-reduce did something
    assert not np.allclose(reference_gradient(WIDTH, DEPTH, PER_RANK), reference, rtol=1e-3)


@pytest.mark.distributed
def test_replicas_stay_equal_over_training_steps(two_rank_gradients):
    # the no-overlap variant all-reduces a flat buffer the gradients live in; if a step broke that,
    # each rank would train on its own gradient and the replicas would drift apart
    first, second = two_rank_gradients
    np.testing.assert_allclose(first[("no_overlap", 3)], second[("no_overlap", 3)], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(first[("no_overlap", 3)], first[("ddp", 3)], rtol=1e-4, atol=1e-6)
    assert not np.allclose(first[("ddp", 3)], first[("ddp", 0)], rtol=1e-3)  # training moved the model


@pytest.mark.distributed
def test_measured_steps_decompose_and_agree():
    configs = [ddp_step.StepConfig(WIDTH, DEPTH, PER_RANK, "ddp", bucket_cap_mb=0.01, steps=4, warmup=1),
               ddp_step.StepConfig(WIDTH, DEPTH, PER_RANK, "no_overlap", steps=3, warmup=1)]
    steps = data_parallel.measure_ddp_steps(configs, 2, backend="gloo", device="cpu", timeout_s=120, progress=False)
    assert steps.groupby("mode").size().to_dict() == {"ddp": 4, "no_overlap": 3}
    parts = steps[list(ddp_step.DDP_SECTIONS) + ["other_ms"]].sum(axis=1)
    assert np.allclose(parts, steps["step_ms"])
    assert (steps["other_ms"] > -1e-9).all()  # sections never add up to more than the step
    assert (steps["other_ms"] <= 0.5 * steps["step_ms"] + 1.0).all()  # and cover most of it
    assert (steps["step_max_ms"] >= steps["step_ms"] - 1e-9).all()
    no_ov = steps[steps["mode"] == "no_overlap"]
    assert (no_ov["allreduce_ms"] > 0).all() and (no_ov["wait_ms"] > 0).all()
    assert np.allclose(no_ov["exposed_comm_ms"], no_ov["wait_ms"] + no_ov["allreduce_ms"])
    ddp = steps[steps["mode"] == "ddp"]
    assert (ddp[["allreduce_ms", "wait_ms"]] == 0).all().all() and (ddp["exposed_comm_ms"] >= 0).all()
    assert (ddp["flat_allreduce_ms"] > 0).all()
    summary = data_parallel.summarize(steps)
    for col in ("step_ms", "backward_ms"):
        assert (summary[f"{col}_p10"] <= summary[col]).all() and (summary[col] <= summary[f"{col}_p90"]).all()


@pytest.mark.distributed
def test_rank_zero_sets_the_step_count():
    cfg = ddp_step.StepConfig(WIDTH, DEPTH, PER_RANK, "single", steps=2, warmup=1, min_time_s=0.05, max_steps=7)
    steps = data_parallel.measure_ddp_steps([cfg, replace(cfg, steps=3, min_time_s=0.0)], 1, backend="gloo",
                                            device="cpu", timeout_s=60, progress=False, interleave=False)
    counts = steps.groupby("run").size()
    assert 2 <= counts[0] <= 7 and counts[1] == 3


def test_a_rank_draws_only_its_rows_and_the_ranks_together_draw_the_global_batch():
    x, y = ddp_step.synthetic_batch(3 * PER_RANK, WIDTH, seed=4)
    parts = [ddp_step.rank_batch(PER_RANK, WIDTH, r, seed=4) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    assert x.dtype == torch.float32 and x.shape == (3 * PER_RANK, WIDTH) and not torch.equal(x, y)
    # the global batch does not depend on how many ranks share it
    halves = torch.cat([ddp_step.rank_batch(PER_RANK // 2, WIDTH, r, seed=4)[0] for r in range(6)])
    assert torch.equal(halves, x)


@pytest.mark.distributed
def test_a_small_budget_gives_fewer_steps_and_says_it_cut_them():
    cfg = ddp_step.StepConfig(WIDTH, DEPTH, PER_RANK, "single", steps=2, warmup=1, max_steps=40)
    steps = data_parallel.measure_ddp_steps([cfg, replace(cfg, batch_per_rank=2 * PER_RANK)], 1, backend="gloo",
                                            device="cpu", timeout_s=60, progress=False, budget_s=1e-5)
    assert steps.groupby("run").size().tolist() == [2, 2] and (steps["reps"] == 2).all() and steps["budget_cut"].all()
    roomy = data_parallel.measure_ddp_steps([cfg], 1, backend="gloo", device="cpu", timeout_s=60, progress=False,
                                            budget_s=5.0)
    assert len(roomy) == 40 and (roomy["reps"] == 40).all() and not roomy["budget_cut"].any()
    summary = data_parallel.summarize(roomy)
    assert summary[["steps", "reps"]].iloc[0].tolist() == [40, 40] and not summary["budget_cut"].iloc[0]


def test_a_spent_budget_leaves_out_the_widest_model_and_says_so():
    run = data_parallel.scaling_experiment([16, 256], DEPTH, PER_RANK, nproc=2, steps=2, warmup=1, backend="gloo",
                                           device="cpu", timeout_s=120, progress=False, contention=False,
                                           budget_s=1e-4)
    assert run.widths == (16,) and run.dropped_widths == (256,) and "256" in run.budget_note
    assert set(run.summary["width"]) == {16} and (run.summary["steps"] == 2).all()  # the least steps, all cut
    assert data_parallel.scaling_table(run.summary)["world_size"].eq(2).all()  # the tables hold what was measured


def test_a_budget_that_is_not_positive_is_refused_before_starting_ranks():
    cfg = ddp_step.StepConfig(WIDTH, DEPTH, PER_RANK, "single")
    with pytest.raises(LabInputError, match="budget_s"):
        data_parallel.measure_ddp_steps([cfg], 1, backend="gloo", device="cpu", budget_s=-1.0)
    with pytest.raises(LabInputError, match="budget_s"):
        data_parallel.scaling_experiment([WIDTH], budget_s=-1.0)


def test_scaling_experiment_measures_no_configuration_twice_and_shares_the_budget(monkeypatch):
    seen = []

    def one_rank(configs, nproc, *args, budget_s=None, **kwargs):
        seen.append((nproc, list(configs), budget_s))
        return pd.DataFrame({"run": range(len(configs)), "width": [c.width for c in configs]})

    def n_ranks(configs, nproc, *args, budget_s=None, ranks=None, **kwargs):
        return one_rank(configs, ranks or nproc, budget_s=budget_s), None  # ranks=1: rank 0 of the pool alone

    monkeypatch.setattr(data_parallel, "measure_ddp_steps", one_rank)
    monkeypatch.setattr(data_parallel, "_launch", n_ranks)
    monkeypatch.setattr(data_parallel, "summarize", lambda frame: frame)
    run = data_parallel.scaling_experiment([64, 64, 128], nproc=2, bucket_caps_mb=(25,), budget_s=9.0,
                                           contention=False)
    (n1, singles, share1), (n2, many, share2) = seen
    assert n1 == 1 and len(singles) == len(set(singles)) == 4  # widths 64 and 128, at b and 2 b
    assert n2 == 2 and len(many) == len(set(many)) == 4  # ddp and no_overlap each; the 25 MiB cap is the default's
    assert share1 + share2 == pytest.approx(9.0) and share1 == pytest.approx(4.5)
    assert run.summary["run"].tolist() == list(range(8)) and run.widths == (64, 128) and not run.dropped_widths
    seen.clear()
    data_parallel.scaling_experiment([64], nproc=1, contention=False)
    assert len(seen[0][1]) == 1 and seen[0][2] is None  # one rank: the global batch is the per-rank one


# --- the widget, without a browser ---------------------------------------------------------------

def test_widget_follows_its_sliders():
    import re

    from labutils.show.ddp_plots import ddp_scaling_dashboard

    dash = ddp_scaling_dashboard(gradient_bytes=100e6, busbw_GBps=10.0, compute_ms=50.0, alpha_us=0.0, buckets=1)
    state = dash.state()
    assert state["error"] is None
    for n in (2, 4, 8):
        assert state["efficiency"][n] == pytest.approx(ddp_model.predicted_efficiency(100e6, 10.0, 50.0, n))
    shown = float(re.search(r'data-key="efficiency-N8" data-value="([^"]+)"', dash.readout.value).group(1))
    assert shown == pytest.approx(state["efficiency"][8])
    before = dash.png()
    dash.sliders["busbw_GBps"].value = 100.0
    faster = dash.state()["efficiency"]
    assert all(faster[n] > state["efficiency"][n] for n in (2, 4, 8))
    assert dash.png() != before and dash.png().startswith(b"\x89PNG")
    dash.sliders["scaling"].value = "strong"
    strong = dash.state()["efficiency"]
    assert all(strong[n] < faster[n] for n in (2, 4, 8))
    assert 'data-scaling="strong"' in dash.readout.value
    dash.sliders["hideable"].value = 1.0
    assert dash.state()["efficiency"][2] == pytest.approx(
        ddp_model.predicted_efficiency(100e6, 100.0, 50.0, 2, hideable=1.0, scaling="strong"))


def test_buckets_are_read_off_the_curve_one_by_one(synthetic_sweep, true_us):
    sweep = synthetic_sweep()
    width = ddp_model.mlp_for_gradient_bytes(32 * 2**20)
    sizes = ddp_model.mlp_bucket_sizes(width, 4, 25)
    assert sum(sizes) == ddp_model.mlp_gradient_bytes(width, 4)
    assert len(sizes) == ddp_model.mlp_bucket_count(width, 4, 25)
    ms, reading = ddp_model.bucket_comm_ms(sweep, sizes)
    assert ms == pytest.approx(sum(true_us(s) for s in sizes) / 1e3, rel=0.05)
    assert len(reading.time_us) == len(sizes)


# --- the two estimates (fake numbers) -----------------------------------------------------------------------

def _estimates_summary(ddp_ms, no_overlap_ms, width=256):
    grad = ddp_model.mlp_gradient_bytes(width, 4)
    base = {"width": width, "depth": 4, "gradient_bytes": grad, "bucket_cap_mb": 25.0, "exposed_comm_ms": 0.0,
            "allreduce_ms": 0.0, "wait_ms": 0.0, "batch_per_rank": 32}
    return pd.DataFrame([
        dict(base, run=0, mode="single", world_size=1, forward_ms=1.0, backward_ms=2.0, optimizer_ms=0.5, step_ms=3.5),
        dict(base, run=1, mode="ddp", world_size=2, forward_ms=1.0, backward_ms=4.0, optimizer_ms=0.5,
             step_ms=ddp_ms, backward_compute_ms=2.0),
        dict(base, run=2, mode="no_overlap", world_size=2, forward_ms=1.0, backward_ms=2.0, optimizer_ms=0.5,
             step_ms=no_overlap_ms, allreduce_ms=no_overlap_ms - 3.5)])


def test_estimates_from_the_curve_hold_a_step_that_overlaps(synthetic_sweep):
    sweep = synthetic_sweep()
    grad_bytes = ddp_model.mlp_gradient_bytes(256, 4)
    comm = ddp_model.bucket_comm_ms(sweep, [grad_bytes])[0]
    lower, upper = 1.5 + max(2.0, comm), 3.5 + comm  # forward + optimizer = 1.5; backward = 2
    inside = data_parallel.prediction_table(_estimates_summary((lower + upper) / 2, upper), 100.0, 0.0,
                                            sweep=sweep).set_index("mode")
    assert inside.loc["ddp", "overlap_pred_ms"] == pytest.approx(lower)
    assert inside.loc["ddp", "no_overlap_pred_ms"] == pytest.approx(upper)
    assert inside.loc["ddp", "between"] and not inside.loc["ddp", "extrapolated"]
    assert inside.loc["ddp", "comm_line_ms"] != pytest.approx(inside.loc["ddp", "comm_pred_ms"])
    assert ddp_model.between_estimates_figure(inside.reset_index()) == "1/1"
    above = data_parallel.prediction_table(_estimates_summary(upper * 1.2, upper), 100.0, 0.0, sweep=sweep)
    assert ddp_model.between_estimates_figure(above) == "0/1"
    with pytest.raises(LabInputError, match="rank count"):
        data_parallel.prediction_table(_estimates_summary(5, 6), 1.0, 0.0, sweep=synthetic_sweep(world_size=4))


def test_is_between_and_where_the_estimates_take_compute_from():
    p = ddp_model.StepPrediction(1.0, 4.0, 0.5, 3.0, 1)
    assert (p.overlap_ms, p.no_overlap_ms) == (5.5, 8.5)
    assert ddp_model.is_between(5.5, p) and ddp_model.is_between(8.5, p) and not ddp_model.is_between(8.6, p)
    assert not ddp_model.is_between(5.4, p)
    cpu, one, eight = (machine.route("10_data_parallel_training", g) for g in (0, 1, 8))
    assert [ddp_model.estimate_compute(r) for r in (cpu, one, eight)] == ["one_rank", "n_rank", "one_rank"]


def test_position_says_below_between_or_above_with_ties_between():
    assert ddp_model.position(5.0, 5.5, 8.5) == "below"
    assert ddp_model.position(5.5, 5.5, 8.5) == ddp_model.position(8.5, 5.5, 8.5) == "between"
    assert ddp_model.position(8.6, 5.5, 8.5) == "above"


def test_contention_table_shows_sum_or_overlap():
    shared = {"backward_ms": 10.0, "allreduce_ms": 6.0, "together_ms": 17.0}
    table = data_parallel.contention_table(shared)
    assert table.loc["no overlap: backward + all-reduce", "ms"] == 16.0
    assert table.loc["ideal overlap: max(backward, all-reduce)", "ms"] == 10.0
    assert table.loc["both together, measured", "vs no overlap"] == pytest.approx(17 / 16)
    assert data_parallel.overlap_verdict(shared).startswith("No overlap")
    assert "each slowed the other" in data_parallel.overlap_verdict(shared)  # 17 > 10 + 6
    assert "slowed" not in data_parallel.overlap_verdict(dict(shared, together_ms=16.0))  # the sum exactly
    assert data_parallel.overlap_verdict({"backward_ms": 10.0, "allreduce_ms": 6.0,
                                          "together_ms": 11.0}).startswith("Overlap")


@pytest.mark.distributed
def test_contention_probe_runs_on_two_cpu_ranks():
    out = launch(ddp_step.contention_worker, 2, kwargs={"width": 48, "depth": 2, "batch_per_rank": 8, "reps": 2},
                 timeout_s=120)
    assert out[0] == out[1]  # every figure is the slowest rank's, the same on both
    assert out[0]["backward_ms"] > 0 and out[0]["allreduce_ms"] > 0 and out[0]["together_ms"] > 0


def test_bucket_size_range_covers_every_all_reduce_of_the_runs():
    widths = [ddp_model.mlp_for_gradient_bytes(m * 2**20) for m in (2, 64)]
    low, high = ddp_model.bucket_size_range(widths, 4, (1, 4))
    every = [b for w in widths for b in ddp_model.mlp_bucket_sizes(w, 4, 25)]
    every += [b for c in (1, 4) for b in ddp_model.mlp_bucket_sizes(max(widths), 4, c)]
    assert low == min(every) and high == ddp_model.mlp_gradient_bytes(max(widths), 4) >= max(every)


# --- on a CUDA GPU only (skipped here; benchmarks/gpu_check.py runs them: pytest -m cuda) -------------

@NEEDS_GPU
def test_gpu_split_layer_and_training_step_compute_on_the_gpu():
    frame = st.time_layers([(8, 64)], 2, ("whole", "split"), backend="gloo", device="cuda", quick=True, timeout_s=180)
    assert set(frame["mode"]) == {"whole", "split"} and (frame["total_ms"] > 0).all()
    cfgs = [ddp_step.StepConfig(48, 2, 8, mode, steps=2, warmup=1) for mode in ("ddp", "no_overlap")]
    steps, probe = data_parallel._launch(cfgs, 2, "gloo", "cuda", 180, False,
                              contention={"width": 48, "depth": 2, "batch_per_rank": 8, "reps": 2})
    assert set(steps["device"]) == {"cuda"} and probe["device"] == "cuda" and probe["together_ms"] > 0


def test_each_bucket_layout_is_measured_once():
    caps = [1, 4, 16, 64]
    kept = ddp_model.distinct_bucket_caps(2048, 4, caps)
    assert kept == [1.0, 64.0]
    layouts = [tuple(ddp_model.mlp_bucket_sizes(2048, 4, c)) for c in [ddp_model.DEFAULT_BUCKET_MB, *kept]]
    assert len(set(layouts)) == len(layouts)  # every kept cap has buckets of its own
    for cap in set(caps) - set(kept):  # and every cap left out repeats one measured
        assert tuple(ddp_model.mlp_bucket_sizes(2048, 4, cap)) in layouts
    assert ddp_model.distinct_bucket_caps(256, 4, caps) == []  # one bucket whatever the cap


# --- the sentences that state a comparison come from the numbers ------------------------------------

def _scaling_rows(ddp_weak, ddp_strong, flat_weak, one_b=10.0, one_nb=18.0, grad=1 << 20):
    def row(mode, kind, one, n_ms):
        speedup = (2 * one if kind == "weak" else one) / n_ms
        return {"mode": mode, "gradient_bytes": grad, "scaling": kind, "world_size": 2, "one_rank_ms": one,
                "n_rank_ms": n_ms, "speedup": speedup, "efficiency": speedup / 2}
    return pd.DataFrame([row("ddp", "weak", one_b, ddp_weak), row("ddp", "strong", one_nb, ddp_strong),
                         row("no_overlap", "weak", one_b, flat_weak),
                         row("ddp", "weak", 1.0, 1.0) | {"gradient_bytes": 8}])  # a smaller model, not the one said


def test_scaling_sentence_says_faster_slower_or_as_fast_from_the_numbers():
    good = data_parallel.scaling_sentence(_scaling_rows(12.0, 12.0, 15.0))
    assert "1.67x the samples per second" in good and "more than one rank" in good
    assert "12 ms against one rank's 18 ms: faster, a strong-scaling speedup of 1.5x" in good
    assert "1.25x faster than the no-overlap variant's (15 ms)" in good
    bad = data_parallel.scaling_sentence(_scaling_rows(25.0, 30.0, 20.0))
    assert "fewer than one rank" in bad and "30 ms against one rank's 18 ms: slower than one rank (0.6x)" in bad
    assert "1.25x slower than the no-overlap variant's" in bad
    tie = data_parallel.scaling_sentence(_scaling_rows(20.0, 18.0, 20.0))
    assert "as many samples per second as one rank" in tie and "as fast as one rank" in tie
    assert "was as fast as the no-overlap variant's" in tie


def _placed(*positions, mode="ddp"):
    return pd.DataFrame({"mode": mode, "position": list(positions)})


def test_placement_sentence_counts_where_the_steps_fell():
    above = data_parallel.placement_sentence(pd.concat([_placed("between", "above"),
                                                        _placed("above", "above", mode="no_overlap")]))
    assert "DDP: between the two estimates at 1, above the no-overlap estimate at 1 of 2 model size(s)" in above
    assert "no-overlap variant: above the no-overlap estimate at 2 of 2" in above and "contention" in above
    assert "bound" not in above
    inside = data_parallel.placement_sentence(_placed("between"))
    assert inside == "Measured steps: DDP: between the two estimates at 1 of 1 model size(s)."
    below = data_parallel.placement_sentence(_placed("below"))
    assert "below the ideal-overlap estimate at 1" in below and "ran faster" in below


def _bucket_summary(*caps_ms_spread):
    return pd.DataFrame([{"mode": "ddp", "width": 256, "depth": 4, "bucket_cap_mb": cap, "step_ms": ms,
                          "step_ms_p10": ms - spread, "step_ms_p90": ms + spread}
                         for cap, ms, spread in caps_ms_spread])


def test_bucket_sentence_names_the_fastest_only_beyond_the_spread():
    clear = data_parallel.bucket_sentence(_bucket_summary((25.0, 10.0, 0.5), (1.0, 14.0, 0.5)), 256, 4)
    assert clear.startswith("Fastest: 25 MiB buckets (10 ms median); slowest: 1 MiB (14 ms)") and "larger than" in clear
    flipped = data_parallel.bucket_sentence(_bucket_summary((25.0, 14.0, 0.5), (1.0, 10.0, 0.5)), 256, 4)
    assert flipped.startswith("Fastest: 1 MiB buckets")
    noisy = data_parallel.bucket_sentence(_bucket_summary((25.0, 10.0, 3.0), (1.0, 12.0, 3.0)), 256, 4)
    assert "does not single out a best cap" in noisy
    tie = data_parallel.bucket_sentence(_bucket_summary((25.0, 10.0, 1.0), (1.0, 10.0, 1.0)), 256, 4)
    assert "a tie" in tie
    one = data_parallel.bucket_sentence(_bucket_summary((25.0, 10.0, 1.0)), 256, 4, caps_asked=[1, 4])
    assert "Caps [1, 4] MiB give this model the same buckets" in one and "no comparison" in one


def test_the_notebook_helpers_fill_in_the_plan_and_describe_the_gradients(synthetic_sweep):
    from labutils.model.sizing import DdpPlan
    plan = DdpPlan(8, (256, 512), (1.0, 4.0), 0.01, "why", warmup=2, steps=5)
    sizes = data_parallel.choose_sizes(plan, 4)
    assert (sizes.batch_per_rank, sizes.widths, sizes.bucket_caps_mb, sizes.steps, sizes.warmup) == \
        (8, (256, 512), (1.0, 4.0), 5, 2)
    mine = data_parallel.choose_sizes(plan, 4, batch_per_rank=16, gradient_mib=[4], bucket_caps_mb=[2], steps=3)
    assert mine.widths == (ddp_model.mlp_for_gradient_bytes(4 * 2**20),) and mine.bucket_caps_mb == (2.0,)
    assert (mine.batch_per_rank, mine.steps, mine.warmup) == (16, 3, 2)
    with pytest.raises(LabInputError, match="batch_per_rank"):
        data_parallel.choose_sizes(plan, 4, batch_per_rank=-1)
    link = type("Link", (), {"busbw_GBps": 4.0, "alpha_us": 100.0})()
    table = data_parallel.gradient_table([256, 512], 4, 2, link, synthetic_sweep())
    assert list(table["buckets (25 MiB)"]) == [1, 2] and table.loc[1, "parameters"] == 4 * (512 * 512 + 512)
    assert table.loc[0, "all-reduce, one α-β line (ms)"] == pytest.approx(allreduce_ms(4 * 263168, 2, 4.0, 100.0, 1))


def test_overlap_verdict_says_little_overlap_when_some_of_the_sum_was_saved():
    verdict = data_parallel.overlap_verdict({"backward_ms": 14.469, "allreduce_ms": 12.986, "together_ms": 25.711})
    assert verdict.startswith("Little overlap (6% of the sum saved): together 25.7 ms against 14.5 + 13 = 27.5 ms")
    assert data_parallel.overlap_verdict({"backward_ms": 10.0, "allreduce_ms": 6.0,
                                          "together_ms": 15.99}).startswith("No overlap")  # 0% at the figure printed


def test_allreduce_sources_sentence_names_the_closer_estimate():
    assert data_parallel.allreduce_sources_sentence(0.20, 0.14).endswith("20% off read from the measured curve, "
                                                                        "14% from one line (median): the one line "
                                                                        "came closer here")
    assert data_parallel.allreduce_sources_sentence(0.05, 0.30).endswith("the curve came closer")
    assert data_parallel.allreduce_sources_sentence(0.101, 0.099).endswith("the two did as well")


def test_binary_size_spells_the_1024_based_unit():
    assert binary_size(16_793_600) == "16MiB"
    assert binary_size(264_192) == "258KiB"
    assert binary_size(512) == "512B"
