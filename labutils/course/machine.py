"""Which case this machine is in (CPU only, one GPU, several GPUs), what the lab measures there, and
how long it may measure: every measuring notebook has a `budget_s` parameter, the seconds its
measurements may take on any machine (40 s in full mode, 12 s in quick mode), handed out over its
experiments by a `Budget` clock started before its first ranks, so rank start-up comes out of it."""

from __future__ import annotations

import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.core.results import to_json
from labutils.measure.launch import (
    RankError,
    cuda_device_count,
    gpu_names,
    ping_worker,
    ranks_per_gpu,
    resolve_backend,
)
from labutils.measure.placement import NumaNode, cpu_layout, machine_placement
from labutils.measure.pool import launch

FULL_BUDGET_S = 40.0  # seconds of measuring per notebook in full mode, on any machine
QUICK_BUDGET_S = 12.0

SHARES = {  # each measuring notebook's experiments and the fraction of its budget each gets
    "02_allreduce_sweep": {"sweep": 0.7, "sweep beside": 0.3},
    "04_ring_by_hand": {"hand ring": 1.0},
    "06_tensor_parallel": {"one split step": 1.0},
    "09_validating_the_budget": {"before the split": 0.3, "the split": 0.45, "overlap": 0.25},
    "10_data_parallel_training": {"steps": 1.0},  # scaling_experiment shares it over its runs
    "11_ddp_by_hand": {"four ways": 0.55, "collectives": 0.3, "exercise": 0.15},
}


def budget_seconds(quick: bool, budget: float | None = None) -> float:
    """The notebook's measuring budget: `budget` when given (checked), else 40 s full, 12 s quick."""
    if budget is None:
        return QUICK_BUDGET_S if quick else FULL_BUDGET_S
    check_range("budget_s", budget, low=1, high=3600, unit="s")
    return float(budget)


class Budget:
    """A notebook's measuring budget as a clock, started when made (before its first ranks start):
    `share(what)` hands experiment `what` its fraction of the seconds left, shared among the
    experiments not yet run, so that rank start-up, and any overrun of an earlier experiment,
    comes out of the later ones and the notebook's measuring stays near `total_s`."""

    def __init__(self, name: str, total_s: float, clock=time.monotonic):
        if name not in SHARES:
            raise LabInputError(f"notebook {name!r} has no measuring budget (those with one: {', '.join(SHARES)})")
        self.name, self.total_s, self._clock = name, float(total_s), clock
        self._start, self._waiting = clock(), dict(SHARES[name])

    def left_s(self) -> float:
        return self.total_s - (self._clock() - self._start)

    def share(self, what: str) -> float:
        """Seconds for experiment `what` (each once): left x its fraction / the fractions still waiting."""
        if what not in self._waiting:
            raise LabInputError(f"{what!r} is not a waiting experiment of {self.name} "
                                f"(waiting: {', '.join(self._waiting) or 'none'})")
        rest = sum(self._waiting.values())
        return max(0.0, self.left_s()) * self._waiting.pop(what) / rest



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
    names: tuple[str, ...] = ()
    count = cuda_device_count() if gpu_count is None else gpu_count
    if count and gpu_count is None:
        names = gpu_names(count)  # NVML: the kernel opens no CUDA context
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


# ---- the machine check --------------------------------------------------------------------

# notebook -> what it does in each case (cpu / one-gpu / multi-gpu); `route()` picks the column
# from the backend and device a notebook really runs on
ROUTES = {
    "00_check_your_machine": ("this check", "this check", "this check"),
    "01_topology": ("NUMA layout and the shipped sample topologies",
                    "nvidia-smi topo -m, NVML's PCIe generation and width, host<->GPU copies against the wire",
                    "nvidia-smi topo -m, NVML, peer access, host<->GPU and GPU<->GPU copies against the wire"),
    "02_allreduce_sweep": ("gloo all-reduce across local CPU processes",
                           "gloo on CUDA tensors, 2 ranks sharing the GPU (GPU -> host -> socket -> host -> GPU), "
                           "gloo on CPU beside it, the pinned host<->GPU copy as the wire's ceiling",
                           "NCCL all-reduce across the GPUs, and gloo on CUDA tensors for comparison"),
    "03_nccl_transports": ("NCCL's connection log read from the lab's samples",
                           "NCCL's connection log read from the lab's samples (one GPU has no peer to connect to)",
                           "a short NCCL run on this machine's GPUs, logged with NCCL_DEBUG=INFO"),
    "04_ring_by_hand": ("a ring all-reduce by hand on 4 gloo CPU ranks, against gloo's own",) * 3,
    "05_predicting_allreduce": ("alpha-beta fit of the gloo sweep", "alpha-beta fit of the gloo-on-CUDA sweep",
                                "alpha-beta fit of the NCCL sweep"),
    "06_tensor_parallel": ("2-rank split layer with gloo on CPU",
                           "2-rank split layer computed on the GPU (ranks sharing it), gloo carrying the all-reduce",
                           "2-rank split layer with NCCL, one GPU per rank"),
    "07_backward_and_precision": ("2-rank split block's backward with gloo on CPU, and the precision of a split",
                                  "2-rank split block's backward computed on the GPU (ranks sharing it), gloo "
                                  "carrying the all-reduces",
                                  "2-rank split block's backward with NCCL, one GPU per rank"),
    "08_time_budget": ("the time-budget model (pure arithmetic)",) * 3,
    "09_validating_the_budget": ("model vs a measured split layer on gloo, each rank on cores of its own",
                                 "model vs a split layer computed on the GPU (ranks sharing it), gloo all-reduce",
                                 "model vs a measured split layer on NCCL, one GPU per rank"),
    "10_data_parallel_training": ("DDP step with gloo on CPU, one core per rank",
                                  "DDP step computed on the GPU (ranks sharing it), gloo all-reduce on CPU threads",
                                  "DDP step with NCCL, one GPU per rank"),
    "11_ddp_by_hand": ("gradient all-reduce four ways, reduce-scatter/all-gather and a sharded step, gloo on CPU",
                       "the same computed on the GPU (ranks sharing it), gloo carrying the collectives",
                       "the same with NCCL, one GPU per rank"),
}
_CASES = ("cpu", "one-gpu", "multi-gpu")
RANKED = ("02_allreduce_sweep", "05_predicting_allreduce", "06_tensor_parallel", "07_backward_and_precision",
          "09_validating_the_budget", "10_data_parallel_training", "11_ddp_by_hand")  # the notebooks that start ranks

# What a route stands for, and what it cannot show, by (backend, device, ranks share a GPU).
_MEANING = {
    ("gloo", "cpu", False): (
        "two devices that are two CPU cores, each rank a process with its own core(s), joined by gloo "
        "over TCP on the loopback interface",
        "GPU compute, NCCL, and the PCIe or NVLink wires between GPUs"),
    ("gloo", "cuda", True): (
        "two devices whose link is gloo through host memory (GPU -> host -> socket -> host -> GPU) and whose "
        "compute shares one GPU's SMs, so each half may run no faster than the whole (eta can fall toward 0.5)",
        "a second GPU's own compute, and NCCL or peer-to-peer traffic over PCIe or NVLink"),
    ("gloo", "cuda", False): (
        "GPUs of their own for every rank, joined the slow way: gloo staging every byte through host memory",
        "what the same GPUs do with NCCL over their own wires"),
    ("nccl", "cuda", False): (
        "the real thing: one GPU per rank, NCCL over this machine's own wires (see notebook 01)",
        "other machines' wires, and a second node's network (run the same code under torchrun)"),
}


@dataclass(frozen=True)
class Route:
    """How one notebook runs on a machine with `gpu_count` GPUs.

    `backend`/`device` carry the collectives ("" and "cpu" for notebooks that start no ranks),
    `nproc` ranks (0: none), `ranks_per_gpu` of them on the busiest GPU (0 on the CPU), `beside`
    the (backend, device) sweeps drawn next to the main one, `copy_ceiling` whether the pinned
    host<->GPU copy is drawn as the wire's ceiling (gloo on CUDA crosses it twice per hop);
    `measures`, `emulates` and `cannot_show` say it in words.
    """

    notebook: str
    case: str
    gpu_count: int
    backend: str
    device: str
    nproc: int
    ranks_per_gpu: int
    beside: tuple[tuple[str, str], ...]
    copy_ceiling: bool
    measures: str
    emulates: str
    cannot_show: str
    reason: str

    @property
    def shares_gpu(self) -> bool:
        """Several ranks on one GPU: their compute time-shares its SMs."""
        return self.ranks_per_gpu > 1

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def label(self) -> str:
        if not self.nproc:
            return self.measures
        if not self.on_gpu:
            return f"gloo between {self.nproc} CPU processes"
        name = "NCCL" if self.backend == "nccl" else "gloo on CUDA tensors"
        if self.shares_gpu:
            gpus = min(self.gpu_count, self.nproc)
            return f"{name}, {self.nproc} ranks sharing {gpus} GPU{'s' if gpus > 1 else ''}"
        return f"{name}, {self.nproc} ranks, one GPU each"


def _case_kind(gpu_count: int) -> str:
    return "cpu" if gpu_count == 0 else "one-gpu" if gpu_count == 1 else "multi-gpu"


def route(notebook: str, gpu_count: int, backend: str = "auto", device: str = "auto", nproc: int = 2) -> Route:
    """The route of `notebook` on a machine with `gpu_count` GPUs (a pure function: the count is
    given, never read). Backend and device come from `launch.resolve_backend`: NCCL with a GPU per
    rank, gloo on CUDA tensors with ranks sharing fewer GPUs, gloo on CPU without a GPU."""

    check_choice("notebook", notebook, tuple(ROUTES))
    gpu_count = check_int("gpu_count", gpu_count, low=0)
    case = _case_kind(gpu_count)
    if notebook not in RANKED:
        text = ROUTES[notebook][_CASES.index(case)]
        return Route(notebook, case, gpu_count, "", "cpu" if gpu_count == 0 else "cuda", 0, 0, (),
                     notebook == "01_topology" and gpu_count > 0, text, "nothing: it runs no ranks", "",
                     "starts no ranks")
    choice = resolve_backend(backend, device, nproc, gpu_count=gpu_count)
    shared = ranks_per_gpu(nproc, gpu_count) if choice.device == "cuda" else 0
    column = "cpu" if choice.device == "cpu" else "multi-gpu" if choice.backend == "nccl" else "one-gpu"
    beside: tuple[tuple[str, str], ...] = ()
    if notebook == "02_allreduce_sweep":
        beside = ((("gloo", "cuda"),) if choice.backend == "nccl"
                  else (("gloo", "cpu"),) if choice.device == "cuda" else ())
    emulates, cannot = _MEANING[(choice.backend, choice.device, shared > 1)]
    return Route(notebook, case, gpu_count, choice.backend, choice.device, int(nproc), shared, beside,
                 notebook == "02_allreduce_sweep" and choice.device == "cuda" and choice.backend == "gloo",
                 ROUTES[notebook][_CASES.index(column)], emulates, cannot, choice.reason)


def format_route(r: Route) -> str:
    """The route in three plain lines: what runs, what it stands for, what it cannot show."""
    if not r.nproc:
        return f"Route: {r.measures}."
    return (f"Route: {r.label}. Why: {r.reason}.\n"
            f"It emulates {r.emulates}.\n"
            f"It cannot show {r.cannot_show}.")


@dataclass(frozen=True)
class MachineReport:
    """What this machine can do. `torch_build` is "CUDA 12.4" or "CPU"; `gloo_works` is None when
    not tried; `route` pairs each notebook with what it will measure here; `placement` is the
    CPU plan for the lab's 2 ranks (labutils.measure.placement)."""

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
    placement: str = ""

    def as_dict(self) -> dict:
        out = asdict(self)
        out["route"] = dict(self.route)
        return out


def _torch_facts() -> tuple[str, str, str | None, bool]:
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
    case = detect_case(gpu_count)
    version, build, nccl, gloo = _torch_facts()
    works, detail = ping_gloo() if ping and gloo else (None, "not tried (pass ping=True / --ping)")
    if not gloo:
        detail = "torch.distributed has no gloo backend in this build"
    layout = cpu_layout()

    placement = machine_placement(2, layout=layout).explanation
    return MachineReport(
        python=platform.python_version(), torch_version=version, torch_build=build,
        cuda_available=case.gpu_count > 0, gpu_count=case.gpu_count, gpu_names=case.gpu_names,
        nccl_version=nccl, gloo_available=gloo, gloo_works=works, gloo_detail=detail,
        nvidia_smi=shutil.which("nvidia-smi"), cpu_cores=layout.cpus, sockets=layout.sockets,
        numa_nodes=layout.numa_nodes, case=case.kind,
        route=tuple((nb, route(nb, case.gpu_count).measures) for nb in ROUTES), placement=placement)


def format_report(r: MachineReport) -> str:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    numa = "; ".join(f"node {n.node}: CPUs {n.cpulist}" for n in r.numa_nodes) or "none found"
    lines = [
        f"Python {r.python}; torch {r.torch_version} ({r.torch_build} build)",
        f"CUDA available: {yes(r.cuda_available)}; GPUs: {r.gpu_count}"
        + (f" ({', '.join(r.gpu_names)})" if r.gpu_names else ""),
        f"NCCL: {r.nccl_version or 'not available (needs a CUDA build and a GPU)'}",
        f"gloo: {'available' if r.gloo_available else 'missing'}; {r.gloo_detail}",
        f"nvidia-smi: {r.nvidia_smi or 'not found'}",
        f"CPU: {r.cpu_cores} core(s), {r.sockets} socket(s); NUMA: {numa}",
        f"CPU placement: {r.placement}",
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

    report = check(ping=args.ping)
    print(to_json(report.as_dict()) if args.json else format_report(report))
    return 1 if args.ping and not report.gloo_works else 0


def check_backend_guess(backend: str, nproc: int = 2, gpu_count: int | None = None) -> str:
    """Exercise checker: which backend will a `nproc`-rank all-reduce use ("gloo" or "nccl") on a
    machine with `gpu_count` GPUs (None: this machine's)? Answers with the reason, or a hint naming
    what decides it: NCCL needs a GPU of its own for every rank."""

    choice = resolve_backend("auto", "auto", nproc, gpu_count=gpu_count)
    guess = str(backend).strip().lower()
    gpus = ("this machine's GPU count (the check's 'GPUs:' line)" if gpu_count is None
            else f"{gpu_count} GPU{'s' if gpu_count != 1 else ''} for {nproc} ranks")
    if guess == choice.backend:
        return f"Right: {choice.backend} on {choice.device} ({choice.reason})."
    if guess not in ("gloo", "nccl"):
        return "Not yet: answer with a backend name, 'gloo' or 'nccl'."
    if guess == "nccl":
        return f"Not yet: NCCL moves only GPU memory and needs one GPU per rank. Compare {gpus}."
    return f"Not yet: with a GPU for every rank the lab takes the faster road. Compare {gpus}."
