"""The instructors' CI workflow (.github/workflows/lab.yml) parses and does what the README says."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "lab.yml"


@pytest.fixture(scope="module")
def job():
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request", "workflow_dispatch"} <= set(triggers)
    (only,) = doc["jobs"].values()
    return only


def test_the_job_runs_make_quick_on_a_hosted_cpu_runner_by_default(job):
    assert "'\"ubuntu-latest\"'" in job["runs-on"] and "vars.LAB_RUNS_ON" in job["runs-on"]
    runs = [step.get("run", "").strip() for step in job["steps"]]
    assert "make quick" in runs
    setup_python = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python"))
    assert setup_python["if"] == "runner.environment == 'github-hosted'", "a GPU runner keeps its own Python"


def test_out_is_kept_as_an_artifact_even_when_a_notebook_fails(job):
    (upload,) = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert upload["if"] == "always()"
    assert upload["with"]["path"].rstrip("/") == "out"
    steps = job["steps"]
    assert steps.index(upload) > next(i for i, s in enumerate(steps) if s.get("run", "").strip() == "make quick")


@pytest.mark.skipif(shutil.which("sed") is None, reason="sed is not installed")
def test_the_torch_step_installs_the_makefiles_pin_and_keeps_a_torch_already_there(job):
    (step,) = [s for s in job["steps"] if "import torch" in s.get("run", "")]
    script = step["run"]
    assert script.index("import torch") < script.index("pip install"), "an importable torch is kept"
    sed = re.search(r"\$\((sed [^)]*Makefile)\)", script).group(1)
    pin = subprocess.run(["sh", "-c", sed], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(r"torch==[\w.+]+", pin)
    assert "download.pytorch.org/whl/cpu" in script
