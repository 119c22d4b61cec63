"""The launcher: real gloo ranks, failures named by rank, nothing left running."""

import os

import pytest
from rank_workers import faulty_ping_worker

from labutils.core.inputs import LabInputError
from labutils.measure.launch import RankError, launch, ping_worker, resolve_backend


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.distributed
def test_three_ranks_all_reduce_and_reports():
    reports = []
    results = launch(ping_worker, 3, on_report=lambda rank, payload: reports.append(rank), timeout_s=60)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["sum"] == r["expected"] == 3.0 for r in results)
    assert sorted(reports) == [0, 1, 2]
    assert not any(_alive(r["pid"]) for r in results)


@pytest.mark.distributed
@pytest.mark.parametrize("fault, needle", [("raise", "injected failure"), ("crash", "exit code 17")])
def test_failing_rank_is_named(fault, needle):
    with pytest.raises(RankError) as info:
        launch(faulty_ping_worker, 3, kwargs={"fault_rank": 2, "fault": fault}, timeout_s=60)
    assert info.value.rank == 2
    assert needle in str(info.value)


@pytest.mark.distributed
def test_hung_rank_is_named_within_the_timeout():
    import time

    started = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(faulty_ping_worker, 2, kwargs={"fault_rank": 1, "fault": "hang"}, timeout_s=10)
    assert time.monotonic() - started < 25
    assert info.value.rank == 1
    assert "stopped responding" in str(info.value)


def test_no_child_survives_a_failure():
    import multiprocessing as mp

    with pytest.raises(RankError):
        launch(faulty_ping_worker, 2, kwargs={"fault_rank": 0, "fault": "hang"}, timeout_s=6)
    assert mp.active_children() == []


def test_resolve_backend_explains_its_choice():
    cpu = resolve_backend("auto", "auto", 2, gpu_count=0)
    assert (cpu.backend, cpu.device) == ("gloo", "cpu") and "no CUDA GPU" in cpu.reason
    gpus = resolve_backend("auto", "auto", 2, gpu_count=8)
    assert (gpus.backend, gpus.device) == ("nccl", "cuda")
    one = resolve_backend("auto", "cuda", 2, gpu_count=1)
    assert (one.backend, one.device) == ("gloo", "cuda")
    with pytest.raises(LabInputError, match="nproc=4 is larger than the 2 GPU"):
        resolve_backend("nccl", "cuda", 4, gpu_count=2)
    with pytest.raises(LabInputError, match="backend='mpi'"):
        resolve_backend("mpi", "cpu", 2)
    with pytest.raises(LabInputError, match="nproc=0"):
        launch(ping_worker, 0)


def test_line_up_runs_the_untimed_step_once_after_the_barrier():
    from labutils.measure.timing import line_up

    calls = []
    line_up("cpu", lambda: calls.append("step"))
    line_up("cpu")
    assert calls == ["step"]
