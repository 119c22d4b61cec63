import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def results_tmp(tmp_path_factory):
    """One results directory for the whole session, so nothing lands in data/results/."""
    path = tmp_path_factory.mktemp("results")
    return path


@pytest.fixture(autouse=True)
def _isolated_results(results_tmp, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(results_tmp))
    monkeypatch.delenv("LAB_FIGURES_FILE", raising=False)
    yield
