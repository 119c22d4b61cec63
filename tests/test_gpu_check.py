"""benchmarks/gpu_check.py, tested on the CPU: the plan and its limits against the budget, the
notebooks steps with a fake runner (tests/fake_runner.py: no notebook executes), targets as a
pure function of fake summaries, the missing-package sentence, bad input, the time limit that
leaves nothing running, and one real step (4, a host copy) in its own process. The GPU figures it
prints are never asserted here."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
FAKE_RUNNER = Path(__file__).resolve().parent / "fake_runner.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


@pytest.fixture
def fake_runner(gc, tmp_path, monkeypatch):
    """Notebook files 00_a, 01_b, 02_c, 09_v, 10_d (empty: the fake runner never opens them), the
    fake runner in place of run-notebooks, and `use(plan, step_s)`: the parsed args of a --device
    cpu run with `step_s` seconds left to its step. `calls()` lists what the runner was asked."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for stem in ("00_a", "01_b", "02_c", "09_v", "10_d"):
        (nbs / f"{stem}.ipynb").write_text("{}")
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setattr(gc, "RUNNER", (str(FAKE_RUNNER),))
    monkeypatch.setenv("FAKE_RUNNER_CALLS", str(calls))

    class Fake:
        out = tmp_path / "out"

        @staticmethod
        def use(plan: dict, step_s: float = 60.0, *extra):
            monkeypatch.setenv("FAKE_RUNNER_PLAN", json.dumps(plan))
            args = gc.parse_args(["--device", "cpu", "--out", str(Fake.out), "--notebooks", str(nbs), *extra])
            args.deadline = time.monotonic() + step_s
            return args

        @staticmethod
        def calls() -> list[dict]:
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    return Fake


def _summary(seconds: dict, figures: dict, status: dict | None = None) -> dict:
    return {"quick": False, "notebooks": {
        name: {"ok": True, "status": (status or {}).get(name, "PASS" if s <= 60 else "FAIL"), "seconds": s,
               "figures": figures.get(name, {}), "units": {}} for name, s in seconds.items()}}


# --- the plan ------------------------------------------------------------------------------------

def test_the_default_plan_fits_480_s_and_a_smaller_budget_scales_it(gc):
    plan = gc.schedule([1, 2, 3, 4, 5, 6], gc.BUDGET_S)
    assert [(s.number, limit) for s, limit, _ in plan] == [(1, 60), (2, 40), (3, 40), (4, 30), (5, 150), (6, 155)]
    assert [ends for _, _, ends in plan] == [60, 100, 140, 170, 320, 475]
    assert gc.BUDGET_S == 480 and 475 + gc.OWN_S <= gc.BUDGET_S
    half = gc.schedule([1, 2, 3, 4, 5, 6], 242.5)  # (242.5 - 5) / 475 = 0.5
    assert [limit for _, limit, _ in half] == [30, 20, 20, 15, 75, 77.5] and half[-1][2] == pytest.approx(237.5)
    assert [limit for _, limit, _ in gc.schedule([5], 480)] == [150]  # a budget larger than the plan: no scaling up


def test_notebooks_07_and_08_come_first_then_the_rest_in_course_order(gc, tmp_path):
    for stem in ("10_d", "00_a", "09_v", "03_c", "01_b"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
    assert gc.notebook_order(tmp_path) == (["09_v", "10_d"], ["00_a", "01_b", "03_c"])
    first, rest = gc.notebook_order()
    assert first == ["09_validating_the_budget", "10_data_parallel_training"] and rest[0].startswith("00_")
    assert gc.notebook_order(tmp_path / "nothing") == ([], [])


def test_dry_run_prints_the_plan_and_runs_nothing(gc, fake_runner, monkeypatch, capsys):
    monkeypatch.setattr(gc, "_machine", lambda: {"cpu_cores": 2, "gpu_count": 0, "nvidia_smi": None})
    monkeypatch.setattr(gc, "placement_line", lambda: "CPU placement: (test)")
    nbs = str(fake_runner.use({}).notebooks)
    assert gc.main(["--device", "cpu", "--dry-run", "--notebooks", nbs]) == 0
    out = capsys.readouterr().out
    assert "plan: budget 480 s, the step limits add up to 475 s" in out
    rows = [line for line in out.splitlines() if " up to " in line and ", ends by " in line]
    assert [r.split(".")[0].strip() for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert "5. notebooks 09 and 10, each alone: up to 150 s, ends by 320 s; all packages importable" in out
    assert "full mode, in order: 09_v, then 10_d; each up to 72 s" in out
    assert "full mode, in order: 00_a, 01_b, 02_c; each up to 75 s while the step has time" in out
    assert fake_runner.calls() == [] and not fake_runner.out.exists()
    assert gc.main(["--dry-run", "--steps", "5", "--budget-s", "85"]) == 0  # no GPU here: the plan all the same
    out = capsys.readouterr().out
    assert "nothing to check" in out and "5. notebooks 09 and 10, each alone: up to 80 s, ends by 80 s" in out


def test_bad_input_is_one_line_and_exit_status_2(gc, capsys):
    for argv, needle in ((["--steps", "9"], "--steps 9 is outside the steps 1-6"), (["--steps", "two"], "'two'"),
                         (["--budget-s", "0"], "--budget-s=0.0"), (["--device", "gpu"], "'gpu'")):
        with pytest.raises(SystemExit) as exit_:
            gc.parse_args(argv)
        out, err = capsys.readouterr()
        assert exit_.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


# --- the notebooks steps, with the fake runner ----------------------------------------------------

def test_07_and_08_run_first_each_alone_with_their_figures_and_the_60_s_target(gc, fake_runner, capsys):
    args = fake_runner.use({"09_v": {"seconds": 41.5, "figures": {"t2_median_error_pct": 12.5}, "units": {
        "t2_median_error_pct": "%"}}, "10_d": {"seconds": 61.0, "figures": {"ddp_between_estimates": "3/4"}}}, 60.0)
    facts = gc.step_first_notebooks(args)
    calls = fake_runner.calls()
    assert [c["only"] for c in calls] == ["09_v", "10_d"]  # one runner per notebook, 09 first
    assert [Path(c["out"]).name for c in calls] == ["09_v", "10_d"] and not any(c["quick"] for c in calls)
    assert {c["results_dir"] for c in calls} == {str(fake_runner.out / "results")}  # one results folder for all
    runs = facts["summary"]["notebooks"]
    assert (runs["09_v"]["status"], runs["09_v"]["seconds"]) == ("PASS", 41.5)
    assert (runs["10_d"]["status"], runs["10_d"]["error"]) == ("FAIL", "over the 60 s target")
    assert facts["status"] == "FAIL" and facts["detail"].startswith("1/2 PASS in 102 s, 1 FAIL")
    out = capsys.readouterr().out
    assert "09_v" in out and "PASS" in out and "t2_median_error_pct=12.5 %" in out
    assert "ddp_between_estimates=3/4" in out


def test_a_notebook_past_its_limit_is_stopped_and_the_rest_still_run(gc, fake_runner, tmp_path, monkeypatch):
    pid_file = tmp_path / "kernel.pid"
    monkeypatch.setattr(gc, "NOTEBOOK_LIMIT_S", 1.5)
    monkeypatch.setattr(gc, "MIN_LIMIT_S", 0.5)
    args = fake_runner.use({"01_b": {"sleep_s": 60, "child_pid_file": str(pid_file)},
                            "02_c": {"no_summary": True, "exit": 3}}, gc.STOP_S + 30)
    started = time.monotonic()
    facts = gc.step_other_notebooks(args)
    runs = facts["summary"]["notebooks"]
    assert [c["only"] for c in fake_runner.calls()] == ["00_a", "01_b", "02_c"] and time.monotonic() - started < 20
    assert runs["00_a"]["status"] == "PASS"
    assert runs["01_b"]["status"] == "TIMEOUT" and 1.4 < runs["01_b"]["seconds"] < 10
    assert runs["01_b"]["error"] == "stopped at its limit, 2 s"
    kernel = int(pid_file.read_text())
    assert not Path(f"/proc/{kernel}").exists() or gc._zombie(kernel)  # what it started was stopped too
    assert runs["02_c"]["status"] == "FAIL" and runs["02_c"]["error"].startswith("no summary.json (exit status 3")
    assert facts["status"] == "FAIL" and "1 FAIL, 1 TIMEOUT" in facts["detail"]


def test_08_gets_its_own_share_after_07_overruns_and_nothing_starts_without_time(gc, fake_runner, monkeypatch):
    monkeypatch.setattr(gc, "MIN_LIMIT_S", 0.5)
    args = fake_runner.use({"09_v": {"sleep_s": 60}, "10_d": {"seconds": 20.0}}, gc.STOP_S + 4.0)
    runs = gc.step_first_notebooks(args)["summary"]["notebooks"]
    assert runs["09_v"]["status"] == "TIMEOUT" and 1.9 < runs["09_v"]["seconds"] < 4  # half of the 4 s
    assert runs["10_d"]["status"] == "PASS"
    monkeypatch.setattr(gc, "MIN_LIMIT_S", 10.0)
    facts = gc.step_other_notebooks(fake_runner.use({}, gc.STOP_S + 5))
    assert {r["status"] for r in facts["summary"]["notebooks"].values()} == {"SKIP"}
    assert facts["summary"]["notebooks"]["00_a"]["error"] == "not run: 5 s of the step left"
    assert len(fake_runner.calls()) == 2  # 09 and 10 above; none of the skipped ones
    empty = fake_runner.use({})
    empty.notebooks = str(fake_runner.out)
    assert gc.step_first_notebooks(empty)["status"] == "SKIP"


def test_main_runs_the_steps_in_order_under_the_budget_and_merges_the_notebooks(gc, fake_runner, monkeypatch, capsys):
    monkeypatch.setattr(gc, "_machine", lambda: {"cpu_cores": 16, "gpu_count": 1, "nvidia_smi": "/x"})
    monkeypatch.setattr(gc, "placement_line", lambda: "CPU placement: (test)")
    monkeypatch.setattr(gc, "missing_packages", lambda names, *a: [])
    asked = []
    facts = {3: {"gloo_ratio_min": 0.97, "gloo_device": "cuda"}, 4: {"h2d_fraction": 0.88},
             5: {"summary": _summary({"09_v": 50.0, "10_d": 55.0}, {"09_v": {"t2_median_error_pct": 9.0},
                                                                    "10_d": {"ddp_between_estimates": "4/4"}})},
             6: {"summary": _summary({"00_a": 10.0, "01_b": 75.0}, {}, {"01_b": "TIMEOUT"})}}

    def fake_run_step(step, args, limit_s):
        asked.append((step.number, limit_s))
        return gc.StepRun(step, "PASS", 1.0, "ok", dict(facts.get(step.number, {})))

    monkeypatch.setattr(gc, "run_step", fake_run_step)
    nbs = fake_runner.use({}).notebooks
    assert gc.main(["--device", "cuda", "--out", str(fake_runner.out), "--notebooks", nbs]) == 1
    assert [n for n, _ in asked] == [1, 2, 3, 4, 5, 6]
    # each step may run until the running sum of the limits: the time the earlier ones left goes on
    for (number, limit), ends_by in zip(asked, [60, 100, 140, 170, 320, 475]):
        assert ends_by - 2 < limit <= ends_by, (number, limit)
    merged = json.loads((fake_runner.out / "notebooks" / "summary.json").read_text())
    assert list(merged["notebooks"]) == ["09_v", "10_d", "00_a", "01_b"]
    out = capsys.readouterr().out
    assert "FAIL         every notebook under 60 s: over: 01_b 75.0 s (TIMEOUT)" in out
    assert "PASS         median T2 error under 20%: 9.0% (09_v: t2_median_error_pct)" in out
    assert "PASS         DDP step between its two estimates for at least 3 of 4 sizes: 4/4 (10_d)" in out
    assert "FAIL         the notebooks' seconds add up to under 180 s (16 cores, 1 GPU): 190 s over 4" in out


# --- the targets, a pure function -----------------------------------------------------------------

def test_targets_pass_and_fail_from_fake_summaries(gc):
    good = {"h2d_fraction": 0.88, "gloo_ratio_min": 0.97, "gloo_device": "cuda",
            "summary": _summary({"09_validating_the_budget": 40.0, "10_data_parallel_training": 55.0},
                                {"09_validating_the_budget": {"t2_median_error_pct": 12.5},
                                 "10_data_parallel_training": {"ddp_between_estimates": "3/4"}})}
    targets = gc.evaluate_targets(good)
    assert [t.status for t in targets] == ["PASS"] * 6
    assert "10_data_parallel_training" in targets[3].detail and "12.5%" in targets[2].detail
    assert targets[0].detail.startswith("95 s over 2 notebook(s)")
    bad = {**good, "h2d_fraction": 0.5, "gloo_ratio_min": 0.9,
           "summary": _summary({"06_x": 61.0, "07_y": 120.0}, {"06_x": {"t2_median_error_pct": 25.0},
                                                               "07_y": {"ddp_between_estimates": "2/4"}})}
    targets = gc.evaluate_targets(bad)
    assert [t.status for t in targets] == ["FAIL"] * 6
    assert targets[1].detail == "over: 06_x 61.0 s, 07_y 120.0 s"


def test_targets_not_recorded_not_measured_skipped_notebooks_and_older_names(gc):
    plain = {"summary": _summary({"00_check": 3.0}, {})}
    statuses = [t.status for t in gc.evaluate_targets(plain)]
    assert statuses == ["PASS", "PASS", "NOT RECORDED", "NOT RECORDED", "NOT MEASURED", "NOT MEASURED"]
    older = {"summary": _summary({"06_v": 3.0}, {"06_v": {"tp_prediction_error": 14.0}})}
    t2 = gc.evaluate_targets(older)[2]
    assert t2.status == "PASS" and "tp_prediction_error" in t2.detail
    assert all(t.status == "NOT MEASURED" for t in gc.evaluate_targets({}))
    weird = {"summary": _summary({"08": 1.0}, {"08": {"ddp_between_estimates": "most"}})}
    assert gc.evaluate_targets(weird)[3].status == "FAIL"
    assert (gc.parse_fraction("3/4"), gc.parse_fraction("5/4"), gc.parse_fraction("x")) == ((3, 4), None, None)
    partly = {"summary": _summary({"07": 30.0, "00": 0.0}, {}, {"00": "SKIP"})}
    total, each = gc.evaluate_targets(partly)[:2]
    assert (total.status, each.status) == ("NOT MEASURED", "NOT MEASURED") and "not run: 00" in each.detail
    only_skipped = {"summary": _summary({"00": 0.0}, {}, {"00": "SKIP"})}
    assert [t.status for t in gc.evaluate_targets(only_skipped)[:4]] == ["NOT MEASURED"] * 4


def test_facts_of_steps_5_and_6_join_one_summary_and_notebook_lines(gc):
    facts = {"cpu_cores": 2}
    gc.merge_facts(facts, {"h2d_fraction": 0.9, "summary": _summary({"07": 1.0}, {})})
    gc.merge_facts(facts, {"summary": _summary({"00": 2.0}, {})})
    assert facts["h2d_fraction"] == 0.9 and list(facts["summary"]["notebooks"]) == ["07", "00"]
    line = gc.format_notebooks({"notebooks": {"09_v": {"status": "TIMEOUT", "seconds": 72.0, "figures": {},
                                                       "error": "stopped at its limit, 72 s"}}})
    assert line.split() == ["09_v", "TIMEOUT", "72.0", "s", "(stopped", "at", "its", "limit,", "72", "s)"]


# --- packages, limits and one real step ----------------------------------------------------------

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


def test_a_command_past_its_limit_is_stopped_with_what_it_started(gc, tmp_path):
    pid_file = tmp_path / "pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n")
    started = time.monotonic()
    rc, seconds = gc.run_command([sys.executable, "-c", code], timeout_s=1.0)
    assert rc is None and 0.9 < seconds < 15 and time.monotonic() - started < 15
    grandchild = int(pid_file.read_text())
    assert not Path(f"/proc/{grandchild}").exists() or gc._zombie(grandchild)


def test_step_4_on_the_cpu_in_a_process_of_its_own(gc, tmp_path):
    args = gc.parse_args(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    run = gc.run_step(gc.STEPS[4], args, 60)
    assert run.status == "PASS" and run.detail.startswith("host copy ") and run.detail.endswith(" GB/s"), run
    assert run.seconds < 60
