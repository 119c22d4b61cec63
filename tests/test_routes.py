"""Routes by GPU count (faked), NCCL against gloo on CUDA, sizes per route, expected copy bands from
NVML facts (faked), the measured all-reduce curve interpolated, and the training step's bounds.

No GPU is needed: every function here takes the GPU count, NVML's facts or the measurements as
arguments."""

import ast
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labutils.core.inputs import LabInputError
from labutils.course import machine
from labutils.experiments import data_parallel, ddp_step
from labutils.experiments import split_timing as st
from labutils.measure.copies import Band, copy_table, expected_bands, wire_fraction
from labutils.measure.launch import barrier_kwargs, rank_plan, ranks_per_gpu, resolve_backend
from labutils.model import budget, ddp_model
from labutils.model.fit import fit_alpha_beta, interpolate_time_us
from labutils.readers.topology import GpuFacts, host_link, load_sample

RANKED = ("02_allreduce_sweep", "05_tensor_parallel", "07_validating_the_budget", "08_data_parallel_training")


# --- the route, a pure function of the GPU count ------------------------------------------------------

@pytest.mark.parametrize("notebook", RANKED)
def test_route_follows_the_gpu_count(notebook):
    cpu, one, two, eight = (machine.route(notebook, g) for g in (0, 1, 2, 8))
    assert (cpu.backend, cpu.device, cpu.nproc, cpu.ranks_per_gpu, cpu.case) == ("gloo", "cpu", 2, 0, "cpu")
    assert (one.backend, one.device, one.nproc, one.ranks_per_gpu, one.case) == ("gloo", "cuda", 2, 2, "one-gpu")
    assert one.shares_gpu and one.on_gpu and not cpu.on_gpu
    for many in (two, eight):
        assert (many.backend, many.device, many.ranks_per_gpu, many.case) == ("nccl", "cuda", 1, "multi-gpu")
        assert not many.shares_gpu
    assert "host memory" in one.emulates and "SMs" in one.emulates and "0.5" in one.emulates
    assert "second GPU's own compute" in one.cannot_show
    assert "one GPU per rank" in machine.format_route(eight) or "one GPU each" in machine.format_route(eight)
    # four ranks on two GPUs: gloo on CUDA, two ranks per GPU
    four = machine.route(notebook, 2, nproc=4)
    assert (four.backend, four.device, four.ranks_per_gpu) == ("gloo", "cuda", 2)


def test_route_of_the_sweep_draws_its_comparisons():
    cpu, one, eight = (machine.route("02_allreduce_sweep", g) for g in (0, 1, 8))
    assert cpu.beside == () and not cpu.copy_ceiling
    assert one.beside == (("gloo", "cpu"),) and one.copy_ceiling  # gloo on CPU beside, the copy as ceiling
    assert eight.beside == (("gloo", "cuda"),) and not eight.copy_ceiling
    asked_cpu = machine.route("02_allreduce_sweep", 1, device="cpu")
    assert (asked_cpu.backend, asked_cpu.device, asked_cpu.beside) == ("gloo", "cpu", ())


def test_route_without_ranks_and_bad_input():
    assert machine.route("06_time_budget", 8).nproc == 0
    assert machine.route("01_topology", 1).copy_ceiling is True and machine.route("01_topology", 0).nproc == 0
    with pytest.raises(LabInputError, match="notebook"):
        machine.route("99_nothing", 1)
    with pytest.raises(LabInputError, match="gpu_count"):
        machine.route("02_allreduce_sweep", -1)
    with pytest.raises(LabInputError, match="one GPU per rank"):
        machine.route("08_data_parallel_training", 1, backend="nccl")


def test_check_reports_the_route_of_each_case():
    one = dict(machine.check(gpu_count=1).route)
    assert "gloo on CUDA tensors" in one["02_allreduce_sweep"] and "GPU" in one["08_data_parallel_training"]
    assert "NCCL" in dict(machine.check(gpu_count=8).route)["07_validating_the_budget"]


def test_resolve_backend_puts_one_gpu_to_work():
    one = resolve_backend("auto", "auto", 2, gpu_count=1)
    assert (one.backend, one.device) == ("gloo", "cuda") and "sharing" in one.reason
    assert resolve_backend("auto", "cpu", 2, gpu_count=1).device == "cpu"
    assert ranks_per_gpu(2, 1) == 2 and ranks_per_gpu(8, 8) == 1 and ranks_per_gpu(2, 0) == 0


# --- NCCL differs from gloo on CUDA only in its name and what NCCL needs -------------------------------

@pytest.mark.parametrize("gpus", [2, 8])
def test_nccl_differs_from_gloo_on_cuda_only_in_name_and_barrier(gpus):
    for local_rank in range(gpus):
        gloo, nccl = rank_plan("gloo", "cuda", local_rank, gpus), rank_plan("nccl", "cuda", local_rank, gpus)
        assert (gloo.device, gloo.cuda_index) == (nccl.device, nccl.cuda_index) == (f"cuda:{local_rank}", local_rank)
        assert (gloo.backend, nccl.backend) == ("gloo", "nccl")
        assert gloo.barrier_kwargs == {} and nccl.barrier_kwargs == {"device_ids": [local_rank]}
        differ = {k for k in gloo.__dataclass_fields__ if getattr(gloo, k) != getattr(nccl, k)}
        assert differ == {"backend", "barrier_kwargs"}


def test_one_gpu_is_shared_by_gloo_and_refused_by_nccl():
    assert [rank_plan("gloo", "cuda", r, 1).device for r in range(3)] == ["cuda:0"] * 3
    with pytest.raises(LabInputError, match="one GPU per rank"):
        rank_plan("nccl", "cuda", 1, 1)
    assert rank_plan("gloo", "cpu", 3, 0) == rank_plan("gloo", "cpu", 3, 8)
    with pytest.raises(LabInputError, match="nccl"):
        rank_plan("nccl", "cpu", 0, 8)
    assert barrier_kwargs("nccl", "cuda:3") == {"device_ids": [3]}
    assert barrier_kwargs("gloo", "cuda:3") == barrier_kwargs("nccl", "cpu") == {}


# (module, function) allowed to look at the backend's name: choosing it, and saying what it means
BACKEND_BRANCHES = {("launch", "resolve_backend"), ("launch", "rank_plan"), ("launch", "barrier_kwargs"),
                    ("machine", "route"), ("machine", "label"), ("machine", "check_backend_guess"),
                    ("fit", "fit_alpha_beta"),  # an nccl-tests log without a device column is on CUDA
                    ("rules", "measurement_causes"),  # a measurement taken with gloo is a cause of low busbw
                    ("placement", "affinity_worker")}  # finds gloo's threads by name, chooses nothing


def _backend_comparisons(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def names_backend(n) -> bool:
        if isinstance(n, ast.Constant):
            return n.value in ("nccl", "gloo")
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(names_backend(e) for e in n.elts)
        return "backend" in (getattr(n, "id", "") or getattr(n, "attr", ""))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names_backend(p) for p in [node.left, *node.comparators]):
            f = node
            while f in parents and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = parents[f]
            yield path.stem, getattr(f, "name", "<module>")


def test_worker_code_never_branches_on_the_backend():
    """Every rank runs the same code on gloo and NCCL: only the launcher's choice and rank plan (and
    the words that describe a route) compare backend names."""
    import labutils

    found = {hit for path in Path(labutils.__file__).parent.rglob("*.py") for hit in _backend_comparisons(path)}
    assert found - BACKEND_BRANCHES == set()
    assert ("launch", "rank_plan") in found  # the scan does see comparisons


# --- sizes, a pure function of the route ----------------------------------------------------------------

def test_layer_sizes_follow_the_route():
    cpu = st.layer_plan(machine.route("07_validating_the_budget", 0), quick=False)
    assert max(cpu.hidden_sizes) == 1024 and cpu.batch == 32 and cpu.sizes[0] == (32, 64)
    quick = st.layer_plan(machine.route("07_validating_the_budget", 0), quick=True)
    assert set(quick.hidden_sizes) < set(cpu.hidden_sizes) and 1 in quick.chunk_counts
    for gpus in (1, 2, 8):
        gpu = st.layer_plan(machine.route("07_validating_the_budget", gpus), quick=False)
        assert gpu == st.layer_plan(machine.route("05_tensor_parallel", gpus), quick=False)
        assert min(gpu.hidden_sizes) >= 256 and max(gpu.hidden_sizes) > 1024 and gpu.batch >= 256
        assert gpu.timing_size[1] > cpu.timing_size[1] and 1 in gpu.chunk_counts
        assert all((4 * h) % 2 == 0 for h in gpu.hidden_sizes)


def _flops_per_ms(fp32_flops):
    return fp32_flops / 1e3


@pytest.mark.parametrize("gpus, flops, latency_ms, busbw", [
    (0, 2e10, 0.3, 1.0),       # a CPU core against gloo on CPU
    (8, 6.7e13, 0.02, 20.0),   # an H200 against NCCL over PCIe
])
def test_the_break_even_falls_inside_each_routes_sizes(gpus, flops, latency_ms, busbw):
    """With a route's typical compute rate and link, T2 - T1 changes sign inside its sizes (eta 0.9)."""
    plan = st.layer_plan(machine.route("07_validating_the_budget", gpus), quick=False)
    sign = []
    for b, h in plan.sizes:
        c_ms = 16 * b * h * h / _flops_per_ms(flops)
        t = budget.evaluate(0.0, c_ms, 0.9, 1, latency_ms, 4 * b * h, busbw)
        sign.append(t.t_two_ms < t.t_one_ms)
    assert sign[0] is False and sign[-1] is True


def test_one_shared_gpu_shows_the_budgets_never_with_numbers():
    """Two ranks time-sharing one GPU: eta near 0.5, and the budget says never, naming why."""
    plan = st.layer_plan(machine.route("07_validating_the_budget", 1), quick=False)
    b, h = plan.sizes[-1]
    t = budget.evaluate(0.05, 16 * b * h * h / _flops_per_ms(6.7e13), 0.5, 1, 0.3, 4 * b * h, 1.7)
    assert math.isinf(t.break_even_C_ms) and "eta <= 0.5" in budget.verdict(t)


def test_training_sizes_follow_the_route():
    cpu, one, eight = (ddp_model.experiment_plan(machine.route("08_data_parallel_training", g), quick=False)
                       for g in (0, 1, 8))
    assert cpu.batch_per_rank == 32 and cpu.gradient_mib == (2, 8, 32, 64)
    assert one.batch_per_rank > eight.batch_per_rank > cpu.batch_per_rank  # shared GPU: slower link per flop
    quick = ddp_model.experiment_plan(machine.route("08_data_parallel_training", 1), quick=True)
    assert quick.steps < one.steps and len(quick.gradient_mib) < len(one.gradient_mib)
    # backward / all-reduce ~ b x busbw / flop rate: near 1 on a shared H200 with gloo (1.7 GB/s, x2 time)
    ratio = one.batch_per_rank * 1.7e9 * 2 / 6.7e13
    assert 0.2 < ratio < 5


# --- 01: expected bands from NVML facts (faked) -------------------------------------------------------

H200 = GpuFacts(0, "NVIDIA H200", pcie_gen=1, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, nvlinks_active=0)


def test_host_link_uses_the_links_maximum_and_says_when_it_idles():
    link = host_link(H200)
    assert (link.gen, link.width, link.label) == (5, 16, "PCIe 5.0 x16")
    assert "gen 1" in link.note and "under load" in link.note
    assert host_link(None).gen == 4 and "assumed" in host_link(None).note
    narrow = host_link(GpuFacts(0, "x", 4, 4, 8, 8, 0))
    assert (narrow.gen, narrow.width, narrow.note) == (4, 8, "")
    assert host_link(GpuFacts(0, "x", 6, 6, 16, 16, 0)).gen == 6  # PCIe 6 is known (pcie.pcie_band)
    odd = host_link(GpuFacts(0, "x", None, None, 6, 6, 0))
    assert (odd.gen, odd.width) == (4, 4) and "no PCIe generation" in odd.note


def _copies(rows):
    return pd.DataFrame(rows, columns=["kind", "src", "dst", "size_bytes", "ms", "GBps", "pinned"])


def test_h2d_band_comes_from_the_live_link_not_pcie_4():
    """The bug: a PCIe 5.0 x16 H200 measured 55.4 GB/s H2D and was shown against 24-31.5."""
    frame = _copies([("H2D", "cpu", "cuda:0", 1 << 28, 4.8, 55.4, True),
                     ("D2H", "cuda:0", "cpu", 1 << 28, 4.9, 55.1, True)])
    bands = expected_bands(frame, facts=[H200])
    assert [(b.low_GBps, b.high_GBps) for b in bands] == [(50, 63), (50, 63)]
    assert "PCIe 5.0 x16" in bands[0].route and "gen 1" in bands[0].note
    assert wire_fraction(55.4, bands[0]) == pytest.approx(55.4 / 63)
    table = copy_table(frame, bands)
    assert table["of_wire"].round(3).tolist() == [round(55.4 / 63, 3), round(55.1 / 63, 3)]
    assert table["expected"].tolist() == ["50-63", "50-63"]
    x8 = expected_bands(frame, facts=[GpuFacts(0, "x", 4, 4, 8, 8, 0)])[0]
    assert (x8.low_GBps, x8.high_GBps) == (12, 15.75)
    assert tuple(expected_bands(frame)[0]) == (24, 31.5)  # no NVML: the default generation, and it says so
    assert math.isnan(wire_fraction(1.0, None))


def test_gpu_pair_band_says_when_it_goes_through_host_memory():
    topo = load_sample("two_gpu_phb")
    frame = _copies([("D2D", "cuda:0", "cuda:1", 1 << 28, 20.0, 13.0, True), ("host", "cpu", "cpu", 1, 1, 5.0, False)])
    facts = [GpuFacts(i, "x", 4, 4, 16, 16, 0) for i in (0, 1)]
    no_peer = pd.DataFrame([[True, False], [False, True]], index=["GPU0", "GPU1"], columns=["GPU0", "GPU1"])
    band, host = expected_bands(frame, topo, facts, no_peer)
    assert "through host memory" in band.route and "host memory" in band.note and host is None
    assert (band.low_GBps, band.high_GBps) == (12, 25)
    peer = expected_bands(frame, topo, facts, ~no_peer | no_peer.T)[0]  # peer access on
    assert "peer-to-peer" in peer.route and (peer.low_GBps, peer.high_GBps) == (24, 31.5)
    assert "NCCL's default" in expected_bands(frame, topo, facts)[0].note
    assert copy_table(frame, [band, host])["route"].tolist()[1] == "CPU memory, no link"
    assert tuple(Band(1, 2, "r", "ref")) == (1, 2)


# --- 07: the measured curve, interpolated -------------------------------------------------------------

def _synthetic_sweep(world_size=2):
    """gloo-like: 60 us fixed, 4 GB/s while the buffer fits in cache (< 1 MiB), 1.6 GB/s beyond."""
    sizes = 2 ** np.arange(10, 27)
    return pd.DataFrame({"size_bytes": sizes, "time_us": [_true_us(s) for s in sizes], "world_size": world_size,
                         "op": "all_reduce", "wrong": 0})


def _true_us(size):
    cached = min(size, 1 << 20)
    return 60 + cached / 4e3 + max(0, size - (1 << 20)) / 1.6e3


def test_interpolation_follows_a_curve_one_line_misses():
    sweep = _synthetic_sweep()
    between = [int(1.5 * 2**k) for k in range(11, 26)]  # never measured
    reading = interpolate_time_us(sweep, between)
    truth = np.array([_true_us(s) for s in between])
    assert not reading.any_extrapolated and reading.note() == ""
    assert np.max(np.abs(reading.time_us - truth) / truth) < 0.06
    line = fit_alpha_beta(sweep, holdout=False)
    line_us = line.alpha_us + np.array(between) / (line.busbw_GBps * 1e3)
    assert np.max(np.abs(line_us - truth) / truth) > 0.3  # one alpha-beta line over the range misses
    exact = interpolate_time_us(sweep, [2**20])
    assert exact.time_us[0] == pytest.approx(_true_us(2**20))


def test_interpolation_extrapolates_carefully_and_says_so():
    sweep = _synthetic_sweep()
    reading = interpolate_time_us(sweep, [512, 2**27])
    assert reading.extrapolated.tolist() == [True, True]
    assert reading.time_us[0] == pytest.approx(_true_us(1024))  # no smaller than the smallest measured
    assert reading.time_us[1] == pytest.approx(2 * _true_us(2**26))  # the largest size's bandwidth
    assert "outside the measured" in reading.note() and "512" in reading.note()
    with pytest.raises(LabInputError, match="size_bytes"):
        interpolate_time_us(sweep, [0])


def test_buckets_are_read_off_the_curve_one_by_one():
    sweep = _synthetic_sweep()
    width = ddp_model.mlp_for_gradient_bytes(32 * 2**20)
    sizes = ddp_model.mlp_bucket_sizes(width, 4, 25)
    assert sum(sizes) == ddp_model.mlp_gradient_bytes(width, 4)
    assert len(sizes) == ddp_model.mlp_bucket_count(width, 4, 25)
    ms, reading = ddp_model.bucket_comm_ms(sweep, sizes)
    assert ms == pytest.approx(sum(_true_us(s) for s in sizes) / 1e3, rel=0.05)
    assert len(reading.time_us) == len(sizes)


# --- 07: the bounds (fake numbers) -----------------------------------------------------------------------

def _summary(ddp_ms, no_overlap_ms, width=256):
    grad = ddp_model.mlp_gradient_bytes(width, 4)
    base = {"width": width, "depth": 4, "gradient_bytes": grad, "bucket_cap_mb": 25.0, "exposed_comm_ms": 0.0,
            "allreduce_ms": 0.0, "wait_ms": 0.0, "batch_per_rank": 32}
    return pd.DataFrame([
        dict(base, run=0, mode="single", world_size=1, forward_ms=1.0, backward_ms=2.0, optimizer_ms=0.5, step_ms=3.5),
        dict(base, run=1, mode="ddp", world_size=2, forward_ms=1.0, backward_ms=4.0, optimizer_ms=0.5,
             step_ms=ddp_ms, backward_compute_ms=2.0),
        dict(base, run=2, mode="no_overlap", world_size=2, forward_ms=1.0, backward_ms=2.0, optimizer_ms=0.5,
             step_ms=no_overlap_ms, allreduce_ms=no_overlap_ms - 3.5)])


def test_bounds_from_the_curve_hold_a_step_that_overlaps():
    sweep = _synthetic_sweep()
    grad_bytes = ddp_model.mlp_gradient_bytes(256, 4)
    comm = ddp_model.bucket_comm_ms(sweep, [grad_bytes])[0]
    lower, upper = 1.5 + max(2.0, comm), 3.5 + comm  # forward + optimizer = 1.5; backward = 2
    inside = data_parallel.prediction_table(_summary((lower + upper) / 2, upper), 100.0, 0.0,
                                            sweep=sweep).set_index("mode")
    assert inside.loc["ddp", "overlap_pred_ms"] == pytest.approx(lower)
    assert inside.loc["ddp", "no_overlap_pred_ms"] == pytest.approx(upper)
    assert inside.loc["ddp", "between"] and not inside.loc["ddp", "extrapolated"]
    assert inside.loc["ddp", "comm_line_ms"] != pytest.approx(inside.loc["ddp", "comm_pred_ms"])
    assert ddp_model.between_bounds_figure(inside.reset_index()) == "1/1"
    above = data_parallel.prediction_table(_summary(upper * 1.2, upper), 100.0, 0.0, sweep=sweep)
    assert ddp_model.between_bounds_figure(above) == "0/1"
    with pytest.raises(LabInputError, match="rank count"):
        data_parallel.prediction_table(_summary(5, 6), 1.0, 0.0, sweep=_synthetic_sweep(world_size=4))


def test_is_between_and_where_the_bounds_take_compute_from():
    p = ddp_model.StepPrediction(1.0, 4.0, 0.5, 3.0, 1)
    assert (p.overlap_ms, p.no_overlap_ms) == (5.5, 8.5)
    assert ddp_model.is_between(5.5, p) and ddp_model.is_between(8.5, p) and not ddp_model.is_between(8.6, p)
    assert not ddp_model.is_between(5.4, p)
    cpu, one, eight = (machine.route("08_data_parallel_training", g) for g in (0, 1, 8))
    assert [ddp_model.bounds_compute(r) for r in (cpu, one, eight)] == ["one_rank", "n_rank", "one_rank"]
    assert [ddp_model.bounds_expected(r) for r in (cpu, one, eight)] == [False, True, True]


def test_contention_table_shows_sum_or_overlap():
    shared = {"backward_ms": 10.0, "allreduce_ms": 6.0, "together_ms": 17.0}
    table = data_parallel.contention_table(shared)
    assert table.loc["no overlap: backward + all-reduce", "ms"] == 16.0
    assert table.loc["ideal overlap: max(backward, all-reduce)", "ms"] == 10.0
    assert table.loc["both together, measured", "vs no overlap"] == pytest.approx(17 / 16)
    assert data_parallel.overlap_verdict(shared).startswith("No overlap")
    assert data_parallel.overlap_verdict({"backward_ms": 10.0, "allreduce_ms": 6.0,
                                          "together_ms": 11.0}).startswith("Overlap")


@pytest.mark.distributed
def test_contention_probe_runs_on_two_cpu_ranks():
    from labutils.measure.launch import launch

    out = launch(ddp_step.contention_worker, 2, kwargs={"width": 48, "depth": 2, "batch_per_rank": 8, "reps": 2},
                 timeout_s=120)
    assert out[0] == out[1]  # every figure is the slowest rank's, the same on both
    assert out[0]["backward_ms"] > 0 and out[0]["allreduce_ms"] > 0 and out[0]["together_ms"] > 0


# --- more pure pieces: the legend's table, PCIe width, the range a sweep must cover --------------------

def test_path_table_gives_each_code_its_route_and_figures():
    from labutils.readers.topology import path_table

    table = path_table(5)
    assert list(table.index) == ["NV#", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert table.loc["PIX", "route by default"] == "peer-to-peer"
    assert set(table.loc[["PHB", "NODE", "SYS"], "route by default"]) == {"through host memory"}
    assert (table.loc["SYS", "low_GBps"], table.loc["SYS", "high_GBps"]) == (22, 50)
    assert table["source"].str.len().min() > 20
    assert path_table(4).loc["PIX", "high_GBps"] == 31.5


def test_rows_stated_for_pcie5_scale_to_any_generation_and_width():
    from labutils.readers.links import link_figure
    from labutils.readers.pcie import pcie_band, scale_to_pcie

    host = link_figure("through host memory, no peer access (PCIe 5.0 x16)")
    assert scale_to_pcie(host, 5, 16) == host
    x8 = scale_to_pcie(host, 5, 8)
    assert (x8.low_GBps, x8.high_GBps) == (12.5, 25) and "PCIe 5.0 x8" in x8.name
    six = scale_to_pcie(host, 6, 16)
    assert six.high_GBps == pytest.approx(50 * pcie_band(6).high_GBps / 63, abs=1e-3)


def test_bucket_size_range_covers_every_all_reduce_of_the_runs():
    widths = [ddp_model.mlp_for_gradient_bytes(m * 2**20) for m in (2, 64)]
    low, high = ddp_model.bucket_size_range(widths, 4, (1, 4))
    every = [b for w in widths for b in ddp_model.mlp_bucket_sizes(w, 4, 25)]
    every += [b for c in (1, 4) for b in ddp_model.mlp_bucket_sizes(max(widths), 4, c)]
    assert low == min(every) and high == ddp_model.mlp_gradient_bytes(max(widths), 4) >= max(every)


def test_a_saved_sweep_that_covers_the_range_is_reused(monkeypatch):
    from labutils.measure import sweep as col

    def fake_run_sweep(**kw):
        calls.append(kw)
        frame = _synthetic_sweep()
        return col.SweepResult(frame, {"world_size": 2, "backend": "gloo", "device": "cpu"})

    calls = []
    monkeypatch.setattr(col, "run_sweep", fake_run_sweep)
    first = col.ensure_sweep(3 << 20, 40 << 20, 2, "gloo", "cpu")  # nothing saved yet: measured now
    assert len(calls) == 1 and calls[0]["min_bytes"] == 2 << 20 and calls[0]["max_bytes"] == 64 << 20
    again = col.ensure_sweep(3 << 20, 40 << 20, 2, "gloo", "cpu")  # saved, and it covers: reused
    assert len(calls) == 1 and len(again.frame) == len(first.frame)
    assert col.load_sweep("all_reduce", 2, "gloo", "cuda") is None  # another device is another link
    assert col.covers(first.frame, 2048, 2**27) and not col.covers(first.frame, 2048, 2**29)
    col.ensure_sweep(1 << 20, 1 << 29, 2, "gloo", "cpu")  # beyond what was saved: measured again
    assert len(calls) == 2


# --- on a CUDA GPU only (skipped here; benchmarks/gpu_check.sh runs them: pytest -k gpu) ----------------

def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


NEEDS_GPU = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")


@NEEDS_GPU
def test_gpu_two_gloo_ranks_share_one_gpu():
    from labutils.measure.launch import launch, ping_worker

    out = launch(ping_worker, 2, backend="gloo", device="cuda", timeout_s=120)
    assert [r["sum"] for r in out] == [1.0, 1.0]


@NEEDS_GPU
def test_gpu_nccl_with_one_rank_runs_a_sweep_with_its_barrier():
    from labutils.measure.sweep import run_sweep

    result = run_sweep(nproc=1, backend="nccl", device="cuda", min_bytes="1K", max_bytes="64K", budget_ms=5,
                       progress=False)
    assert result.wrong == 0 and (result.frame["time_us"] > 0).all() and result.meta["backend"] == "nccl"


@NEEDS_GPU
def test_gpu_gloo_on_cuda_sweep_and_the_copy_ceiling():
    from labutils.measure.copies import copy_ceiling_GBps
    from labutils.measure.sweep import run_sweep

    result = run_sweep(nproc=2, backend="gloo", device="cuda", min_bytes="1K", max_bytes="1M", budget_ms=10,
                       progress=False)
    ceiling = copy_ceiling_GBps(0, 16 << 20, iters=3)
    assert result.wrong == 0 and result.meta["device"] == "cuda"
    assert 0 < result.peak_busbw_GBps < ceiling  # through host memory: never above the pinned copy


@NEEDS_GPU
def test_gpu_split_layer_and_training_step_compute_on_the_gpu():
    frame = st.time_layers([(8, 64)], 2, ("whole", "split"), backend="gloo", device="cuda", quick=True, timeout_s=180)
    assert set(frame["mode"]) == {"whole", "split"} and (frame["total_ms"] > 0).all()
    cfgs = [ddp_step.StepConfig(48, 2, 8, mode, steps=2, warmup=1) for mode in ("ddp", "no_overlap")]
    steps, probe = data_parallel._launch(cfgs, 2, "gloo", "cuda", 180, False,
                              contention={"width": 48, "depth": 2, "batch_per_rank": 8, "reps": 2})
    assert set(steps["device"]) == {"cuda"} and probe["device"] == "cuda" and probe["together_ms"] > 0
