"""The instructor's run: failures reported with cell and error, the others still run, figures collected."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labutils.runner import find_notebooks, parse_params
from labutils.validate import LabInputError


def _notebook(path, *sources):
    cells = [nbformat.v4.new_code_cell("quick = False\nscale = 1")]
    cells[0].metadata["tags"] = ["parameters"]
    cells += [nbformat.v4.new_code_cell(src) for src in sources]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                         "display_name": "Python 3"}})
    nbformat.write(nb, path)


@pytest.fixture
def three_notebooks(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(src / "01_good.ipynb",
              "from labutils.results import record_figure\nvalue = 21.5 * scale\n"
              "record_figure('peak_busbw_GBps', value, 'GB/s', 'peak busbw')",
              "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]); plt.show()")
    _notebook(src / "02_bad.ipynb", "x = 1", "raise RuntimeError('made to fail')")
    _notebook(src / "03_after.ipynb", "from labutils.results import record_figure\n"
              "record_figure('quick_seen', int(quick))")
    return src


@pytest.mark.notebook
def test_failing_notebook_reported_others_still_run(three_notebooks, tmp_path):
    out = tmp_path / "out"  # given as a relative path: the kernels run in the notebooks' folder
    proc = subprocess.run([sys.executable, "-m", "labutils", "run-notebooks", "--notebooks", str(three_notebooks),
                           "--out", "out", "--quick", "--param", "scale=2"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2/3 notebooks succeeded" in proc.stdout
    assert "02_bad: failed in cell 3 (\"raise RuntimeError('made to fail')\"): RuntimeError: made to fail" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    nbs = summary["notebooks"]
    assert nbs["01_good"]["ok"] and nbs["03_after"]["ok"] and not nbs["02_bad"]["ok"]
    assert nbs["02_bad"]["failed_cell"] == 3  # counted from 1 in the committed notebook
    assert nbs["01_good"]["figures"]["peak_busbw_GBps"] == 43.0  # the value the notebook computed, scale=2
    assert nbs["03_after"]["figures"]["quick_seen"] == 1
    assert nbs["01_good"]["plots"] and (out / nbs["01_good"]["plots"][0]).exists()
    index = (out / "index.html").read_text()
    assert "FAILED in cell 3" in index and "01_good.html" in index and "43" in index
    for name in ("01_good", "02_bad", "03_after"):
        assert (out / f"{name}.html").exists() and (out / f"{name}.ipynb").exists()


def test_only_and_params_are_checked(three_notebooks):
    assert [p.stem for p in find_notebooks("01,03", three_notebooks)] == ["01_good", "03_after"]
    with pytest.raises(LabInputError, match="--only names no notebook: 09"):
        find_notebooks("09", three_notebooks)
    assert parse_params(["n=4", "label=gloo run", "flag=True"]) == {"n": 4, "label": "gloo run", "flag": True}
    with pytest.raises(LabInputError, match="name=value"):
        parse_params(["oops"])


@pytest.mark.notebook
def test_summary_holds_what_the_real_notebook_computed(tmp_path):
    """Run notebook 05 with a parameter changed; its summary figures equal the model's numbers."""
    from labutils.budget import evaluate
    from labutils.runner import run_notebooks

    outcomes = run_notebooks(only="05", quick=True, params={"bandwidth_GBps": 50.0}, out_dir=tmp_path)
    assert [o.ok for o in outcomes] == [True], outcomes[0].error
    figures = json.loads((tmp_path / "summary.json").read_text())["notebooks"]["05_time_budget"]["figures"]
    expected = evaluate(S_ms=0.8, C_ms=12.0, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000,
                        bandwidth_GBps=50.0)
    assert figures["budget_speedup"] == pytest.approx(expected.speedup, rel=1e-12)
    assert figures["budget_break_even_C_ms"] == pytest.approx(expected.break_even_C_ms, rel=1e-12)
    assert figures["budget_break_even_C_ms"] == pytest.approx(0.28 / 0.375)  # H / (1 - 1/(2η)) at 50 GB/s
