"""benchmarks/gpu_check.py, tested on the CPU: targets as a pure function of fake summaries, the
missing-package sentence, bad input, the time limit that leaves nothing running, and the steps
themselves with --device cpu. The GPU figures it prints are never asserted here."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def _summary(seconds: dict, figures: dict) -> dict:
    return {"quick": False, "stopped": None, "notebooks": {
        name: {"ok": True, "seconds": s, "figures": figures.get(name, {}), "units": {}} for name, s in seconds.items()}}


def test_targets_pass_and_fail_from_fake_summaries(gc):
    good = {"run_wall_s": 150.0, "h2d_fraction": 0.88, "gloo_ratio_min": 0.97, "gloo_device": "cuda",
            "summary": _summary({"07_validating_the_budget": 40.0, "08_data_parallel_training": 55.0},
                                {"07_validating_the_budget": {"t2_median_error_pct": 12.5},
                                 "08_data_parallel_training": {"ddp_between_bounds": "3/4"}})}
    targets = gc.evaluate_targets(good)
    assert [t.status for t in targets] == ["PASS"] * 6
    assert "08_data_parallel_training" in targets[3].detail and "12.5%" in targets[2].detail
    bad = {**good, "run_wall_s": 200.0, "h2d_fraction": 0.5, "gloo_ratio_min": 0.9,
           "summary": _summary({"06_x": 61.0, "07_y": 10.0}, {"06_x": {"t2_median_error_pct": 25.0},
                                                              "07_y": {"ddp_between_bounds": "2/4"}})}
    targets = gc.evaluate_targets(bad)
    assert [t.status for t in targets] == ["FAIL"] * 6
    assert "slowest 06_x 61.0 s" in targets[1].detail


def test_targets_not_recorded_not_measured_and_older_names(gc):
    plain = {"summary": _summary({"00_check": 3.0}, {}), "run_wall_s": 10.0}
    statuses = [t.status for t in gc.evaluate_targets(plain)]
    assert statuses == ["PASS", "PASS", "NOT RECORDED", "NOT RECORDED", "NOT MEASURED", "NOT MEASURED"]
    older = {"summary": _summary({"06_v": 3.0}, {"06_v": {"tp_prediction_error": 14.0}}), "run_wall_s": 10.0}
    t2 = gc.evaluate_targets(older)[2]
    assert t2.status == "PASS" and "tp_prediction_error" in t2.detail
    assert all(t.status == "NOT MEASURED" for t in gc.evaluate_targets({}))
    weird = {"summary": _summary({"08": 1.0}, {"08": {"ddp_between_bounds": "most"}}), "run_wall_s": 1.0}
    assert gc.evaluate_targets(weird)[3].status == "FAIL"
    assert (gc.parse_fraction("3/4"), gc.parse_fraction("5/4"), gc.parse_fraction("x")) == ((3, 4), None, None)


def test_missing_packages_are_named_and_the_step_skipped(gc):
    def fake_find_spec(name):
        return None if name in ("papermill", "nbconvert") else object()

    assert gc.missing_packages(["torch", "papermill", "nbconvert"], fake_find_spec) == ["papermill", "nbconvert"]
    sentence = gc.skip_sentence(gc.STEPS[5], ["papermill", "nbconvert"])
    assert sentence.startswith("step 5 skipped: papermill, nbconvert are not importable here")
    assert "installs nothing" in sentence and "PYTHONPATH" in sentence
    step = gc.Step(9, "needs a package that is not there", 30, ("surely_not_a_module_here",))
    run = gc.run_step(step, None, 100)
    assert run.status == "SKIP" and "surely_not_a_module_here is not importable" in run.detail
    assert gc.run_step(gc.STEPS[2], None, 5).detail == "step 2 skipped: 5 s of the budget left"


def test_dry_run_and_bad_input():
    def run(*argv):
        return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)

    dry = run("--device", "cpu", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.count(" up to ") == 5, dry.stdout + dry.stderr
    for argv, needle in ((["--steps", "9"], "--steps 9"), (["--steps", "two"], "--steps 'two'"),
                         (["--budget-s", "0"], "--budget-s=0.0"), (["--device", "gpu"], "'gpu'")):
        bad = run(*argv)
        assert bad.returncode == 2 and bad.stdout == ""
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], bad.stderr


def test_a_step_past_its_limit_is_stopped_with_what_it_started(gc, tmp_path):
    pid_file = tmp_path / "pid"
    code = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n")
    started = time.monotonic()
    rc, seconds = gc.run_command([sys.executable, "-c", code], timeout_s=3)
    assert rc is None and 2.5 < seconds < 20 and time.monotonic() - started < 20
    grandchild = int(pid_file.read_text())
    assert not Path(f"/proc/{grandchild}").exists() or gc._zombie(grandchild)


@pytest.mark.distributed
def test_steps_2_to_4_on_the_cpu():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--steps", "2,3,4",
                           "--budget-s", "240"], capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode in (0, 1), out + proc.stderr  # 1 when the loaded machine misses the ratio target
    for line in ("2. NCCL with one rank", "3. gloo on CUDA: harness vs bare all_reduce", "4. host<->GPU copies"):
        row = next(r for r in out.splitlines() if r.startswith(line) and ("PASS" in r or "FAIL" in r))
        assert " PASS " in row, row
    assert "0 wrong element(s)" in out and "busbw ratio" in out and "host copy" in out
    assert "harness/bare gloo-on-cpu busbw at least 0.95 from 1 MiB: min " in out
    assert "NOT MEASURED full run under 180 s" in out


def _notebook(path, source):
    cells = [nbformat.v4.new_code_cell("quick = False"), nbformat.v4.new_code_cell(source)]
    cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}}), path)


@pytest.mark.notebook
def test_step_5_reads_figures_from_the_summary_and_an_overrun_leaves_a_summary(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "06_budget.ipynb", "from labutils.core.results import record_figure\n"
              "record_figure('t2_median_error_pct', 12.5, '%')\nrecord_figure('ddp_between_bounds', '4/4')")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "5", "--notebooks", str(nbs),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert "06_budget" in proc.stdout and "t2_median_error_pct=12.5 %" in proc.stdout, proc.stdout + proc.stderr
    assert "PASS         median T2 error under 20%: 12.5% (06_budget: t2_median_error_pct)" in proc.stdout
    assert "PASS         DDP step between its bounds for at least 3 of 4 sizes: 4/4" in proc.stdout
    assert json.loads((out / "notebooks" / "summary.json").read_text())["notebooks"]["06_budget"]["ok"]

    _notebook(nbs / "07_slow.ipynb", "import time\ntime.sleep(300)  # gpu-check-overrun")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "5", "--notebooks", str(nbs),
                           "--out", str(out), "--budget-s", "40"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "interrupted at the step's limit" in proc.stdout, proc.stdout + proc.stderr
    summary = json.loads((out / "notebooks" / "summary.json").read_text())
    assert summary["stopped"] and summary["notebooks"]["06_budget"]["ok"]
    assert not summary["notebooks"]["07_slow"]["ok"]
    left = subprocess.run(["pgrep", "-f", "gpu-check-overrun"], capture_output=True, text=True).stdout.split()
    assert not [p for p in left if int(p) != os.getpid()]
