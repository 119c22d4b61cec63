import functools
import sys
from pathlib import Path

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
