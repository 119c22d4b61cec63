"""`python -m labutils budget`: the table, --json, "never" as null, exit status 2 on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labutils.cli import main
from labutils.model import budget as bm

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"t_one_ms", "t_two_ms", "comm_ms", "speedup", "efficiency", "break_even_C_ms", "min_bandwidth_GBps",
        "min_eta", "ideal_overlap_ms", "notes"}


def _json(capsys, *argv):
    assert main(["budget", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_table_is_the_base_case(capsys):
    assert main(["budget"]) == 0
    out = capsys.readouterr().out
    for text in ("12.8 ms", "9.22 ms", "0.92 ms", "1.38829", "0.694143", "2.45333 ms", "1.82648 GB/s",
                 "0.541516", "8.3 ms", "Splitting pays", "not a measurement"):
        assert text in out, text


def test_json_has_every_key_with_the_model_values(capsys):
    data = _json(capsys)
    assert set(data) == KEYS
    expected = bm.evaluate(**bm.BASE_CASE).as_dict()
    for key in KEYS - {"notes"}:
        assert data[key] == pytest.approx(expected[key]), key
    assert data["notes"] == {}


def test_options_change_the_inputs(capsys):
    data = _json(capsys, "--S-ms", "100", "--bandwidth-GBps", "10")
    assert data["t_one_ms"] == pytest.approx(112) and data["t_two_ms"] == pytest.approx(108.42)
    data = _json(capsys, "--C-ms", "1", "--eta", "0.8", "--Q", "4", "--latency-ms", "0.03",
                 "--volume-bytes", "2000000")
    assert data["t_two_ms"] == pytest.approx(2.345) and data["min_eta"] == pytest.approx(6.25)
    assert "impossible" in data["notes"]["min_eta"]


def test_never_is_null_with_its_reason(capsys):
    data = _json(capsys, "--eta", "0.5")
    assert data["break_even_C_ms"] is None and data["min_bandwidth_GBps"] is None
    assert data["notes"]["break_even_C_ms"].startswith("never")
    data = _json(capsys, "--C-ms", "0.5")
    assert data["min_eta"] is None and "H = 0.92 ms" in data["notes"]["min_eta"]
    assert main(["budget", "--eta", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "never" in out and "note (break_even_C_ms)" in out


@pytest.mark.parametrize("argv,name", [
    (["--S-ms", "-1"], "S_ms"), (["--C-ms", "nan"], "C_ms"), (["--eta", "0"], "eta"), (["--eta", "1.5"], "eta"),
    (["--bandwidth-GBps", "0"], "bandwidth_GBps"), (["--Q", "-2"], "Q"), (["--volume-bytes", "-5"], "volume_bytes"),
    (["--latency-ms", "abc"], "latency_ms"),
])
def test_bad_input_exits_2_with_one_line_naming_the_parameter(capsys, argv, name):
    assert main(["budget", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and captured.out == ""


def test_as_a_program():
    run = subprocess.run([sys.executable, "-m", "labutils", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and "budget" in run.stdout
    run = subprocess.run([sys.executable, "-m", "labutils", "budget", "--json", "--bandwidth-GBps", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and json.loads(run.stdout)["t_two_ms"] == pytest.approx(16.42)
    run = subprocess.run([sys.executable, "-m", "labutils", "budget", "--eta", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "eta" in run.stderr


def test_cli_N_and_wire_dtype(capsys):
    data = _json(capsys, "--N", "4", "--wire-dtype", "bf16")
    expected = bm.evaluate(**bm.BASE_CASE, n_devices=4, wire_dtype="bf16")
    assert data["t_two_ms"] == pytest.approx(expected.t_two_ms) and data["comm_ms"] == pytest.approx(0.96)
    assert main(["budget", "--N", "8"]) == 0
    out = capsys.readouterr().out
    assert "N = 8 devices" in out and "8 devices, T_N" in out and "not 8x" in out
    assert main(["budget", "--N", "2", "--wire-dtype", "fp32"]) == 0
    assert "Two-device time budget" in capsys.readouterr().out


@pytest.mark.parametrize("argv,name", [(["--N", "1"], "--N"), (["--N", "2.5"], "--N"), (["--N", "many"], "--N"),
                                       (["--wire-dtype", "int8"], "--wire-dtype"),
                                       (["--N", "4", "--eta", "0"], "--eta")])
def test_cli_bad_N_or_dtype_exits_2_with_one_line(capsys, argv, name):
    assert main(["budget", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and captured.out == ""
