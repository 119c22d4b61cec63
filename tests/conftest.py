import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def results_tmp(tmp_path_factory):
    """One results directory shared by the notebook runs, so 03 finds what 02 measured."""
    return tmp_path_factory.mktemp("results")


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path_factory, monkeypatch):
    """Every test writes result files into a fresh directory of its own, never data/results/."""
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path_factory.mktemp("results")))
    monkeypatch.delenv("LAB_FIGURES_FILE", raising=False)
    yield
