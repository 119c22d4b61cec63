"""The launcher: real gloo ranks, failures named by rank, nothing left running; the backend and each
rank's device chosen from the GPU count (faked), NCCL differing from gloo on CUDA only in its name."""

import os
import types

import pytest
import torch
from rank_workers import faulty_ping_worker

from labutils.core.inputs import LabInputError
from labutils.measure.launch import (
    RankError,
    barrier_kwargs,
    ping_worker,
    rank_plan,
    ranks_per_gpu,
    resolve_backend,
)
from labutils.measure.pool import launch

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
        # 20 s: the peer's collective gives up at 80% of the time left after start-up, and on a loaded
        # machine (the suite runs in parallel) it needs the slack to report before the deadline
        launch(faulty_ping_worker, 2, kwargs={"fault_rank": 1, "fault": "hang"}, timeout_s=20)
    assert time.monotonic() - started < 40
    assert info.value.rank == 1
    assert "stopped responding" in str(info.value)


def test_no_child_survives_a_failure():
    import multiprocessing as mp

    before = set(mp.active_children())  # an earlier test's shared pool may still be up: not this launch's
    with pytest.raises(RankError):
        launch(faulty_ping_worker, 2, kwargs={"fault_rank": 0, "fault": "hang"}, timeout_s=6)
    assert set(mp.active_children()) <= before


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


# --- the launching side opens no CUDA context (8 GPUs faked: torch.cuda and NVML) -----------------------------

def test_the_launching_side_reads_gpus_through_nvml_only(fake_gpus):
    from labutils.course.machine import detect_case
    from labutils.measure.launch import free_memory_bytes, gpu_names, gpu_numa_nodes, visible_gpus
    from labutils.measure.sweep import check_memory, sweep_meta

    calls = fake_gpus(8)
    assert free_memory_bytes("cuda", 8) == 70 << 30 and free_memory_bytes("cuda", 2) == 70 << 30
    assert gpu_names(2) == ("NVIDIA H100 80GB HBM3 #0", "NVIDIA H100 80GB HBM3 #1")
    case = detect_case()
    assert case.kind == "multi-gpu" and case.gpu_names[7] == "NVIDIA H100 80GB HBM3 #7"
    meta = sweep_meta("nccl", "cuda", 16)
    assert meta["devices"][5] == meta["devices"][13] == "NVIDIA H100 80GB HBM3 #5"
    check_memory(1 << 30, 8, "cuda", 8)
    with pytest.raises(LabInputError, match="max_bytes"):
        check_memory(30 << 30, 8, "cuda", 8)
    assert gpu_numa_nodes(8) == (0, 0, 0, 0, 1, 1, 1, 1) and gpu_numa_nodes(10)[8:] == (0, 0)
    assert [g.bus_id for g in visible_gpus()][:2] == ["00000000:18:00.0", "00000000:28:00.0"]
    assert calls == []  # no mem_get_info, get_device_name, set_device, ... in this process


def test_cuda_visible_devices_picks_nvml_gpus(fake_gpus, monkeypatch):
    from labutils.measure.launch import free_memory_bytes, gpu_names, visible_gpus

    fake_gpus(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert gpu_names(2) == ("NVIDIA H100 80GB HBM3 #6", "NVIDIA H100 80GB HBM3 #7")
    assert free_memory_bytes("cuda", 2) == 76 << 30
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,9,1")  # CUDA stops at the first GPU that does not exist
    assert [g.index for g in visible_gpus()] == [3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3e2c1a")  # by UUID: NVML's order says nothing
    assert visible_gpus() is None


def test_without_nvml_the_device_properties_stand_in(fake_gpus, monkeypatch):
    import types

    from labutils.measure import launch as lab_launch

    calls = fake_gpus(2)
    monkeypatch.setattr(lab_launch, "nvml_facts", lambda: ([], "NVML is not available"))
    props = types.SimpleNamespace(name="NVIDIA L4", total_memory=24 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert lab_launch.gpu_names(2) == ("NVIDIA L4", "NVIDIA L4")
    assert lab_launch.free_memory_bytes("cuda", 2) == 24 << 30 and lab_launch.gpu_numa_nodes(2) == ()
    assert calls == []


# --- each rank its own GPU: spawned ranks and torchrun's variables (8 GPUs faked) -----------------------------

@pytest.fixture
def recorded_group(monkeypatch):
    """dist.init_process_group recorded instead of run: a list of its keyword arguments."""
    import torch.distributed as dist

    groups = []

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           device_id=None):
        groups.append({k: v for k, v in locals().items() if k not in ("device_id", "store") or v is not None})
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")  # restored (unset) after the test; init_rank sets it
    return groups


def test_spawned_ranks_each_take_their_own_gpu(fake_gpus, recorded_group):
    from labutils.measure.launch import init_rank

    calls = fake_gpus(8)
    for r in range(8):  # as `_child` calls it: local rank = rank
        ctx = init_rank("nccl", "cuda", r, 8, r, 60.0)
        assert ctx.device == f"cuda:{r}" and (ctx.rank, ctx.world_size, ctx.local_rank) == (r, 8, r)
    assert calls == [("set_device", (r,)) for r in range(8)]
    assert [g["device_id"] for g in recorded_group] == [torch.device(f"cuda:{r}") for r in range(8)]
    assert [(g["backend"], g["rank"], g["world_size"]) for g in recorded_group] == [("nccl", r, 8) for r in range(8)]
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    init_rank("gloo", "cuda", 9, 10, 9, 60.0)  # gloo shares GPUs (9 % 8) and binds no device to its group
    assert calls[-1] == ("set_device", (1,)) and "device_id" not in recorded_group[-1]


def test_torchrun_rank_13_of_16_takes_cuda_5(fake_gpus, recorded_group, monkeypatch):
    from labutils.measure import launch as lab_launch

    calls = fake_gpus(8)
    pinned, planned = [], []
    real_plan = lab_launch.machine_placement
    monkeypatch.setattr(lab_launch, "set_rank_threads", lambda placement: None)
    monkeypatch.setattr(lab_launch, "pin_rank", lambda placement, local_rank: pinned.append(local_rank))
    monkeypatch.setattr(lab_launch, "machine_placement",
                        lambda n, **kw: planned.append((n, kw)) or real_plan(n, **kw))
    for name, value in dict(RANK=13, LOCAL_RANK=5, LOCAL_WORLD_SIZE=8, WORLD_SIZE=16, MASTER_ADDR="10.0.0.1",
                            MASTER_PORT=29500).items():
        monkeypatch.setenv(name, str(value))
    met = []
    monkeypatch.setattr(lab_launch, "rendezvous_store", lambda rank, world, timeout_s: met.append(
        (rank, world, timeout_s)) or types.SimpleNamespace(set_timeout=lambda t: met.append(t.total_seconds())))
    ctx = lab_launch.run_this_rank(lambda ctx: ctx, backend="nccl", device="cuda")
    assert met == [(13, 16, lab_launch.RENDEZVOUS_TIMEOUT_S), 300.0]  # a short wait to meet, then the job's
    assert (ctx.device, ctx.rank, ctx.world_size, ctx.local_rank) == ("cuda:5", 13, 16, 5)
    assert calls == [("set_device", (5,))] and pinned == [5]
    assert [(g["rank"], g["world_size"], g["device_id"]) for g in recorded_group] == [(13, 16, torch.device("cuda:5"))]
    assert planned == [(8, {"gpu_nodes": (0, 0, 0, 0, 1, 1, 1, 1)})]


def test_group_kwargs_follow_the_installed_signature(monkeypatch):
    import torch.distributed as dist

    from labutils.measure.launch import group_kwargs

    nccl = rank_plan("nccl", "cuda", 3, 8)
    assert group_kwargs(nccl) == {"device_id": torch.device("cuda:3")}
    assert group_kwargs(rank_plan("gloo", "cuda", 3, 8)) == group_kwargs(rank_plan("gloo", "cpu", 0, 0)) == {}

    def old_init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1):
        pass
    monkeypatch.setattr(dist, "init_process_group", old_init_process_group)
    assert group_kwargs(nccl) == {}  # a torch without device_id: the rank's current GPU is enough


# --- the preflight: on for NCCL, off for gloo; a stalled rank is named within its timeout ---------------------

def test_preflight_is_on_for_nccl_and_off_for_gloo():
    from labutils.measure.launch import preflight_all_reduce, preflight_for

    assert preflight_for("nccl", None) is preflight_all_reduce and preflight_for("gloo", None) is None
    assert preflight_for("gloo", True) is preflight_all_reduce and preflight_for("nccl", False) is None
    with pytest.raises(LabInputError, match="preflight='yes'"):
        preflight_for("nccl", "yes")
    with pytest.raises(LabInputError, match="preflight_timeout_s=0"):
        launch(ping_worker, 2, preflight_timeout_s=0)


@pytest.mark.distributed
def test_preflight_passes_on_healthy_gloo_ranks():
    out = launch(ping_worker, 2, preflight=True, preflight_timeout_s=30, timeout_s=120)
    assert [r["sum"] for r in out] == [1.0, 1.0]


@pytest.mark.distributed
def test_preflight_names_the_rank_that_stalled_within_its_timeout():
    import functools
    import time

    from rank_workers import stalled_preflight

    started = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(ping_worker, 2, preflight=functools.partial(stalled_preflight, stall_rank=1), preflight_timeout_s=3,
               timeout_s=300)
    # start-up (spawn, import torch: seconds on a busy 2-core machine) + 3 s, far from the 300 s of the run
    # and from the 240 s after which rank 0's own all-reduce would have given up
    assert time.monotonic() - started < 45
    assert info.value.rank == 1
    assert "rank 1 stalled before the preflight all-reduce" in str(info.value)
    assert "rank(s) 0 waited in the all-reduce" in str(info.value)


@pytest.mark.distributed
def test_preflight_says_the_link_hangs_when_every_rank_waits_in_it():
    from rank_workers import hung_link_preflight

    with pytest.raises(RankError) as info:
        launch(ping_worker, 2, preflight=hung_link_preflight, preflight_timeout_s=2, timeout_s=300)
    assert info.value.rank is None
    assert "rank(s) 0, 1 entered one small all-reduce" in str(info.value) and "NCCL_P2P_DISABLE=1" in str(info.value)


# --- every rank makes the same collectives in the same order, each tensor on its own device -------------------

def _sweep_job():
    from labutils.measure.harness import sweep_worker

    return sweep_worker, {"ops": ["all_reduce", "all_gather", "reduce_scatter", "broadcast"], "sizes": [1024, 8192],
                          "warmup": 1, "budget_ms": 1.0, "min_iters": 1, "max_iters": 3}


def _split_layer_job():
    from labutils.experiments.split_timing import time_layers_worker

    return time_layers_worker, {"sizes": [(4, 16, 32)], "modes": ("whole", "split", "overlap"), "chunks": (2,),
                                "warmup": 1, "min_reps": 2, "max_reps": 2, "budget_s": 0.001}


def _ddp_step_job():
    from labutils.experiments.ddp_step import StepConfig, train_worker

    return train_worker, {"configs": [StepConfig(16, 2, 4, mode, steps=2, warmup=1) for mode in ("ddp", "no_overlap")]}


@pytest.mark.distributed
@pytest.mark.parametrize("job", [_sweep_job, _split_layer_job, _ddp_step_job], ids=["sweep", "split_layer", "ddp_step"])
def test_ranks_make_the_same_collectives_in_order(job):
    from rank_workers import recording_worker

    worker, kwargs = job()
    out = launch(recording_worker, 2, args=(worker,), kwargs=kwargs, timeout_s=300)
    calls = [o["calls"] for o in out]
    assert calls[0] and calls[0] == calls[1], "ranks made different collective calls"
    names = {name for name, _, _ in calls[0]}
    assert "all_reduce" in names and ("barrier" in names or "broadcast" in names)
    for o in out:
        assert all(dev == o["device"] for _, devices, _ in o["calls"] for dev in devices)


# --- the rendezvous of a launched job: MASTER_PORT and MASTER_ADDR checked, a short wait of its own ---------------

@pytest.mark.parametrize("port, needle", [("abc", "MASTER_PORT='abc' is not a whole number"),
                                          ("99999", "MASTER_PORT=99999 is outside the allowed range [1, 65535]"),
                                          ("0", "MASTER_PORT=0 is outside"), ("-1", "MASTER_PORT=-1 is outside")])
def test_a_bad_master_port_is_one_line_and_exit_2(monkeypatch, capsys, port, needle):
    from labutils.cli import main

    for name, value in dict(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port).items():
        monkeypatch.setenv(name, str(value))
    assert main(["sweep", "--backend", "gloo", "--no-save", "--no-progress"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error:") and needle in last


def test_an_unresolvable_master_addr_is_one_line_and_exit_2_at_once():
    import subprocess
    import sys
    import time

    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29511"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "labutils", "sweep", "--backend", "gloo", "--no-save",
                          "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: MASTER_ADDR='no-such-host.invalid' does not resolve")
    assert time.monotonic() - started < 60


def test_check_master_addr_gives_up_on_a_silent_name_server(monkeypatch):
    import threading

    from labutils.measure import launch as lab_launch

    never = threading.Event()
    monkeypatch.setattr(lab_launch.socket, "getaddrinfo", lambda *a, **k: never.wait(30))
    with pytest.raises(LabInputError, match="did not resolve within 0.2 s"):
        lab_launch.check_master_addr("slow.example", timeout_s=0.2)
    never.set()
    assert lab_launch.check_master_addr("127.0.0.1") == "127.0.0.1"


@pytest.mark.distributed
def test_a_peer_that_never_comes_ends_the_rendezvous_in_one_line(monkeypatch):
    """Rank 1 of 2 at a port nobody serves: refused within the rendezvous timeout, not the job's."""
    import time

    from labutils.measure import launch as lab_launch
    from labutils.measure.launch import free_port

    for name, value in dict(RANK=1, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port()).items():
        monkeypatch.setenv(name, str(value))
    started = time.monotonic()
    with pytest.raises(LabInputError) as info:
        lab_launch.run_this_rank(ping_worker, timeout_s=600, rendezvous_timeout_s=3)
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "\n" not in message and message.startswith("rank 1 of 2 did not meet the others at MASTER_ADDR=127.0.0.1")
    assert "rendezvous timeout of 3 s" in message
