"""The instructor's run: failures reported with cell and error, the others still run, figures collected."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from labutils.core.inputs import LabInputError
from labutils.course.runner import find_notebooks, parse_params


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
              "from labutils.core.results import record_figure\nvalue = 21.5 * scale\n"
              "record_figure('peak_busbw_GBps', value, 'GB/s', 'peak busbw')",
              "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]); plt.show()")
    _notebook(src / "02_bad.ipynb", "x = 1", "raise RuntimeError('made to fail')")
    _notebook(src / "03_after.ipynb", "from labutils.core.results import record_figure\n"
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
    assert ("02_bad: failed in cell 3 (\"raise RuntimeError('made to fail')\"): RuntimeError: made to fail"
            in proc.stdout)
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
    """Run notebook 08 with a parameter changed; its summary figures equal the model's numbers."""
    from labutils.course.runner import run_notebooks
    from labutils.model.budget import evaluate

    outcomes = run_notebooks(only="08", quick=True, params={"bandwidth_GBps": 50.0}, out_dir=tmp_path)
    assert [o.ok for o in outcomes] == [True], outcomes[0].error
    figures = json.loads((tmp_path / "summary.json").read_text())["notebooks"]["08_time_budget"]["figures"]
    expected = evaluate(S_ms=0.8, C_ms=12.0, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000,
                        bandwidth_GBps=50.0)
    assert figures["budget_speedup"] == pytest.approx(expected.speedup, rel=1e-12)
    assert figures["budget_break_even_C_ms"] == pytest.approx(expected.break_even_C_ms, rel=1e-12)
    assert figures["budget_break_even_C_ms"] == pytest.approx(0.28 / 0.375)  # H / (1 - 1/(2η)) at 50 GB/s


@pytest.mark.notebook
def test_a_failing_stage_is_reported_and_the_rest_still_runs(tmp_path, monkeypatch):
    """HTML export raising, a corrupted image output, a mangled figures file: each is listed for
    its notebook with the stage, and the notebooks after it still run and render."""
    from labutils.course import runner

    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(src / "01_html_breaks.ipynb", "from labutils.core.results import record_figure\nrecord_figure('a', 1)")
    _notebook(src / "02_bad_png.ipynb", "from IPython.display import display\n"
              "display({'image/png': 'not base64!!', 'text/plain': 'x'}, raw=True)")
    _notebook(src / "03_bad_figures.ipynb", "import os\nopen(os.environ['LAB_FIGURES_FILE'], 'w').write('[1, 2')")
    _notebook(src / "04_fine.ipynb", "from labutils.core.results import record_figure\nrecord_figure('b', 2.5, 'ms')")
    real_render = runner._render_html

    def render(nb, html_path):
        if html_path.stem == "01_html_breaks":
            raise OSError("template directory missing")
        real_render(nb, html_path)

    monkeypatch.setattr(runner, "_render_html", render)
    out = tmp_path / "out"
    outcomes = runner.run_notebooks(quick=True, out_dir=out, directory=src)
    by = {o.name: o for o in outcomes}
    assert [o.name for o in outcomes] == ["01_html_breaks", "02_bad_png", "03_bad_figures", "04_fine"]
    assert (by["01_html_breaks"].ok, by["01_html_breaks"].failed_stage) == (False, "html")
    assert by["01_html_breaks"].failure == "failed while rendering HTML: OSError: template directory missing"
    assert by["01_html_breaks"].figures["a"]["value"] == 1  # the later stages still ran
    assert (by["02_bad_png"].failed_stage, by["02_bad_png"].plots) == ("plots", ())
    assert by["02_bad_png"].error.startswith("cell 2: Error: Invalid base64-encoded string")
    assert by["03_bad_figures"].failed_stage == "figures" and "JSONDecodeError" in by["03_bad_figures"].error
    assert by["04_fine"].ok and by["04_fine"].figures["b"]["value"] == 2.5
    summary = json.loads((out / "summary.json").read_text())
    nbs = summary["notebooks"]
    assert summary["stopped"] is None
    assert {k: v["failed_stage"] for k, v in nbs.items()} == {"01_html_breaks": "html", "02_bad_png": "plots",
                                                             "03_bad_figures": "figures", "04_fine": ""}
    assert nbs["01_html_breaks"]["html"] is None and nbs["04_fine"]["figures"] == {"b": 2.5}
    index = (out / "index.html").read_text()
    assert "FAILED while rendering HTML" in index and "FAILED while recording figures" in index
    assert '<a href="04_fine.html">' in index and '<a href="01_html_breaks.html">' not in index


def test_an_interrupted_run_still_writes_index_and_summary(tmp_path, monkeypatch, three_notebooks):
    """The run itself stops (here: an error outside any notebook on the second one): index.html
    and summary.json still list what ran and what did not; the error is raised again."""
    from labutils.course import runner

    def fake_execute(path, out_dir, parameters=None, results_dir=None):
        if path.stem == "02_bad":
            raise KeyboardInterrupt
        return runner.NotebookOutcome(path.stem, True, 1.5, Path(out_dir) / path.name,
                                      Path(out_dir) / f"{path.stem}.html", figures={"x": {"value": 3, "unit": ""}})

    monkeypatch.setattr(runner, "execute_notebook", fake_execute)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        runner.run_notebooks(out_dir=out, directory=three_notebooks)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] == "KeyboardInterrupt"
    nbs = summary["notebooks"]
    assert nbs["01_good"]["ok"] and nbs["01_good"]["figures"] == {"x": 3}
    assert [nbs[n]["failed_stage"] for n in ("02_bad", "03_after")] == ["stopped", "not run"]  # 02 was running
    index = (out / "index.html").read_text()
    assert "The run stopped early: KeyboardInterrupt" in index and "not run" in index


def test_out_folder_may_not_be_the_notebooks_folder(three_notebooks):
    from labutils.course.runner import run_notebooks

    with pytest.raises(LabInputError, match="is the notebooks' folder"):
        run_notebooks(out_dir=three_notebooks, directory=three_notebooks)


@pytest.mark.notebook
def test_sigterm_stops_the_run_and_still_writes_summary_and_index(tmp_path):
    """A job's time limit sends SIGTERM: the run ends at once with 143, and both files say what ran."""
    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(src / "01_quick.ipynb", "x = 1")
    _notebook(src / "02_slow.ipynb", "import time\nopen('started', 'w').close()\ntime.sleep(120)")
    _notebook(src / "03_never.ipynb", "x = 3")
    proc = subprocess.Popen([sys.executable, "-m", "labutils", "run-notebooks", "--notebooks", str(src),
                             "--out", str(tmp_path / "out")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    deadline = time.monotonic() + 180
    while not (src / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the slow notebook's kernel runs in the notebooks' folder
    assert (src / "started").exists(), "the slow notebook never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in err
    nbs = json.loads((tmp_path / "out" / "summary.json").read_text())["notebooks"]
    assert nbs["01_quick"]["ok"] and not nbs["02_slow"]["ok"] and not nbs["03_never"]["ok"]
    assert "stopped while it ran" in nbs["02_slow"]["error"] and "before it" in nbs["03_never"]["error"]
    assert "not run" in (tmp_path / "out" / "index.html").read_text()
