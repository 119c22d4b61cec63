"""Which case this machine is in (CPU only, one GPU, several GPUs) and what the lab measures there."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from labutils.launch import cuda_device_count


@dataclass(frozen=True)
class MachineCase:
    """`kind` is "cpu", "one-gpu" or "multi-gpu"; `gpu_names` in device order."""

    kind: str
    gpu_count: int
    gpu_names: tuple[str, ...]
    cpu_count: int

    @property
    def label(self) -> str:
        if self.kind == "cpu":
            return "CPU only (no CUDA GPU visible)"
        return f"{self.gpu_count} GPU(s): {', '.join(self.gpu_names)}"


def detect_case(gpu_count: int | None = None) -> MachineCase:
    """Read the GPU count (torch.cuda) and names; `gpu_count` overrides it (for teaching and tests)."""
    import os

    names: tuple[str, ...] = ()
    count = cuda_device_count() if gpu_count is None else gpu_count
    if count and gpu_count is None:
        import torch

        names = tuple(torch.cuda.get_device_name(i) for i in range(count))
    elif count:
        names = tuple(f"GPU{i}" for i in range(count))
    kind = "cpu" if count == 0 else "one-gpu" if count == 1 else "multi-gpu"
    return MachineCase(kind, count, names, os.cpu_count() or 1)


def announce(plan: dict[str, str], case: MachineCase | None = None) -> MachineCase:
    """Print which case this notebook runs in and what it will measure there.

    `plan` maps "cpu", "one-gpu", "multi-gpu" to one sentence each.
    """
    case = case or detect_case()
    print(f"This machine: {case.label}; {case.cpu_count} CPU core(s); Python {platform.python_version()}.")
    print(f"In this case the notebook measures: {plan.get(case.kind, plan.get('cpu', ''))}")
    return case


# ---- the CPU/NUMA layout (every machine, GPU or not) --------------------------------------

@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id, its CPUs as the kernel lists them ("0-23,48-71") and their count."""

    node: int
    cpulist: str
    cpus: int


@dataclass(frozen=True)
class CpuLayout:
    """Cores, sockets and NUMA nodes of this machine; `source` says where it was read."""

    cpus: int
    sockets: int
    numa_nodes: tuple[NumaNode, ...]
    source: str


def count_cpulist(cpulist: str) -> int:
    """Number of CPUs in a kernel cpulist: "0-3,8-11" -> 8, "" -> 0."""
    total = 0
    for part in filter(None, cpulist.strip().split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def cpu_layout(sys_root: str = "/sys") -> CpuLayout:
    """Read NUMA nodes from <sys_root>/devices/system/node and sockets from the CPUs' topology;
    fall back to `lscpu -p` where /sys is not there, and to one node with os.cpu_count()."""
    import os
    from pathlib import Path

    root = Path(sys_root) / "devices" / "system"
    nodes = []
    for d in sorted((root / "node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = (d / "cpulist").read_text().strip() if (d / "cpulist").exists() else ""
        nodes.append(NumaNode(int(d.name[4:]), cpulist, count_cpulist(cpulist)))
    packages = {p.read_text().strip() for p in (root / "cpu").glob("cpu[0-9]*/topology/physical_package_id")}
    if nodes:
        cpus = sum(n.cpus for n in nodes) or (os.cpu_count() or 1)
        return CpuLayout(cpus, max(1, len(packages)), tuple(n for n in nodes if n.cpus), f"{root}")
    return _lscpu_layout()


def _lscpu_layout() -> CpuLayout:
    import os
    import subprocess

    try:
        out = subprocess.run(["lscpu", "-p=CPU,SOCKET,NODE"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    rows = [line.split(",") for line in out.splitlines() if line and not line.startswith("#")]
    if not rows:
        n = os.cpu_count() or 1
        return CpuLayout(n, 1, (NumaNode(0, f"0-{n - 1}", n),), "os.cpu_count()")
    by_node: dict[int, list[int]] = {}
    for cpu, _socket, node in rows:
        by_node.setdefault(int(node or 0), []).append(int(cpu))
    nodes = tuple(NumaNode(k, ",".join(map(str, v)), len(v)) for k, v in sorted(by_node.items()))
    return CpuLayout(len(rows), len({r[1] for r in rows}), nodes, "lscpu -p")


# ---- the machine check --------------------------------------------------------------------

# notebook -> what it does in each case (cpu / one-gpu / multi-gpu)
ROUTES = {
    "00_check_your_machine": ("this check", "this check", "this check"),
    "01_topology": ("NUMA layout and the shipped sample topologies", "nvidia-smi topo -m, NVML, host<->GPU copy bandwidth",
                    "nvidia-smi topo -m, NVML, peer access, host<->GPU and GPU<->GPU copy bandwidth"),
    "02_allreduce_sweep": ("gloo all-reduce across local CPU processes", "gloo on CPU (one GPU cannot all-reduce with itself)",
                           "NCCL all-reduce across the GPUs, and gloo for comparison"),
    "03_predicting_allreduce": ("alpha-beta fit of the gloo sweep", "alpha-beta fit of the gloo sweep",
                                "alpha-beta fit of the NCCL sweep"),
    "04_tensor_parallel": ("2-rank split layer with gloo", "2-rank split layer with gloo", "2-rank split layer with NCCL"),
    "05_time_budget": ("the time-budget model (pure arithmetic)",) * 3,
    "06_validating_the_budget": ("model vs a measured split layer on gloo", "model vs a measured split layer on gloo",
                                 "model vs a measured split layer on NCCL"),
    "07_data_parallel_training": ("DDP step with gloo on CPU", "DDP step with gloo on CPU", "DDP step with NCCL"),
}
_CASES = ("cpu", "one-gpu", "multi-gpu")


@dataclass(frozen=True)
class MachineReport:
    """What this machine can do. `torch_build` is "CUDA 12.4" or "CPU"; `gloo_works` is None when
    not tried; `route` pairs each notebook with what it will measure here."""

    python: str
    torch_version: str
    torch_build: str
    cuda_available: bool
    gpu_count: int
    gpu_names: tuple[str, ...]
    nccl_version: str | None
    gloo_available: bool
    gloo_works: bool | None
    gloo_detail: str
    nvidia_smi: str | None
    cpu_cores: int
    sockets: int
    numa_nodes: tuple[NumaNode, ...]
    case: str
    route: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict:
        from dataclasses import asdict

        out = asdict(self)
        out["route"] = dict(self.route)
        return out


def _torch_facts() -> tuple[str, str, str | None, bool]:
    import torch
    import torch.distributed as dist

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    nccl = None
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # a CUDA build without NCCL
        nccl = None
    return torch.__version__, build, nccl, bool(dist.is_available() and dist.is_gloo_available())


def ping_gloo(timeout_s: float = 60.0) -> tuple[bool, str]:
    """Run `launch.ping_worker` on 2 gloo ranks: (worked, what happened)."""
    from labutils.launch import RankError, launch, ping_worker

    try:
        out = launch(ping_worker, 2, backend="gloo", device="cpu", timeout_s=timeout_s)
    except (RankError, OSError, RuntimeError) as exc:
        return False, f"2-rank gloo all-reduce failed: {exc}"
    ok = all(r["sum"] == r["expected"] for r in out)
    return ok, "2-rank gloo all-reduce: " + ("correct sum on both ranks" if ok else f"wrong sums {out}")


def check(ping: bool = False, gpu_count: int | None = None) -> MachineReport:
    """Inspect this machine (Python, torch, CUDA, GPUs, NCCL, gloo, nvidia-smi, cores, NUMA) and
    derive the route. `ping` also runs a real 2-rank gloo all-reduce; `gpu_count` overrides the
    detected count for teaching and tests."""
    import shutil

    case = detect_case(gpu_count)
    version, build, nccl, gloo = _torch_facts()
    works, detail = ping_gloo() if ping and gloo else (None, "not tried (pass ping=True / --ping)")
    if not gloo:
        detail = "torch.distributed has no gloo backend in this build"
    layout = cpu_layout()
    col = _CASES.index(case.kind)
    return MachineReport(
        python=platform.python_version(), torch_version=version, torch_build=build,
        cuda_available=case.gpu_count > 0, gpu_count=case.gpu_count, gpu_names=case.gpu_names,
        nccl_version=nccl, gloo_available=gloo, gloo_works=works, gloo_detail=detail,
        nvidia_smi=shutil.which("nvidia-smi"), cpu_cores=layout.cpus, sockets=layout.sockets,
        numa_nodes=layout.numa_nodes, case=case.kind,
        route=tuple((nb, ways[col]) for nb, ways in ROUTES.items()))


def format_report(r: MachineReport) -> str:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    numa = "; ".join(f"node {n.node}: CPUs {n.cpulist}" for n in r.numa_nodes) or "none found"
    lines = [
        f"Python {r.python}; torch {r.torch_version} ({r.torch_build} build)",
        f"CUDA available: {yes(r.cuda_available)}; GPUs: {r.gpu_count}" + (f" ({', '.join(r.gpu_names)})" if r.gpu_names else ""),
        f"NCCL: {r.nccl_version or 'not available (needs a CUDA build and a GPU)'}",
        f"gloo: {'available' if r.gloo_available else 'missing'}; {r.gloo_detail}",
        f"nvidia-smi: {r.nvidia_smi or 'not found'}",
        f"CPU: {r.cpu_cores} core(s), {r.sockets} socket(s); NUMA: {numa}",
        "", f"Route through the lab on this machine ({r.case}):",
    ]
    lines += [f"  {nb:28} {what}" for nb, what in r.route]
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("check", help="what this machine can do, and the route each notebook takes here")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--ping", action="store_true", help="also run a 2-rank gloo all-reduce (a few seconds)")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    """Exit 0 when the check ran; 1 when --ping was asked and gloo did not work."""
    from labutils.results import to_json

    report = check(ping=args.ping)
    print(to_json(report.as_dict()) if args.json else format_report(report))
    return 1 if args.ping and not report.gloo_works else 0


def check_backend_guess(backend: str, nproc: int = 2, gpu_count: int | None = None) -> str:
    """Exercise checker: which backend will a `nproc`-rank all-reduce use on this machine
    ("gloo" or "nccl")? Answers with the reason, or a hint pointing at the line of the check
    that decides it."""
    from labutils.launch import resolve_backend

    choice = resolve_backend("auto", "auto", nproc, gpu_count=gpu_count)
    guess = str(backend).strip().lower()
    if guess == choice.backend:
        return f"Right: {choice.backend} on {choice.device} ({choice.reason})."
    if guess not in ("gloo", "nccl"):
        return "Not yet: answer with a backend name, 'gloo' or 'nccl'."
    if guess == "nccl":
        return (f"Not yet: NCCL moves only GPU memory and needs one GPU per rank. Look at the 'GPUs:' line "
                f"of the check: are there {nproc} or more?")
    return ("Not yet: with a GPU for every rank the lab takes the faster road. Look at the 'GPUs:' and "
            "'NCCL:' lines of the check.")
