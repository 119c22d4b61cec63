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
    """One results directory shared by the notebook runs, so 04 finds what 02 measured."""
    return tmp_path_factory.mktemp("results")


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
