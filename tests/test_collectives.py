"""Collectives: nccl-tests' bandwidth factors and sizes, exact expected results, real gloo sweeps."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from labutils.core.busbw import (
    COLUMNS,
    OPS,
    SWEEP_EXTRA,
    bandwidths_GBps,
    bus_factor,
    format_nccl_table,
    layout,
    sweep_sizes,
)
from labutils.core.inputs import LabInputError
from labutils.core.results import latest_result
from labutils.measure.buffers import expected, fill
from labutils.measure.harness import warmup_iters
from labutils.measure.launch import RankError
from labutils.measure.sweep import WrongResultError, run_sweep, save_sweep
from labutils.readers.nccl_tests import parse_text


@pytest.mark.parametrize("n, ar, ag", [(1, 0.0, 0.0), (2, 1.0, 0.5), (3, 4 / 3, 2 / 3), (4, 1.5, 0.75),
                                       (8, 1.75, 0.875)])
def test_bus_factors_are_nccl_tests(n, ar, ag):
    assert bus_factor("all_reduce", n) == pytest.approx(ar)
    assert bus_factor("all_gather", n) == pytest.approx(ag)
    assert bus_factor("reduce_scatter", n) == pytest.approx(ag)
    assert bus_factor("broadcast", n) == 1.0


def test_bus_factor_works_on_arrays_of_world_sizes():
    sizes = [1, 2, 3, 4, 8]
    for op in OPS:
        assert list(bus_factor(op, np.array(sizes))) == pytest.approx([bus_factor(op, n) for n in sizes])
    with pytest.raises(LabInputError, match="world_size"):
        bus_factor("all_reduce", np.array([2, 0]))
    with pytest.raises(LabInputError, match="world_size"):
        bus_factor("all_reduce", 0)


def test_bandwidths_decimal_GBps():
    algbw, busbw = bandwidths_GBps("all_reduce", 1e9, 1e6, 4)  # 1 GB in 1 s on 4 ranks
    assert algbw == pytest.approx(1.0)
    assert busbw == pytest.approx(1.5)
    assert all(math.isnan(v) for v in bandwidths_GBps("all_reduce", 1024, 0.0, 2))
    with pytest.raises(LabInputError, match="op"):
        bus_factor("all_to_everyone", 2)


def test_layout_follows_nccl_tests_size_and_count():
    ar = layout("all_reduce", 1024, "float32", 3)
    assert (ar.size_bytes, ar.count) == (1024, 256)
    ag = layout("all_gather", 1024, "float32", 3)  # size = gathered output, count = per rank
    assert (ag.size_bytes, ag.count, ag.per_rank) == (1020, 85, 85)
    rs = layout("reduce_scatter", 1024, "bfloat16", 4)
    assert (rs.size_bytes, rs.count) == (1024, 128)
    assert layout("all_gather", 8, "float32", 3) is None
    assert layout("broadcast", 2, "float32", 2) is None


def test_sweep_sizes_and_bad_input():
    assert sweep_sizes("1K", "8K", 2) == [1024, 2048, 4096, 8192]
    assert sweep_sizes(1000, 64000, 4) == [1000, 4000, 16000, 64000]
    for args, needle in [(("1X", "8K"), "min_bytes"), (("8K", "1K"), "larger than"), (("1K", "8K", 1), "factor"),
                         (("0", "8K"), "min_bytes")]:
        with pytest.raises(LabInputError, match=needle):
            sweep_sizes(*args)


def test_warmup_shrinks_with_size_but_never_vanishes():
    assert warmup_iters(1024, 5) == 5
    assert warmup_iters(64 << 20, 5) == 1
    assert warmup_iters(64 << 20, 0) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8", "uint8", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_expected_result_is_exact_for_eight_ranks(op, dtype):
    n = 8
    lay = layout(op, 8 * 8 * 24, dtype, n)
    inputs = [fill(r, lay.per_rank * (n if op == "reduce_scatter" else 1), dtype) for r in range(n)]
    for rank in (0, 5):
        if op == "all_reduce":
            got = sum(x.to(torch.float64) for x in inputs)
        elif op == "reduce_scatter":
            sl = slice(rank * lay.per_rank, (rank + 1) * lay.per_rank)
            got = sum(x[sl].to(torch.float64) for x in inputs)
        elif op == "all_gather":
            got = torch.cat(inputs).to(torch.float64)
        else:
            got = inputs[0].to(torch.float64)
        assert torch.equal(expected(lay, rank).to(torch.float64), got)


def test_format_table_reads_back_with_the_nccl_tests_parser():
    frame = pd.DataFrame([{"op": "all_reduce", "size_bytes": s, "count": s // 4, "dtype": "float32", "redop": "sum",
                           "root": -1, "time_us": t, "algbw_GBps": s / t / 1e3, "busbw_GBps": s / t / 1e3,
                           "wrong": 0, "world_size": 2, "backend": "gloo", "in_place": True}
                          for s, t in [(1024, 35.5), (1 << 20, 16330.0), (1 << 30, 1.2e7)]])
    text = format_nccl_table(frame, {"backend": "gloo", "device": "cpu", "world_size": 2, "warmup": 5, "budget_ms": 10})
    assert "# Avg bus bandwidth" in text and "# Out of bounds values : 0 OK" in text
    back = parse_text(text, op="all_reduce").frame
    assert list(back["size_bytes"]) == list(frame["size_bytes"])
    assert list(back["busbw_GBps"]) == pytest.approx(list(frame["busbw_GBps"]), rel=0.02, abs=0.006)


def _check_rows(frame, n):
    assert list(frame.columns) == COLUMNS + SWEEP_EXTRA
    assert (frame["wrong"] == 0).all()
    assert (frame["world_size"] == n).all() and (frame["backend"] == "gloo").all()
    for r in frame.to_dict("records"):
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_us"] / 1e3)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * bus_factor(r["op"], n))
        assert r["time_max_us"] >= r["time_us"] * (1 - 1e-9)
        assert r["iters"] >= 3 and 0 < r["time_us"] < 5e6
        assert layout(r["op"], r["size_bytes"], "float32", n).count == r["count"]


@pytest.mark.distributed
@pytest.mark.parametrize("n", [2, 3])
def test_real_gloo_sweep_of_every_collective(n):
    result = run_sweep(nproc=n, backend="gloo", op=OPS, min_bytes="1K", max_bytes="16K", factor=4, budget_ms=3,
                       warmup=2, progress=False, timeout_s=90)
    frame = result.frame
    assert sorted(frame["op"].unique()) == sorted(OPS)
    assert len(frame) == 4 * 3
    _check_rows(frame, n)
    assert result.meta["world_size"] == n and result.meta["backend"] == "gloo"
    assert result.meta["torch_version"] == torch.__version__
    path = save_sweep(result)
    record, saved = latest_result("sweep")
    assert record["meta"]["host"] and record["meta"]["date"] and len(record["meta"]["devices"]) == n
    assert len(saved) == len(frame) and path.exists()


@pytest.mark.distributed
def test_a_corrupted_result_is_counted_and_fails_the_run(plant_fault):
    plant_fault("corrupt", rank=1)
    with pytest.raises(WrongResultError) as info:
        run_sweep(nproc=2, min_bytes="1K", max_bytes="4K", budget_ms=2, warmup=1, progress=False, timeout_s=60)
    frame = info.value.result.frame
    assert list(frame["wrong"]) == [3, 3, 3]  # 3 elements corrupted on one rank, at every size
    assert "wrong element" in str(info.value)


@pytest.mark.distributed
@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_a_dead_or_hung_rank_is_named(fault, plant_fault):
    plant_fault(fault, rank=1)
    with pytest.raises(RankError) as info:
        run_sweep(nproc=2, min_bytes="1K", max_bytes="2K", budget_ms=2, progress=False,
                  timeout_s=20 if fault == "hang" else 60)  # a hang costs all of it; the start takes some
    assert info.value.rank == 1
    assert ("died" if fault == "crash" else "stopped responding") in str(info.value)


def test_bad_sweep_input_is_refused_before_any_rank_starts():
    with pytest.raises(LabInputError, match="nproc"):
        run_sweep(nproc=4, backend="nccl", progress=False)
    with pytest.raises(LabInputError, match="max_bytes"):
        run_sweep(nproc=2, backend="gloo", max_bytes="64T", progress=False)
    with pytest.raises(LabInputError, match="dtype"):
        run_sweep(nproc=2, backend="gloo", dtype="complex64", progress=False)


def test_a_sweep_config_is_checked_and_planned_before_any_rank_starts():
    from labutils.measure.sweep import SweepConfig, plan_sweep

    plan = plan_sweep(SweepConfig(nproc=2, backend="gloo", device="cpu", op=("all_reduce", "broadcast"),
                                  max_bytes="4K", budget_ms=10))
    assert plan.ops == ("all_reduce", "broadcast") and plan.sizes == [1024, 2048, 4096]
    assert (plan.world, plan.local, plan.choice.backend, plan.torchrun) == (2, 2, "gloo", None)
    assert plan.timeout_s == pytest.approx(60 + 2 * 3 * (3 * 0.010 + 2.0))
    assert plan.worker_kwargs()["ops"] == plan.ops and plan.worker_kwargs()["warmup"] == 5
    with pytest.raises(TypeError):
        run_sweep(sizes=[1024])  # a setting SweepConfig does not have


def test_saved_sweeps_load_back_by_op_and_compare():
    from labutils.measure.sweep import SweepResult, compare_sweeps, load_sweep

    rows = [{"op": op, "size_bytes": s, "count": s // 4, "dtype": "float32", "redop": "sum", "root": -1,
             "time_us": 10.0, "algbw_GBps": s / 1e4, "busbw_GBps": s / 1e4 * f, "wrong": 0, "world_size": 2,
             "backend": "gloo", "in_place": True} for op, f in [("all_reduce", 1.0), ("broadcast", 1.0)]
            for s in (1024, 2048)]
    save_sweep(SweepResult(pd.DataFrame(rows), {"world_size": 2, "backend": "gloo"}))
    back = load_sweep("broadcast", world_size=2, backend="gloo")
    assert set(back.frame["op"]) == {"broadcast"} and len(back.frame) == 2
    assert load_sweep("broadcast", world_size=7) is None
    table = compare_sweeps({"a": back.frame, "b": back.frame.assign(busbw_GBps=back.frame.busbw_GBps / 4)})
    assert list(table["ratio a / b"]) == [4.0, 4.0]
