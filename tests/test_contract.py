"""The bad-input contract of every subcommand, tried as a hostile user would: one line naming the
parameter as the last line of stderr, exit status 2, no traceback, no process started, no file
written. In-process through `labutils.cli.main` (fast); a few real subprocess runs at the end."""

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labutils.cli import main

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_LOG = str(ROOT / "data" / "nccl_tests" / "sample_all_reduce_2x5090_sys.log")
TOPO = (ROOT / "data" / "topologies" / "two_gpu_sys.txt").read_text()


@pytest.fixture
def files(tmp_path):
    """Malformed inputs on disk: JSON reports of the wrong shape, corrupt topologies, a folder."""
    made = {"dir": tmp_path / "folder", "file": tmp_path / "a_file.txt"}
    made["dir"].mkdir()
    made["file"].write_text("not a folder\n")
    reports = {"json_results_str": {"results": "x"}, "json_no_results": {"args": []},
               "json_size_str": {"results": [{"size": "big", "count": 1, "type": "float"}]},
               "json_size_missing": {"results": [{"count": 1, "type": "float"}]},
               "json_record_list": {"results": [[1, 2]]},
               "json_half_str": {"results": [{"size": 8, "count": 2, "type": "float", "out_of_place": "fast"}]},
               "json_devices_str": {"config": {"devices": "two"}, "results": []}}
    for name, doc in reports.items():
        made[name] = tmp_path / f"{name}.json"
        made[name].write_text(json.dumps(doc))
    made["json_cut"] = tmp_path / "cut.json"
    made["json_cut"].write_text('{"results": [{"size": 8,')
    row = ("     1048576        262144     float     sum      -1    66.87   15.68   15.68      0"
           "    67.84   15.46   15.46      0")
    head = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw #wrong\n")
    for name, bad in {"neg_size": ("1048576", "-1048576"),
                      "neg_busbw": ("15.68   15.68      0    67", "15.68  -15.68      0    67"),
                      "neg_wrong": ("15.68      0    67", "15.68     -3    67"), "inf_time": ("66.87", "1e999"),
                      "frac_size": ("1048576 ", "1048.5 ")}.items():
        made[name] = tmp_path / f"{name}.log"
        made[name].write_text("# all_reduce_perf\n" + head + row.replace(*bad, 1) + "\n")
    made["disagree"] = tmp_path / "disagree.log"
    made["disagree"].write_text("$ ./build/all_reduce_perf -b 8 -e 8 -g 8\n# nThread 1 nGpus 8\n" + head
                                + row + "\n")  # busbw/algbw = 1 says N = 2, the header 8
    made["empty_log"] = tmp_path / "empty.log"
    made["empty_log"].write_text("")
    for name, code in {"nv_huge": "NV99999999999999999999", "nv0": "NV0", "bad_code": "QPI"}.items():
        made[name] = tmp_path / f"{name}.txt"
        made[name].write_text(TOPO.replace("SYS", code))
    made["empty_nb"] = tmp_path / "no_notebooks"
    made["empty_nb"].mkdir()
    return {k: str(v) for k, v in made.items()}


def _fail(*args, **kwargs):
    raise AssertionError("bad input started a process or wrote a file")


@pytest.fixture
def nothing_starts(block_starts):
    """Every way of starting a rank, a process or writing a result fails the test."""
    return block_starts(_fail)


S = ["sweep", "--backend", "gloo", "--device", "cpu", "--no-progress"]
P = ["parse-nccl-tests"]
T = ["tp-check", "--backend", "gloo", "--device", "cpu"]
B = ["budget"]
R = ["run-notebooks"]

# (argv, the word the last stderr line must hold); {name} is a path from `files`.
CASES = [
    # argparse's own refusals, in every subcommand
    (["no-such-command"], "invalid choice"),
    (["check", "--bogus"], "--bogus"),
    (["check", "--json", "extra"], "extra"),
    (["topo", "--pcie-gen", "6"], "--pcie-gen"),
    (["topo", "--pcie-gen", "x"], "--pcie-gen"),
    ([*S, "--nproc", "two"], "--nproc"),
    ([*S, "--nproc", "1e3"], "--nproc"),
    ([*S, "--op", "all_to_all"], "--op"),
    ([*S, "--budget-ms", "fast"], "--budget-ms"),
    ([*S, "--factor", "2.5"], "--factor"),
    ([*S, "--bogus"], "--bogus"),
    ([*S, "--json", "--csv"], "--csv"),
    (["sweep", "--backend", "mpi"], "--backend"),
    (["sweep", "--device", "tpu"], "--device"),
    ([*P], "log"),
    ([*P, SAMPLE_LOG, "--op", "all_to_all"], "--op"),
    ([*P, SAMPLE_LOG, "--nranks", "two"], "--nranks"),
    ([*T, "--nproc", "x"], "--nproc"),
    ([*T, "--hidden", "1.5"], "--hidden"),
    ([*T, "--seed", "-"], "--seed"),
    ([*R, "--bogus"], "--bogus"),
    (["nccl-transports"], "log"),
    (["doctor", "--bogus"], "--bogus"),
    (["lab", "--bogus"], "--bogus"),
    # sweep
    ([*S, "--nproc", "0"], "nproc"),
    ([*S, "--nproc", "-3"], "nproc"),
    ([*S, "--nproc", "1000", "--max-bytes", "4K"], "nproc=1000"),
    ([*S, "--nproc", "100000", "--oversubscribe"], "nproc=100000"),
    ([*S, "--min-bytes", "lots"], "min_bytes"),
    ([*S, "--min-bytes=-1K"], "min_bytes"),
    ([*S, "--min-bytes", "0"], "min_bytes"),
    ([*S, "--min-bytes", "1.5"], "min_bytes"),
    ([*S, "--min-bytes", "64Mb"], "min_bytes"),
    ([*S, "--max-bytes", "1 kb"], "max_bytes"),
    ([*S, "--max-bytes", ""], "max_bytes"),
    ([*S, "--min-bytes", "8K", "--max-bytes", "1K"], "max_bytes"),
    ([*S, "--min-bytes", "1", "--max-bytes", "3"], "min_bytes=1"),
    ([*S, "--op", "all_gather", "--min-bytes", "4", "--max-bytes", "4"], "min_bytes=4"),
    ([*S, "--max-bytes", "512T"], "max_bytes"),
    ([*S, "--max-bytes", "99999999999999999999999"], "max_bytes"),
    ([*S, "--factor", "1"], "factor"),
    ([*S, "--factor", "0"], "factor"),
    ([*S, "--dtype", "complex64"], "dtype"),
    ([*S, "--dtype", ""], "dtype"),
    ([*S, "--warmup", "-1"], "warmup"),
    ([*S, "--warmup", "100000000"], "warmup"),
    ([*S, "--budget-ms", "0"], "budget_ms"),
    ([*S, "--budget-ms", "-5"], "budget_ms"),
    ([*S, "--budget-ms", "inf"], "budget_ms"),
    ([*S, "--budget-ms", "nan"], "budget_ms"),
    ([*S, "--timeout", "inf"], "timeout_s"),
    ([*S, "--timeout", "0"], "timeout_s"),
    ([*S, "--timeout", "nan"], "timeout_s"),
    (["sweep", "--backend", "nccl", "--nproc", "2"], "nproc"),
    # parse-nccl-tests
    ([*P, ""], "log=''"),
    ([*P, "{dir}"], "folder"),
    ([*P, "/no/such/log.txt"], "does not exist"),
    ([*P, "/dev/null"], "regular file"),
    ([*P, "{empty_log}"], "no nccl-tests result rows"),
    ([*P, "{json_results_str}"], "results"),
    ([*P, "{json_no_results}"], "results"),
    ([*P, "{json_size_str}"], "size"),
    ([*P, "{json_size_missing}"], "size"),
    ([*P, "{json_record_list}"], "result record"),
    ([*P, "{json_half_str}"], "out_of_place"),
    ([*P, "{json_devices_str}"], "devices"),
    ([*P, "{json_cut}"], "JSON report does not parse"),
    ([*P, "{neg_size}"], "size="),
    ([*P, "{neg_busbw}"], "busbw="),
    ([*P, "{neg_wrong}"], "#wrong="),
    ([*P, "{inf_time}"], "time="),
    ([*P, "{frac_size}"], "row"),
    ([*P, "{disagree}"], "world size"),
    ([*P, SAMPLE_LOG, "--nranks", "4"], "--nranks says 4"),
    ([*P, SAMPLE_LOG, "--nranks", "0"], "nranks"),
    # topo
    (["topo", "--file", ""], "file=''"),
    (["topo", "--file", "{dir}"], "folder"),
    (["topo", "--file", "/dev/null"], "regular file"),
    (["topo", "--file", "no_such_sample"], "does not exist"),
    (["topo", "--file", "{nv_huge}"], "NV1 to NV64"),
    (["topo", "--file", "{nv0}"], "line"),
    (["topo", "--file", "{bad_code}"], "QPI"),
    (["topo", "--file", "{file}"], "GPU0"),
    # budget
    ([*B, "--eta", "0"], "eta"),
    ([*B, "--eta", "1.5"], "eta"),
    ([*B, "--eta", "nan"], "eta"),
    ([*B, "--eta", "fast"], "eta"),
    ([*B, "--C-ms", "-1"], "C_ms"),
    ([*B, "--C-ms", "inf"], "C_ms"),
    ([*B, "--Q", "-2"], "Q"),
    ([*B, "--bandwidth-GBps", "0"], "bandwidth_GBps"),
    ([*B, "--volume-bytes", "-1"], "volume_bytes"),
    ([*B, "--latency-ms", "nan"], "latency_ms"),
    ([*B, "--N", "1"], "N="),
    ([*B, "--N", "2.5"], "N="),
    ([*B, "--wire-dtype", "fp8"], "wire_dtype"),
    ([*B, "--Q", "1.5"], "Q=1.5"),
    # tp-check
    ([*T, "--nproc", "0"], "nproc"),
    ([*T, "--nproc", "256"], "nproc=256"),
    ([*T, "--dtypes", ""], "dtypes"),
    ([*T, "--dtypes", ","], "dtypes"),
    ([*T, "--dtypes", "float32,complex64"], "dtypes"),
    ([*T, "--hidden", "0"], "hidden"),
    ([*T, "--hidden", "1000000"], "hidden="),
    ([*T, "--batch", "100000000", "--hidden", "4096"], "batch="),
    ([*T, "--batch", "-1"], "batch"),
    ([*T, "--seed", str(2**64)], "seed"),
    ([*T, "--seed", "-1"], "seed"),
    ([*T, "--timeout-s", "inf"], "timeout_s"),
    ([*T, "--timeout-s", "0"], "timeout_s"),
    ([*T, "--timeout-s", "1e-6"], "timeout_s=1e-06"),
    (["tp-check", "--backend", "nccl", "--nproc", "2"], "nproc"),
    # run-notebooks
    ([*R, "--only", ""], "--only"),
    ([*R, "--only", ","], "--only"),
    ([*R, "--only", "99"], "--only"),
    ([*R, "--out", ""], "--out"),
    ([*R, "--out", "{file}"], "--out"),
    ([*R, "--out", "/proc/lab-out"], "--out='/proc/lab-out' cannot be made"),
    ([*R, "--notebooks", "{empty_nb}"], "--notebooks"),
    ([*R, "--notebooks", "{file}"], "--notebooks"),
    ([*R, "--only", "02", "--param", "no_such=1"], "no_such"),
    ([*R, "--only", "02", "--param", "nproc=1000"], "nproc"),
    ([*R, "--only", "02", "--param", "quick=maybe"], "quick"),
    ([*R, "--only", "02", "--param", "nproc=two"], "nproc"),
    ([*R, "--param", "=3"], "--param"),
    ([*R, "--param", "novalue"], "--param"),
    # nccl-transports, doctor, lab
    (["nccl-transports", "/no/such/log"], "does not exist"),
    (["nccl-transports", "{dir}"], "directory"),
    (["doctor", "--busbw", "fast"], "busbw"),
    (["doctor", "--busbw", "-3"], "busbw"),
    (["doctor", "--nccl-tests", "/no/such/log"], "nccl_tests"),
    # the SLURM batch script
    (["slurm-script", "--nodes", "0", "--gpus-per-node", "4"], "nodes=0"),
    (["slurm-script", "--nodes", "2", "--gpus-per-node", "4", "--time", "soon"], "time="),
    (["slurm-script", "--nodes", "2", "--gpus-per-node", "4", "--max-bytes", "1T"], "max_bytes"),
    (["doctor", "--topo", "no_such_sample"], "does not exist"),
    (["lab", "--port", "http"], "port"),
    (["lab", "--port", "70000"], "port"),
]


def test_the_table_is_large_and_covers_every_subcommand():
    from labutils.cli import build_parser

    assert len(CASES) >= 80
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert commands <= {argv[0] for argv, _ in CASES}


@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(a).replace(str(ROOT), "")[:60] for a, _ in CASES])
def test_bad_input_is_one_line_naming_it_exit_2_nothing_started(argv, needle, files, nothing_starts, capsys):
    argv = [a.format(**files) if "{" in a else str(a) for a in argv]
    before = sorted(p.name for p in nothing_starts.iterdir())
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert lines, "nothing on stderr"
    assert "Traceback" not in err and "Traceback" not in out
    assert lines[-1].startswith("error:") and needle in lines[-1], lines
    assert [ln for ln in lines if ln.startswith("error:")] == [lines[-1]]  # one error line, no backend line first
    assert not any(ln.startswith("backend:") for ln in lines)
    assert sorted(p.name for p in nothing_starts.iterdir()) == before
    assert not (nothing_starts / "results").exists() or not any((nothing_starts / "results").iterdir())
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "--backend", "gloo", "--nproc", "1000", "--max-bytes", "4K"], "nproc=1000"),
    (["parse-nccl-tests", ""], "log=''"),
    (["budget", "--eta", "nan"], "eta"),
    (["sweep", "--nproc", "nine"], "--nproc"),
])
def test_real_runs_hold_the_contract(argv, needle, tmp_path):
    env = {**os.environ, "LAB_RESULTS_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "labutils", *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and needle in last
    assert not any(tmp_path.iterdir())


def test_malformed_torchrun_variables_are_one_line(nothing_starts, monkeypatch, capsys):
    for bad in ({"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "5", "WORLD_SIZE": "2"},
                {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "-1"}):
        for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", **bad}.items():
            monkeypatch.setenv(k, v)
        assert main(S) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("error:") and any(k in last for k in bad)
        for k in bad:
            monkeypatch.delenv(k)
