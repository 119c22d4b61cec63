"""The timeline: a profiled step's events classified, merged over ranks, summed, saved and drawn."""

import json
import os
import subprocess
import sys

import matplotlib
import pytest

from labutils.core.inputs import LabInputError
from labutils.experiments.data_parallel import record_ddp_step
from labutils.experiments.split_timing import record_overlap_step
from labutils.measure import timeline as tl
from labutils.show.timeline_view import draw_timeline

matplotlib.use("Agg")


@pytest.mark.parametrize("name, category, kind", [
    ("aten::addmm", "cpu_op", "compute"),
    ("aten::broadcast_tensors", "cpu_op", "compute"),  # an operator, whatever its name says
    ("AddmmBackward0", "cpu_op", "compute"),
    ("gloo:all_reduce", "user_annotation", "communication"),
    ("c10d::allreduce_", "cpu_op", "communication"),
    ("nccl:all_reduce", "cpu_op", "communication"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "communication"),
    ("ampere_sgemm_128x64_tn", "kernel", "compute"),
    ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", "copy"),
    ("lab:step", "user_annotation", "other"),
    ("cudaLaunchKernel", "cuda_runtime", "other"),
])
def test_classify(name, category, kind):
    assert tl.classify(name, category) == kind


def test_interval_arithmetic():
    assert tl.merge_intervals([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert tl.subtract_intervals([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert tl.subtract_intervals([(0, 1)], [(0, 1)]) == []
    assert tl._intersection([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)


def _gpu_trace():
    """A hand-made two-stream GPU step as torch.profiler writes it (times in us): compute kernels
    on stream 7 from 0 to 100 us, NCCL's kernel on stream 20 from 60 to 160 us."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 500, "tid": 500, "args": {"name": "thread 500 (python)"}},
        {"ph": "X", "cat": "user_annotation", "name": "lab:step", "pid": 500, "tid": 500, "ts": 1000.0, "dur": 170.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 500, "tid": 500, "ts": 1001.0, "dur": 4.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 500, "tid": 500, "ts": 1002.0,
         "dur": 2.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7, "ts": 1000.0, "dur": 100.0,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
         "ts": 1060.0, "dur": 100.0, "args": {"device": 0, "stream": 20}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 1160.0, "dur": 5.0,
         "args": {"device": 0, "stream": 7}},
    ]
    return {"traceEvents": ev}


def test_gpu_streams_are_lanes_and_overlap_is_measured():
    """The GPU path, which this machine cannot record, parsed from a trace of its shape."""
    trace = tl.merge_traces([_gpu_trace()])
    events = tl.events_frame(trace)
    lanes = set(events[events.kind != "other"]["lane"])
    assert lanes == {"CPU main thread 500", "GPU 0 stream 7", "GPU 0 stream 20"}
    row = tl.summary(events).iloc[0]
    assert row["step_ms"] == pytest.approx(0.170)
    assert row["compute_ms"] == pytest.approx(0.100)  # the CPU op lies inside the kernel's span
    assert row["communication_ms"] == pytest.approx(0.100)
    assert row["overlapped_ms"] == pytest.approx(0.040)  # 60..100 us
    assert row["exposed_comm_ms"] == pytest.approx(0.060)
    assert row["copy_ms"] == pytest.approx(0.005)


def test_merge_keeps_ranks_apart():
    trace = tl.merge_traces([_gpu_trace(), _gpu_trace()])
    events = tl.events_frame(trace)
    assert sorted(events["rank"].unique()) == [0, 1]
    pids = {(e["args"]["lab_rank"], e["pid"]) for e in trace["traceEvents"]}
    assert len({p for _, p in pids}) == len(pids) == 4  # two processes per rank, none shared
    assert events.groupby("rank")["start_ms"].min().tolist() == [0.0, 0.0]


def test_bad_input_is_refused():
    with pytest.raises(LabInputError, match="traceEvents"):
        tl.events_frame({"schemaVersion": 1})
    with pytest.raises(LabInputError, match="kind="):
        tl.save_trace({"traceEvents": []}, kind="../x")
    with pytest.raises(LabInputError, match="chunks=0"):
        record_overlap_step((8, 64), chunks=0)
    with pytest.raises(LabInputError, match="bucket_cap_mb"):
        record_ddp_step(bucket_cap_mb=0)


@pytest.mark.distributed
def test_a_real_ddp_step_on_two_gloo_ranks(tmp_path):
    run = record_ddp_step(width=64, depth=2, batch_per_rank=8, bucket_cap_mb=1, nproc=2, warmup=1, timeout_s=60)
    events = run.events
    for rank in (0, 1):
        mine = events[events["rank"] == rank]
        assert (mine["kind"] == "compute").sum() > 10
        comm = mine[mine["kind"] == "communication"]
        assert "gloo:all_reduce" in set(comm["name"])
        assert any("gloo" in lane for lane in comm["lane"]), "gloo runs its collectives on a thread of its own"
        assert (mine["start_ms"] >= 0).all()
    table = run.summary
    assert len(table) == 2 and (table["compute_ms"] > 0).all() and (table["communication_ms"] > 0).all()
    assert (table["overlapped_ms"] <= table["communication_ms"] + 1e-9).all()
    assert (table["compute_ms"] <= table["step_ms"] + 1e-6).all()
    names = [e["args"]["name"] for e in run.trace["traceEvents"] if e.get("name") == "process_name"]
    assert any(n.startswith("rank 0 ·") for n in names) and any(n.startswith("rank 1 ·") for n in names)

    first = tl.save_trace(run.trace, "ddp-step", directory=tmp_path)
    text = first.read_text()
    second = tl.save_trace(run.trace, "ddp-step", directory=tmp_path)
    assert first != second and first.read_text() == text, "a second save must not overwrite the first"
    for path in (first, second):
        loaded = json.loads(path.read_text())
        assert tl.events_frame(loaded)["kind"].eq("communication").any()

    ax = draw_timeline(events, title=run.what)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert any(label.startswith("rank 1 · CPU") for label in labels) and len(labels) >= 4


@pytest.mark.distributed
def test_the_overlap_step_records_its_chunked_allreduces():
    run = record_overlap_step((8, 64), chunks=2, nproc=2, warmup=1, timeout_s=60)
    for _rank, mine in run.events.groupby("rank"):
        assert (mine["kind"] == "communication").any() and (mine["kind"] == "compute").any()


def test_default_folder_is_traces_inside_the_results_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    path = tl.save_trace(tl.merge_traces([_gpu_trace()]))
    assert path.parent == tmp_path / "traces" and path.name.startswith("timeline-")


def test_quiet_profiler_sets_kinetos_level_only_inside(monkeypatch):
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    with tl.quiet_profiler():
        assert os.environ["KINETO_LOG_LEVEL"] == tl.KINETO_QUIET_LEVEL
    assert "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    with tl.quiet_profiler():
        pass
    assert os.environ["KINETO_LOG_LEVEL"] == "2"


def test_a_recording_prints_no_profiler_log_lines():
    code = ("import torch; from labutils.measure.timeline import profile_step; "
            "profile_step(lambda: torch.ones(8) @ torch.ones(8), warmup=0)")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr
