"""The launcher: real gloo ranks, failures named by rank, nothing left running; the backend and each
rank's device chosen from the GPU count (faked), NCCL differing from gloo on CUDA only in its name."""

import os

import pytest
import torch
from rank_workers import faulty_ping_worker

from labutils.core.inputs import LabInputError
from labutils.measure.launch import (
    RankError,
    barrier_kwargs,
    launch,
    ping_worker,
    rank_plan,
    ranks_per_gpu,
    resolve_backend,
)

NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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


# --- on a CUDA GPU only (skipped here; benchmarks/gpu_check.py runs them: pytest -m cuda) -------------

@NEEDS_GPU
def test_gpu_two_gloo_ranks_share_one_gpu():
    out = launch(ping_worker, 2, backend="gloo", device="cuda", timeout_s=120)
    assert [r["sum"] for r in out] == [1.0, 1.0]
