"""Result files: atomic, never overwritten, readable back; figures for the instructor."""

import json
import os

import pandas as pd
import pytest

from labutils.core import results
from labutils.core.busbw import GBps, format_size, parse_size
from labutils.core.inputs import LabInputError, check_int, check_range


def test_save_never_overwrites_and_round_trips(tmp_path):
    frame = pd.DataFrame({"size_bytes": [1024, 2048], "busbw_GBps": [0.5, 1.0]})
    paths = [results.save_result("sweep", frame, {"world_size": 2}, tmp_path) for _ in range(3)]
    assert len(set(paths)) == 3
    assert len(list(tmp_path.glob("*.csv"))) == 3
    record, back = results.load_result(paths[1])
    assert record["kind"] == "sweep" and record["meta"] == {"world_size": 2}
    pd.testing.assert_frame_equal(back, frame)
    assert results.list_results("sweep", tmp_path) == paths
    assert results.list_results("link", tmp_path) == []
    assert results.latest_result("link", tmp_path) is None


def test_reserve_path_skips_any_taken_suffix_and_claims_the_first(tmp_path):
    first = results.reserve_path(tmp_path, "trace-host-1", (".json", ".csv"))
    assert first == tmp_path / "trace-host-1" and (tmp_path / "trace-host-1.json").read_text() == ""
    (tmp_path / "trace-host-1-1.csv").write_text("taken")
    assert results.reserve_path(tmp_path, "trace-host-1", (".json", ".csv")) == tmp_path / "trace-host-1-2"


def test_write_atomic_keeps_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "x.json"
    results.write_atomic(target, "old")


    with pytest.raises(TypeError):
        results.write_atomic(target, 123)  # not text: the write fails
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_json_writes_nan_and_inf_as_null():
    assert json.loads(results.to_json({"a": float("inf"), "b": [float("nan"), 1.5]})) == {"a": None, "b": [None, 1.5]}


def test_record_figure_only_under_the_runner(tmp_path, monkeypatch):
    results.record_figure("x", 1.0)  # no file set: nothing happens
    target = tmp_path / "fig.json"
    monkeypatch.setenv("LAB_FIGURES_FILE", str(target))
    results.record_figure("peak_busbw_GBps", 21.5, "GB/s", "peak busbw")
    results.record_figure("alpha_us", 30)
    saved = json.loads(target.read_text())
    assert saved["peak_busbw_GBps"] == {"value": 21.5, "unit": "GB/s", "label": "peak busbw"}
    assert saved["alpha_us"]["value"] == 30


@pytest.mark.parametrize("text, expected", [("1K", 1024), ("64M", 64 * 2**20), ("1G", 2**30), ("4096", 4096),
                                            ("1.5K", 1536), ("8 MiB", 8 * 2**20), (512, 512)])
def test_parse_size_is_1024_based(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "ten", "1X", "-1K", "0.3"])
def test_parse_size_names_the_bad_value(bad):
    with pytest.raises(LabInputError, match="min_bytes"):
        parse_size(bad, name="min_bytes")


def test_format_size_and_decimal_GBps():
    assert [format_size(v) for v in (512, 1024, 1536, 64 * 2**20, 2**30)] == ["512B", "1K", "1.5K", "64M", "1G"]
    assert GBps(22e9, 1.0) == 22.0  # decimal GB/s, as nccl-tests


def test_validation_messages_name_parameter_value_and_range():
    with pytest.raises(LabInputError, match=r"eta=1.5 is outside the allowed range \(0, 1\]"):
        check_range("eta", 1.5, low=0, high=1, low_open=True)
    with pytest.raises(LabInputError, match="bandwidth_GBps=nan"):
        check_range("bandwidth_GBps", float("nan"), low=0, low_open=True)
    with pytest.raises(LabInputError, match=r"Q=-1 is outside the allowed range \[0, inf\]"):
        check_int("Q", -1, low=0)


def test_result_files_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert os.stat(results.write_atomic(tmp_path / "summary.json", "{}")).st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert os.stat(results.write_atomic(tmp_path / "index.html", "")).st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
