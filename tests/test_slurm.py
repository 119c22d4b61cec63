"""SLURM (labutils.measure.slurm): hostlists and per-node task counts expanded, a task's rank read
from srun's variables and refused when they disagree, the rendezvous found without MASTER_*, real
gloo sweeps started as srun starts them (2 tasks; 2 "nodes" x 2 tasks, all on loopback), and the
batch script checked by `bash -n` and by its #SBATCH lines. No real cluster runs here."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labutils.cli import main
from labutils.core.inputs import LabInputError
from labutils.measure import slurm
from labutils.measure.launch import free_port
from labutils.measure.sweep import job_env

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--min-bytes", "1K", "--max-bytes", "4K", "--budget-ms", "3", "--warmup", "1", "--no-progress"]
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a-[1-2],b3", ["a-1", "a-2", "b3"]),
    ("gpu17", ["gpu17"]),
    ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("x[098-100],y[1,3]", ["x098", "x099", "x100", "y1", "y3"]),
])
def test_hostlists_expand_as_scontrol_does(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-", "node[4-2]", "node[a-b]", "a,,b", "n[1-99999999]", "n]1["])
def test_a_hostlist_slurm_would_not_write_is_one_line(text):
    with pytest.raises(LabInputError, match="SLURM_JOB_NODELIST="):
        slurm.expand_hostlist(text)


def test_scontrol_answers_when_it_exists(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho head-7; echo head-8\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm.slurm_hosts("head-[7-8]") == ["head-7", "head-8"]
    fake.write_text("#!/bin/sh\nexit 1\n")  # scontrol that fails: the lab's own expansion
    assert slurm.slurm_hosts("c[1-2]") == ["c1", "c2"]


@pytest.mark.parametrize("text, counts", [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("8(x2)", [8, 8]),
                                          ("1,2(x2)", [1, 2, 2])])
def test_tasks_per_node(text, counts):
    assert slurm.tasks_per_node(text) == counts


def _slurm(monkeypatch, **values):
    for name in TORCHRUN_VARS + ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
                                 "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    base = {"SLURM_PROCID": 5, "SLURM_NTASKS": 8, "SLURM_LOCALID": 1, "SLURM_NODEID": 1, "SLURM_JOB_ID": 123456,
            "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    for name, value in {**base, **values}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))


def test_an_srun_task_is_its_rank_and_finds_the_rendezvous(monkeypatch):
    _slurm(monkeypatch)
    env = job_env()
    assert (env["rank"], env["world_size"], env["local_rank"], env["local_world_size"]) == (5, 8, 1, 4)
    assert (env["node_rank"], env["nodes"], env["launcher"]) == (1, 2, "srun")
    assert env["master_addr"] == "gpu03" and env["master_port"] == 10_000 + 123456 % 20_000 == 13456
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")  # the environment's own rendezvous wins
    monkeypatch.setenv("MASTER_PORT", "29400")
    assert (job_env()["master_addr"], job_env()["master_port"]) == ("10.1.2.3", 29400)


def test_torchrun_under_srun_and_a_job_of_one_task_are_not_srun_ranks(monkeypatch):
    _slurm(monkeypatch, RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500)
    assert job_env()["launcher"] == "torchrun"  # torchrun's variables describe the ranks
    _slurm(monkeypatch, SLURM_NTASKS=1, SLURM_PROCID=0, SLURM_LOCALID=0)
    assert job_env() is None  # one task (a notebook kernel in a job): it spawns its own local ranks


@pytest.mark.parametrize("values, needle", [
    ({"SLURM_PROCID": 8}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
    ({"SLURM_LOCALID": 4}, "SLURM_LOCALID=4 is not below the 4 task(s) per node"),
    ({"SLURM_LOCALID": 2, "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": 0}, "SLURM_LOCALID=2"),
    ({"SLURM_LOCALID": 1, "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": 3}, "per node of SLURM_TASKS_PER_NODE"),
    ({"SLURM_LOCALID": 2, "SLURM_NTASKS_PER_NODE": 2}, "SLURM_NTASKS_PER_NODE"),
    ({"SLURM_NODEID": 2}, "SLURM_NODEID=2 is beyond the 2 node(s)"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not a whole number"),
    ({"SLURM_NTASKS": "-2"}, "SLURM_NTASKS='-2'"),
    ({"SLURM_TASKS_PER_NODE": "4(y2)"}, "SLURM_TASKS_PER_NODE='4(y2)'"),
    ({"SLURM_JOB_NODELIST": "gpu[03-"}, "SLURM_JOB_NODELIST="),
    ({"SLURM_JOB_NODELIST": None}, "MASTER_ADDR is unset and so is SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_ID": None}, "MASTER_PORT is unset and so is SLURM_JOB_ID"),
    ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a whole number"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is outside the allowed range [1, 65535]"),
])
def test_inconsistent_slurm_variables_are_refused_in_one_line(monkeypatch, capsys, values, needle):
    _slurm(monkeypatch, **values)
    with pytest.raises(LabInputError) as info:
        job_env()
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert main(["sweep", "--backend", "gloo", "--no-save", *SMALL]) == 2  # the CLI: one line, exit 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error:") and needle in last


def _srun(tasks: list[dict], port: int, timeout=180):
    """Start `python -m labutils sweep --json` once per task, each with srun's variables `tasks[i]`
    (and no torchrun variables); their (returncode, stdout, stderr)."""
    clean = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS and not k.startswith("SLURM_")}
    common = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_ID": "0",
              "MASTER_PORT": str(port), "SLURM_NTASKS": str(len(tasks))}
    procs = [subprocess.Popen([sys.executable, "-m", "labutils", "sweep", "--backend", "gloo", "--json", *SMALL],
                              cwd=ROOT, env={**clean, **common, **{k: str(v) for k, v in t.items()}},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for t in tasks]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, *o) for p, o in zip(procs, outs)]


def _saved(results: Path) -> list[dict]:
    return [json.loads(p.read_text())["meta"] for p in sorted(results.glob("sweep-*.json"))]


@pytest.mark.distributed
def test_two_srun_tasks_on_loopback_are_one_two_rank_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    runs = _srun([{"SLURM_PROCID": r, "SLURM_LOCALID": r, "SLURM_NODEID": 0, "SLURM_TASKS_PER_NODE": 2}
                  for r in range(2)], free_port())
    assert [r[0] for r in runs] == [0, 0], runs[0][2][-2000:] + runs[1][2][-2000:]
    rows = json.loads(runs[0][1])
    assert len(rows) == 3 and {r["world_size"] for r in rows} == {2} and all(r["wrong"] == 0 for r in rows)
    assert runs[1][1].strip() == "" and "saved:" not in runs[1][2]  # exactly one table, from rank 0
    [meta] = _saved(tmp_path)  # rank 0 alone saved
    assert (meta["launcher"], meta["world_size"], meta["slurm_job_id"], meta["nodes"]) == ("srun", 2, 4242, 1)
    assert len(meta["devices"]) == 2 and meta["local_world_size"] == 2


@pytest.mark.distributed
def test_two_nodes_of_two_srun_tasks_on_loopback(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    runs = _srun([{"SLURM_PROCID": r, "SLURM_LOCALID": r % 2, "SLURM_NODEID": r // 2,
                   "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": 2} for r in range(4)], free_port())
    assert [r[0] for r in runs] == [0] * 4, "".join(r[2][-1500:] for r in runs)
    rows = json.loads(runs[0][1])
    assert {r["world_size"] for r in rows} == {4} and all(r["wrong"] == 0 for r in rows)
    assert all(r[1].strip() == "" for r in runs[1:])
    [meta] = _saved(tmp_path)
    assert meta["nodes"] == 2 and meta["rank_nodes"] == [0, 0, 1, 1] and meta["local_world_size"] == 2


# --- the batch script ------------------------------------------------------------------------------------

def _sbatch(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines() if line.startswith("#SBATCH"))


@pytest.mark.parametrize("mode, tasks_per_node", [("srun", "4"), ("torchrun", "1")])
def test_the_batch_script_is_bash_and_asks_for_the_layout(tmp_path, mode, tasks_per_node, capsys):
    assert main(["slurm-script", "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu", "--time", "0:30:00",
                 "--max-bytes", "1G", "--mode", mode]) == 0
    script = capsys.readouterr().out
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert _sbatch(script) == {"job-name": "lab-sweep", "nodes": "2", "ntasks-per-node": tasks_per_node,
                               "gpus-per-node": "4", "time": "0:30:00", "partition": "gpu",
                               "output": "lab-sweep-%j.out"}
    assert script.startswith("#!/bin/bash\n") and "MASTER_ADDR=" in script and "MASTER_PORT=" in script
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(steps) == 2 and "--nproc 4" in steps[0] and "--max-bytes 1G" in steps[1]
    assert ("torch.distributed.run" in steps[1]) == (mode == "torchrun")
    assert "LAB_RESULTS_DIR" in script and "multinode_result" in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_batch_script_runs_its_rendezvous_lines(tmp_path):
    """The rendezvous lines themselves, run with a fake scontrol: the first host and the job's port."""
    script = slurm.slurm_script(2, 8)
    lines = [line for line in script.splitlines() if line.startswith("export MASTER_")]
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho nodeA; echo nodeB\n")
    (tmp_path / "scontrol").chmod(0o755)
    run = subprocess.run(["bash", "-c", "\n".join(lines) + '\necho "$MASTER_ADDR:$MASTER_PORT"'], text=True,
                         capture_output=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "123456",
                                                   "SLURM_JOB_NODELIST": "node[A-B]"})
    assert run.stdout.strip() == f"nodeA:{slurm.job_port(123456)}"


@pytest.mark.parametrize("argv, needle", [
    (["--nodes", "0", "--gpus-per-node", "4"], "nodes=0"),
    (["--nodes", "2", "--gpus-per-node", "0"], "gpus_per_node=0"),
    (["--nodes", "2", "--gpus-per-node", "999"], "gpus_per_node=999"),
    (["--nodes", "2", "--gpus-per-node", "4", "--time", "soon"], "time='soon'"),
    (["--nodes", "2", "--gpus-per-node", "4", "--time", "0:00:00"], "time='0:00:00'"),
    (["--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu; rm -rf ~"], "partition="),
    (["--nodes", "2", "--gpus-per-node", "4", "--max-bytes", "lots"], "max_bytes"),
    (["--nodes", "2", "--gpus-per-node", "4", "--max-bytes", "512"], "max_bytes=512B is outside"),
    (["--nodes", "2", "--gpus-per-node", "4", "--max-bytes", "1T"], "max_bytes=1.02e+03G is outside"),
    (["--nodes", "2", "--gpus-per-node", "4", "--mode", "mpirun"], "--mode"),
    (["--nodes", "two", "--gpus-per-node", "4"], "--nodes"),
    (["--gpus-per-node", "4"], "--nodes"),
])
def test_bad_script_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(["slurm-script", *argv]) == 2
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert out == "" and last.startswith("error:") and needle in last
