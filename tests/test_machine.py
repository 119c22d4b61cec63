"""`machine.check` on this machine, the CPU/NUMA reader, the `check` / `topo` subcommands, and each
notebook's route (backend, device, ranks per GPU) as a pure function of the GPU count."""

import json

import pytest
import torch

from labutils import cli
from labutils.core.inputs import LabInputError
from labutils.course import machine
from labutils.course.machine import FULL_BUDGET_S, QUICK_BUDGET_S, SHARES, Budget, budget_seconds
from labutils.measure import placement as lab_cpus
from labutils.readers.topology import list_samples


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """Run `python -m labutils ...` in-process (the CLI loads only the subcommand asked for)."""
    def run(*argv):
        code = cli.main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_check_reports_this_machine():
    r = machine.check()
    assert r.python.count(".") == 2
    assert r.torch_version == torch.__version__
    assert r.torch_build == ("CPU" if torch.version.cuda is None else f"CUDA {torch.version.cuda}")
    assert r.gpu_count == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert r.cuda_available == (r.gpu_count > 0) and len(r.gpu_names) == r.gpu_count
    assert r.gloo_works is None and "not tried" in r.gloo_detail
    assert r.cpu_cores >= 1 and r.numa_nodes and r.sockets >= 1
    assert dict(r.route).keys() == machine.ROUTES.keys()
    if r.gpu_count == 0:
        assert r.case == "cpu" and r.nccl_version is None
        assert "sample" in dict(r.route)["01_topology"]


def test_route_follows_the_case():
    multi = dict(machine.check(gpu_count=4).route)
    assert "NCCL" in multi["02_allreduce_sweep"] and machine.check(gpu_count=4).case == "multi-gpu"
    assert "gloo" in dict(machine.check(gpu_count=1).route)["02_allreduce_sweep"]


def test_count_cpulist():
    assert lab_cpus.count_cpulist("0-3,8-11") == 8
    assert lab_cpus.count_cpulist("5") == 1
    assert lab_cpus.count_cpulist("") == 0


def test_cpu_layout_reads_a_two_socket_sys_tree(tmp_path):
    system = tmp_path / "devices" / "system"
    for node, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        (system / "node" / f"node{node}").mkdir(parents=True)
        (system / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    for cpu in range(16):
        topo = system / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        topo.joinpath("physical_package_id").write_text("0\n" if cpu % 8 < 4 else "1\n")
    layout = lab_cpus.cpu_layout(str(tmp_path))
    assert (layout.cpus, layout.sockets) == (16, 2)
    assert [(n.node, n.cpulist, n.cpus) for n in layout.numa_nodes] == [(0, "0-3,8-11", 8), (1, "4-7,12-15", 8)]


def test_cpu_layout_falls_back_without_sys(tmp_path):
    layout = lab_cpus.cpu_layout(str(tmp_path))
    assert layout.cpus >= 1 and layout.numa_nodes and layout.source in ("lscpu -p", "os.cpu_count()")


def test_check_cli_text_and_json(run_cli):
    code, out, _ = run_cli("check")
    assert code == 0 and "Route through the lab" in out and "01_topology" in out
    code, out, _ = run_cli("check", "--json")
    data = json.loads(out)
    assert code == 0
    assert {"python", "torch_version", "torch_build", "cuda_available", "gpu_count", "gpu_names", "nccl_version",
            "gloo_available", "nvidia_smi", "cpu_cores", "numa_nodes", "route"} <= data.keys()
    assert data["route"]["08_time_budget"]


@pytest.mark.distributed
def test_check_ping_runs_gloo_on_two_ranks(run_cli):
    code, out, _ = run_cli("check", "--json", "--ping")
    data = json.loads(out)
    assert code == 0 and data["gloo_works"] is True and "correct sum" in data["gloo_detail"]


@pytest.mark.parametrize("name", list_samples())
def test_topo_file_on_every_sample(run_cli, name):
    code, out, _ = run_cli("topo", "--file", name, "--json")
    data = json.loads(out)
    assert code == 0
    n = len(data["gpus"])
    assert len(data["pairs"]) == n * (n - 1) // 2 and set(data["links"]) == set(data["gpus"])
    assert set(data["cpu_affinity"]) == set(data["gpus"]) and "numa_affinity" in data
    assert all(p["expected_low_GBps"] <= p["expected_high_GBps"] for p in data["pairs"])
    code, text, _ = run_cli("topo", "--file", name)
    assert code == 0 and "For a 2-GPU job" in text


def test_topo_file_path_and_errors(run_cli, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tWAT\t X \n")
    code, _, err = run_cli("topo", "--file", str(bad))
    assert code == 2 and "line 3" in err and "WAT" in err and err.count("\n") == 1
    code, _, err = run_cli("topo", "--file", str(tmp_path / "missing.txt"))
    assert code == 2 and "does not exist" in err


def test_topo_without_nvidia_smi_says_so_and_exits_0(run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out, _ = run_cli("topo")
    assert code == 0
    assert "nvidia-smi is not installed" in out and "--file two_gpu_sys" in out


def _fake_nvidia_smi(directory, body):
    exe = directory / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)


def test_topo_reads_a_live_nvidia_smi(run_cli, monkeypatch, tmp_path):
    from labutils.readers.topology import SAMPLES_DIR

    _fake_nvidia_smi(tmp_path, f"cat '{SAMPLES_DIR / 'two_gpu_nvlink_bridge.txt'}'")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    code, out, _ = run_cli("topo", "--json", "--pcie-gen", "4")
    data = json.loads(out)
    assert code == 0 and data["source"] == "nvidia-smi topo -m" and data["links"]["GPU0"]["GPU1"] == "NV4"


def test_nvidia_smi_that_hangs_or_fails_is_reported(monkeypatch, tmp_path):
    from labutils.readers.sources import run_nvidia_smi

    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fake_nvidia_smi(tmp_path, "exec sleep 5")
    text, why = run_nvidia_smi(timeout_s=0.5)
    assert text is None and "did not answer" in why
    _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    text, why = run_nvidia_smi()
    assert text is None and "failed (9)" in why and "NVIDIA-SMI has failed" in why


def test_lspci_missing_hanging_failing_or_silent_is_one_line(monkeypatch, tmp_path):
    """sources.run_lspci through sources.tool_output: (None, why) for every way lspci can let us down."""
    from labutils.readers.sources import run_lspci

    monkeypatch.setenv("PATH", str(tmp_path))
    assert run_lspci() == (None, "lspci is not installed (package pciutils)")
    fake = tmp_path / "lspci"
    for body, timeout_s, want in (("exec /bin/sleep 5", 0.5, "lspci -vvv did not answer within 0.5 s"),
                                  ("echo 'pcilib: no access' >&2; exit 3", 15.0,
                                   "lspci -vvv failed (3): pcilib: no access"),
                                  ("exit 0", 15.0, "lspci -vvv failed (0): ")):
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
        assert run_lspci(timeout_s) == (None, want)
    fake.write_text("#!/bin/sh\necho \"$@\"\n")
    assert run_lspci() == ("-D -vvv\n", "")


RANKED = ("02_allreduce_sweep", "06_tensor_parallel", "09_validating_the_budget", "10_data_parallel_training")


# --- the route, a pure function of the GPU count ------------------------------------------------------

@pytest.mark.parametrize("notebook", RANKED)
def test_route_follows_the_gpu_count(notebook):
    cpu, one, two, eight = (machine.route(notebook, g) for g in (0, 1, 2, 8))
    assert (cpu.backend, cpu.device, cpu.nproc, cpu.ranks_per_gpu, cpu.case) == ("gloo", "cpu", 2, 0, "cpu")
    assert (one.backend, one.device, one.nproc, one.ranks_per_gpu, one.case) == ("gloo", "cuda", 2, 2, "one-gpu")
    assert one.shares_gpu and one.on_gpu and not cpu.on_gpu
    for many in (two, eight):
        assert (many.backend, many.device, many.ranks_per_gpu, many.case) == ("nccl", "cuda", 1, "multi-gpu")
        assert not many.shares_gpu
    assert "host memory" in one.emulates and "SMs" in one.emulates and "0.5" in one.emulates
    assert "second GPU's own compute" in one.cannot_show
    assert "one GPU per rank" in machine.format_route(eight) or "one GPU each" in machine.format_route(eight)
    # four ranks on two GPUs: gloo on CUDA, two ranks per GPU
    four = machine.route(notebook, 2, nproc=4)
    assert (four.backend, four.device, four.ranks_per_gpu) == ("gloo", "cuda", 2)


def test_route_of_the_sweep_draws_its_comparisons():
    cpu, one, eight = (machine.route("02_allreduce_sweep", g) for g in (0, 1, 8))
    assert cpu.beside == () and not cpu.copy_ceiling
    assert one.beside == (("gloo", "cpu"),) and one.copy_ceiling  # gloo on CPU beside, the copy as ceiling
    assert eight.beside == (("gloo", "cuda"),) and not eight.copy_ceiling
    asked_cpu = machine.route("02_allreduce_sweep", 1, device="cpu")
    assert (asked_cpu.backend, asked_cpu.device, asked_cpu.beside) == ("gloo", "cpu", ())


def test_route_without_ranks_and_bad_input():
    assert machine.route("08_time_budget", 8).nproc == 0
    assert machine.route("01_topology", 1).copy_ceiling is True and machine.route("01_topology", 0).nproc == 0
    with pytest.raises(LabInputError, match="notebook"):
        machine.route("99_nothing", 1)
    with pytest.raises(LabInputError, match="gpu_count"):
        machine.route("02_allreduce_sweep", -1)
    with pytest.raises(LabInputError, match="one GPU per rank"):
        machine.route("10_data_parallel_training", 1, backend="nccl")


def test_check_reports_the_route_of_each_case():
    one = dict(machine.check(gpu_count=1).route)
    assert "gloo on CUDA tensors" in one["02_allreduce_sweep"] and "GPU" in one["10_data_parallel_training"]
    assert "NCCL" in dict(machine.check(gpu_count=8).route)["09_validating_the_budget"]


def test_detect_case_names_gpus_from_nvml_without_a_context(fake_gpus):
    calls = fake_gpus(4)
    case = machine.detect_case()
    assert (case.kind, case.gpu_count) == ("multi-gpu", 4)
    assert case.gpu_names == tuple(f"NVIDIA H100 80GB HBM3 #{i}" for i in range(4))
    assert machine.detect_case(gpu_count=2).gpu_names == ("GPU0", "GPU1")
    assert calls == []


# --- the measuring budget ------------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_budget_s_defaults_and_checks():
    assert budget_seconds(False) == FULL_BUDGET_S == 40.0 and budget_seconds(True) == QUICK_BUDGET_S == 12.0
    assert budget_seconds(True, 30) == 30.0
    for bad in (0, -5, 1e6, float("nan"), "40"):
        with pytest.raises(LabInputError, match="budget_s"):
            budget_seconds(False, bad)


def test_shares_come_out_of_what_is_left():
    clock = FakeClock()
    budget = Budget("09_validating_the_budget", 40.0, clock)
    clock.now += 4.0  # rank start-up and the link: paid from the budget
    first = budget.share("before the split")
    assert first == pytest.approx(36.0 * 0.3)
    clock.now += 20.0  # the first experiment overran its share
    second = budget.share("the split")
    assert second == pytest.approx(16.0 * 0.45 / 0.7)
    clock.now += second
    assert budget.share("overlap") == pytest.approx(40.0 - 24.0 - second)
    with pytest.raises(LabInputError, match="overlap"):
        budget.share("overlap")  # each once


def test_an_exhausted_budget_gives_zero_not_a_negative_share():
    clock = FakeClock()
    budget = Budget("10_data_parallel_training", 12.0, clock)
    clock.now += 30.0
    assert budget.share("steps") == 0.0 and budget.left_s() < 0


def test_every_measuring_notebook_shares_all_of_its_budget():
    for name, fractions in SHARES.items():
        assert sum(fractions.values()) == pytest.approx(1.0), name
    with pytest.raises(LabInputError, match="08_time_budget"):
        Budget("08_time_budget", 10.0)


def test_backend_guess_for_a_machine_named_in_the_exercise():
    """00's exercise: 6 ranks on 4 GPUs. NCCL needs a GPU per rank, so auto takes gloo on CUDA; the
    hints name the counts that decide it, and the reason says where the ranks sit."""
    right = machine.check_backend_guess(" GLOO ", nproc=6, gpu_count=4)
    assert right.startswith("Right: gloo on cuda") and "2 ranks on the busiest GPU" in right
    assert "4 GPUs for 6 ranks" in machine.check_backend_guess("nccl", nproc=6, gpu_count=4)
    assert machine.check_backend_guess("nccl", nproc=4, gpu_count=4).startswith("Right: nccl")
    assert "4 GPUs for 2 ranks" in machine.check_backend_guess("gloo", nproc=2, gpu_count=4)
    assert "'gloo' or 'nccl'" in machine.check_backend_guess(None, nproc=6, gpu_count=4)
    assert "2 ranks sharing each GPU" in machine.check_backend_guess("gloo", nproc=4, gpu_count=2)
