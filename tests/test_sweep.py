"""The sweep (labutils.measure.sweep) and `python -m labutils sweep`: exit codes, JSON rows, failures
named, Ctrl-C, torchrun on two "nodes", a saved sweep reused when it covers the sizes asked, and on a
CUDA GPU NCCL with one rank and gloo on CUDA tensors under the copy ceiling."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from labutils.cli import main
from labutils.measure import across_nodes as nodes
from labutils.measure import sweep as col
from labutils.measure.copies import copy_ceiling_GBps
from labutils.measure.launch import free_port
from labutils.measure.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = ROOT / ".venv" / "bin" / "torchrun"
KEYS = {"size_bytes", "count", "dtype", "op", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "world_size", "backend"}
SMALL = ["--min-bytes", "1K", "--max-bytes", "4K", "--budget-ms", "3", "--warmup", "1", "--no-progress"]
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _sweep(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "labutils", "sweep", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, needle", [
    (["--min-bytes", "lots"], "min_bytes"),
    (["--min-bytes", "8K", "--max-bytes", "1K"], "larger than max_bytes"),
    (["--backend", "nccl", "--nproc", "2"], "nproc=2 is larger than the 0 GPU"),
    (["--max-bytes", "512T"], "memory"),
    (["--nproc", "0"], "nproc"),
    (["--dtype", "complex64"], "dtype"),
    (["--factor", "1"], "factor"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    assert main(["sweep", "--backend", "gloo", *args] if "--backend" not in args else ["sweep", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and needle in err[-1]


@pytest.mark.distributed
def test_json_rows_and_auto_backend_explained(capsys):
    assert main(["sweep", "--json", *SMALL]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert len(rows) == 3 and all(KEYS <= set(r) for r in rows)
    assert {r["world_size"] for r in rows} == {2} and {r["backend"] for r in rows} == {"gloo"}
    assert [r["size_bytes"] for r in rows] == [1024, 2048, 4096] and all(r["wrong"] == 0 for r in rows)
    assert "backend: gloo on cpu (no CUDA GPU visible" in err
    assert "saved:" in err


@pytest.mark.distributed
def test_a_dead_rank_is_named(capsys, plant_fault):
    plant_fault("crash", rank=1)
    assert main(["sweep", "--no-save", *SMALL]) == 1
    assert "error: rank 1 died" in capsys.readouterr().err


@pytest.mark.distributed
def test_wrong_elements_fail_loudly_from_the_command_line(capsys, plant_fault):
    plant_fault("corrupt", rank=1)
    assert main(["sweep", "--no-save", *SMALL]) == 1
    out, err = capsys.readouterr()
    assert "wrong element" in err and "Out of bounds values : 3 FAILED" in out


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.distributed
def test_ctrl_c_leaves_no_process_behind(tmp_path):
    # Output goes to files, not pipes: a process left behind holding a pipe would make the wait below
    # hang instead of failing on it. The sweep is long (64M at 5 s a size) so that Ctrl-C lands in it.
    out, err = (open(tmp_path / name, "w+") for name in ("out.txt", "err.txt"))
    proc = subprocess.Popen([sys.executable, "-m", "labutils", "sweep", "--no-save", "--no-progress",
                             "--max-bytes", "64M", "--budget-ms", "5000"], cwd=ROOT, stdout=out, stderr=err,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a terminal's
    try:
        deadline = time.monotonic() + 90
        kids: set[int] = set()
        while time.monotonic() < deadline and not (len(kids) >= 2 and "backend:" in (tmp_path / "err.txt").read_text()):
            time.sleep(0.2)
            kids |= _descendants(proc.pid)
        assert len(kids) >= 2, "the ranks never started"
        time.sleep(1.0)  # let them reach the timed loop
        kids |= _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close(), err.close()
    said = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 130, said
    time.sleep(1.0)
    assert not [k for k in kids if _alive(k)], said


@pytest.mark.distributed
def test_torchrun_two_nodes_on_loopback():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    nodes = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(i),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "labutils", "sweep",
                               "--json", "--no-save", *SMALL], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [n.communicate(timeout=120) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    rows = json.loads(outs[0][0])
    assert len(rows) == 3 and {r["world_size"] for r in rows} == {2} and all(r["wrong"] == 0 for r in rows)
    assert outs[1][0].strip() == ""  # only rank 0 prints


def test_a_saved_sweep_that_covers_the_range_is_reused(monkeypatch, synthetic_sweep):
    def fake_run_sweep(**kw):
        calls.append(kw)
        frame = synthetic_sweep()
        return col.SweepResult(frame, {"world_size": 2, "backend": "gloo", "device": "cpu"})

    calls = []
    monkeypatch.setattr(col, "run_sweep", fake_run_sweep)
    first = col.ensure_sweep(3 << 20, 40 << 20, 2, "gloo", "cpu")  # nothing saved yet: measured now
    assert len(calls) == 1 and calls[0]["min_bytes"] == 2 << 20 and calls[0]["max_bytes"] == 64 << 20
    again = col.ensure_sweep(3 << 20, 40 << 20, 2, "gloo", "cpu")  # saved, and it covers: reused
    assert len(calls) == 1 and len(again.frame) == len(first.frame)
    assert col.load_sweep("all_reduce", 2, "gloo", "cuda") is None  # another device is another link
    assert col.covers(first.frame, 2048, 2**27) and not col.covers(first.frame, 2048, 2**29)
    col.ensure_sweep(1 << 20, 1 << 29, 2, "gloo", "cpu")  # beyond what was saved: measured again
    assert len(calls) == 2


# --- on a CUDA GPU only (skipped here; benchmarks/gpu_check.py runs them: pytest -m cuda) -------------

@NEEDS_GPU
def test_gpu_nccl_with_one_rank_runs_a_sweep_with_its_barrier():
    result = run_sweep(nproc=1, backend="nccl", device="cuda", min_bytes="1K", max_bytes="64K", budget_ms=5,
                       progress=False)
    assert result.wrong == 0 and (result.frame["time_us"] > 0).all() and result.meta["backend"] == "nccl"


@NEEDS_GPU
def test_gpu_gloo_on_cuda_sweep_and_the_copy_ceiling():
    result = run_sweep(nproc=2, backend="gloo", device="cuda", min_bytes="1K", max_bytes="1M", budget_ms=10,
                       progress=False)
    ceiling = copy_ceiling_GBps(0, 16 << 20, iters=3)
    assert result.wrong == 0 and result.meta["device"] == "cuda"
    assert 0 < result.peak_busbw_GBps < ceiling  # through host memory: never above the pinned copy


@pytest.mark.parametrize("first, second, words", [
    (23.0, 10.0, "NCCL reached 2.30x the busbw of gloo (23 against 10 GB/s)"),
    (1.0, 4.0, "NCCL reached 0.25x the busbw of gloo (1 against 4 GB/s)"),
    (5.0, 5.0, "NCCL and gloo reached the same busbw (5 against 5 GB/s)"),
    (5.001, 5.0, "NCCL and gloo reached the same busbw"),  # a ratio that prints as 1.00 is a tie
])
def test_compare_sentence_follows_the_numbers(first, second, words):
    assert words in col.compare_sentence("NCCL", first, "gloo", second)


def test_compare_sentence_says_where():
    assert col.compare_sentence("a", 2.0, "b", 1.0, at="at 64 MiB").startswith("at 64 MiB, a reached 2.00x")


@pytest.mark.parametrize("peak, ceiling, words", [
    (1.0, 4.0, "the sweep reached 25% of that ceiling"),
    (4.0, 4.0, "the sweep reached the ceiling"),
    (3.999, 4.0, "the sweep reached the ceiling"),  # prints as 100%
    (6.0, 4.0, "the sweep ran 150% of it, above a ceiling that was measured low"),
])
def test_ceiling_sentence_follows_the_numbers(peak, ceiling, words):
    reply = col.ceiling_sentence("gloo on CUDA", peak, ceiling)
    assert reply.startswith("gloo on CUDA peaks at") and words in reply, reply


# --- a sweep across nodes, read back (notebooks 02 and 05) ---------------------------------------------------

SAMPLES = ROOT / "data" / "nccl_tests"


def test_a_sweep_across_nodes_is_set_against_one_node_and_the_network():
    c = nodes.across_nodes(SAMPLES / "sample_lab_sweep_2nodes_8xH100_ndr.json")
    assert (c.ranks, c.nodes, c.hosts, c.intra_ranks) == (16, 2, ("gpu-a01", "gpu-a02"), 8)
    assert c.intra_label == "the same job's one-node sweep" and c.network.name == "InfiniBand NDR"
    assert 40 < c.across_GBps < 50 < 300 < c.intra_GBps
    report = nodes.across_nodes_report(SAMPLES / "sample_lab_sweep_2nodes_8xH100_ndr.json", gradient_bytes=200e6)
    assert report.startswith("SAMPLE:")
    assert f"reached {c.across_GBps / c.intra_GBps:.2f}x the busbw of one node alone" in report
    assert f"reached {c.across_GBps / 50:.0%} of its 50 GB/s" in report
    far = 2 * 15 / 16 * 200e6 / (c.across_GBps * 1e6)
    assert f"{far:.1f} ms at the busbw across nodes" in report
    assert nodes.across_nodes_report("").startswith("no multinode_result given")


def test_the_network_row_carries_the_busbw_unless_the_result_names_it():
    assert nodes.network_row(1.0).name == "Ethernet 10 GbE" and nodes.network_row(11.0).high_GBps == 12.5
    assert nodes.network_row(20.0).name == "InfiniBand HDR" and nodes.network_row(500.0).high_GBps == 50.0
    assert nodes.network_row(1.0, named="InfiniBand NDR").name == "InfiniBand NDR"


def test_without_its_one_node_sweep_this_machine_stands_in(tmp_path, synthetic_sweep):
    for suffix in (".json", ".csv"):
        (tmp_path / f"across{suffix}").write_text((SAMPLES / f"sample_lab_sweep_2nodes_8xH100_ndr{suffix}")
                                                  .read_text().replace("sample_lab_sweep_2nodes_8xH100_ndr", "across"))
    frame = synthetic_sweep()
    frame["busbw_GBps"] = frame.size_bytes / frame.time_us / 1e3  # N = 2: busbw = algbw
    mine = col.SweepResult(frame, {"world_size": 2})
    c = nodes.across_nodes(tmp_path / "across.json", intra=mine)
    assert c.intra_label == "this machine's sweep" and c.intra_GBps == mine.peak_busbw_GBps
    with pytest.raises(col.LabInputError, match="no one-node sweep of its job beside it"):
        nodes.across_nodes(tmp_path / "across.json")


@pytest.mark.parametrize("name, needle", [("nothing.json", "is not a file"), ("", "is not a file"),
                                          ("sample_all_reduce_2x5090_sys.json", "holds no all_reduce sweep"),
                                          ("sample_lab_sweep_1node_8xH100.json", "ran on one node")])
def test_a_file_that_is_no_sweep_across_nodes_is_one_line(name, needle):
    with pytest.raises(col.LabInputError, match=needle):
        nodes.across_nodes(SAMPLES / name if name else SAMPLES)
