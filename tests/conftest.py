import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def results_tmp(tmp_path_factory):
    """One results directory shared by the notebook runs, so 05 finds what 02 measured."""
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="module", autouse=True)
def _ranks_stopped_after_each_module():
    """A kernel keeps its shared rank pool alive on purpose; a test process holds many modules, so the
    pool one module started is stopped when it ends, and the next module (test_contract checks that
    nothing is left running) starts with no rank process of an earlier one."""
    yield
    from labutils.measure.pool import stop_shared_pool

    stop_shared_pool()


@pytest.fixture(autouse=True)
def _signals_restored():
    """A test that leaves Ctrl-C ignored in the test process would pass that to every process it
    starts later (an ignored signal stays ignored across exec, and Python then installs no
    KeyboardInterrupt): the handlers of SIGINT and SIGTERM are put back after each test."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path_factory, monkeypatch):
    """Every test writes result files into a fresh directory of its own, never data/results/."""
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path_factory.mktemp("results")))
    monkeypatch.delenv("LAB_FIGURES_FILE", raising=False)
    yield


@pytest.fixture
def plant_fault(monkeypatch):
    """`plant_fault(fault, rank)`: the sweeps this test runs (run_sweep, `python -m labutils sweep` in
    process) spawn ranks in which `rank` misbehaves: "hang", "crash", "raise" or "corrupt" (see
    rank_workers.misbehave)."""
    import rank_workers

    import labutils.measure.sweep

    def plant(fault: str, rank: int = 1) -> None:
        worker = functools.partial(rank_workers.faulty_sweep_worker, fault_rank=rank, fault=fault)
        monkeypatch.setattr(labutils.measure.sweep, "sweep_worker", worker)
    return plant


def _true_us(size):
    cached = min(size, 1 << 20)
    return 60 + cached / 4e3 + max(0, size - (1 << 20)) / 1.6e3


def _synthetic_sweep(world_size=2):
    """gloo-like: 60 us fixed, 4 GB/s while the buffer fits in cache (< 1 MiB), 1.6 GB/s beyond."""
    sizes = 2 ** np.arange(10, 27)
    return pd.DataFrame({"size_bytes": sizes, "time_us": [_true_us(s) for s in sizes], "world_size": world_size,
                         "op": "all_reduce", "wrong": 0})


@pytest.fixture
def true_us():
    """`true_us(size_bytes)`: the time of the curve `synthetic_sweep` measures, at any size (us)."""
    return _true_us


@pytest.fixture
def synthetic_sweep():
    """`synthetic_sweep(world_size=2)`: an all-reduce sweep frame, 1 KiB to 64 MiB, whose time bends where
    the buffer leaves the cache (a curve one alpha-beta line misses); read by fit, ddp_model and sweep tests."""
    return _synthetic_sweep


@pytest.fixture
def h200():
    """NVML's facts for an idle H200 on PCIe 5.0 x16 (faked): the link idles at gen 1, no NVLink."""
    from labutils.readers.topology import GpuFacts

    return GpuFacts(0, "NVIDIA H200", pcie_gen=1, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, nvlinks_active=0)


def _needs_gpu(item) -> bool:
    """Marked `cuda`, or skipped without a GPU by a skipif whose reason names CUDA or a GPU."""
    if item.get_closest_marker("cuda"):
        return True
    return any(any(w in str(m.kwargs.get("reason", "")).lower() for w in ("cuda", "gpu"))
               for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    """`-m cuda` selects every test that needs a GPU (benchmarks/gpu_check.py runs them): tests
    marked `cuda` are skipped where torch sees no GPU, and GPU-only skipif tests get the marker."""
    import torch

    has_gpu = torch.cuda.is_available()
    for item in items:
        if not _needs_gpu(item):
            continue
        item.add_marker(pytest.mark.cuda)
        if not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


# Calls that make (or need) a CUDA context, or initialise CUDA in the calling process: the launching
# side (notebook kernel, CLI) must make none of them; a rank makes set_device for its own GPU only.
CONTEXT_CALLS = ("mem_get_info", "get_device_name", "get_device_properties", "get_device_capability", "set_device",
                 "init", "_lazy_init", "current_device", "synchronize", "empty_cache", "memory_allocated",
                 "memory_reserved", "ipc_collect")


def _fake_pynvml(names, free_bytes, numa_nodes):
    """A pynvml module for len(names) GPUs: NVML's name, memory, PCI bus id and NUMA node of each."""
    import types

    class NVMLError(Exception):
        pass

    def unsupported(*_):
        raise NVMLError("Not Supported")

    handle = int
    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=2, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(names), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: names[h], nvmlDeviceGetNvLinkState=unsupported,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5, nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=free_bytes[h], total=80 << 30),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * h:02X}:00.0".encode()),
        nvmlDeviceGetNumaNodeId=lambda h: numa_nodes[h])


@pytest.fixture
def fake_gpus(monkeypatch):
    """`fake_gpus(count=8)`: torch sees `count` CUDA GPUs and NVML describes them (H100s; GPU i has
    (70 + i) GiB free; the first half on NUMA node 0, the rest on node 1). Returns the list into which
    every context-making torch.cuda call (CONTEXT_CALLS) is recorded as (name, args) instead of run."""
    import torch

    calls: list = []

    def install(count: int = 8) -> list:
        names = [f"NVIDIA H100 80GB HBM3 #{i}" for i in range(count)]
        nvml = _fake_pynvml(names, [(70 + i) << 30 for i in range(count)],
                            [0 if i < count // 2 else 1 for i in range(count)])
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        for name in CONTEXT_CALLS:
            if hasattr(torch.cuda, name):
                monkeypatch.setattr(torch.cuda, name, functools.partial(lambda n, *a, **k: calls.append((n, a)), name))
        return calls
    return install


@pytest.fixture
def block_starts(monkeypatch, tmp_path):
    """`block_starts(stop)`: every way of starting a rank or a process, or of writing a result, calls
    `stop` instead (which raises); results go to a fresh folder, torchrun's variables are unset and the
    test runs in `tmp_path`, which it returns. The bad-input contract and the hostile rounds use it."""
    import multiprocessing
    import subprocess
    import sys

    import labutils.core.results
    import labutils.measure.launch
    import labutils.measure.sweep

    def block(stop):
        for module in ("labutils.measure.pool", "labutils.measure.sweep", "labutils.experiments.megatron",
                       "labutils.experiments.tensor_parallel"):
            mod = sys.modules.get(module) or __import__(module, fromlist=["x"])
            for name in ("launch", "shared_pool", "run_tp_check"):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, stop)
        monkeypatch.setattr(labutils.measure.launch, "run_this_rank", stop)
        monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", stop)
        monkeypatch.setattr(subprocess, "Popen", stop)
        monkeypatch.setattr(labutils.core.results, "save_result", stop)
        monkeypatch.setattr(labutils.core.results, "write_atomic", stop)
        monkeypatch.setattr(labutils.measure.sweep, "save_sweep", stop)
        monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path / "results"))
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                     "LAB_OVERSUBSCRIBE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.chdir(tmp_path)
        return tmp_path

    return block
