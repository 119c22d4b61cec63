"""A sweep over message sizes, as nccl-tests runs one (notebook 02, `interconnect-lab sweep`).

The arithmetic (algbw, busbw, the bus factor) is labutils.core.busbw; what runs in each rank is
labutils.measure.harness (timing) and labutils.measure.buffers (the correctness check). A sweep is
a `SweepConfig` (what to measure, where); `run_sweep` checks it (`plan_sweep`) and runs `sweep_worker`
in every rank. Per size: warm-up calls (never timed), a short probe from
which rank 0 picks the iteration count that fills a time budget
and broadcasts it (every rank must make the same calls), the timed loop (CUDA events on GPU,
barrier + perf_counter on CPU, see labutils.measure.timing), the mean time over ranks and the slowest
rank, and then a correctness check on freshly filled buffers: every element of the result is
compared with the exact expected value and mismatches are summed over ranks (`#wrong`).
The table nccl-tests prints is written by labutils.core.busbw and read back by labutils.readers.nccl_tests.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import socket
import sys
import time
from dataclasses import dataclass, replace

import pandas as pd
import torch

from labutils.core.busbw import (
    COLUMNS,
    DTYPES,
    OPS,
    SWEEP_EXTRA,
    canonical_dtype,
    element_bytes,
    format_size,
    layout,
    print_rows,
    sweep_sizes,
)
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.core.results import SweepResult, load_sweep, save_sweep
from labutils.measure.harness import sweep_worker
from labutils.measure.launch import (
    MAX_TIMEOUT_S,
    BackendChoice,
    RankError,
    cpu_name,
    cuda_device_count,
    free_memory_bytes,
    gpu_names,
    ranks_per_gpu,
    resolve_backend,
    run_this_rank,
    torchrun_env,
    with_places,
)
from labutils.measure.my_link import load_link, save_link
from labutils.measure.placement import check_local_ranks, machine_placement
from labutils.measure.pool import rank_progress, shared_pool
from labutils.measure.slurm import slurm_env
from labutils.model.fit import LinkFit, fit_alpha_beta
from labutils.readers.sources import run_nvidia_smi


def job_env() -> dict | None:
    """This process's rank in a job launched from outside: torchrun's variables (launch.torchrun_env),
    else srun's (labutils.measure.slurm.slurm_env: SLURM_PROCID/NTASKS/LOCALID, no torchrun), else
    None (a process of its own, which spawns its local ranks). Inconsistent variables: LabInputError."""
    return torchrun_env() or slurm_env()


class WrongResultError(RuntimeError):
    """Some elements of a collective's result were wrong; `result` still holds the whole sweep."""

    def __init__(self, message: str, result: "SweepResult"):
        super().__init__(message)
        self.result = result


def topology_text() -> str | None:
    """`nvidia-smi topo -m` output when nvidia-smi is there and answers, else None."""
    return run_nvidia_smi(timeout_s=10.0)[0]


def _versions() -> dict:
    nccl = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a torch built without NCCL
            nccl = None
    return {"torch_version": torch.__version__, "nccl_version": nccl}


def sweep_meta(backend: str, device: str, world_size: int, reason: str = "", places: list[dict] | None = None,
               **settings) -> dict:
    """Where and how a sweep ran: host, devices, versions, topology when known, UTC date, settings.

    `places` (launch.with_places: each rank's host, node and device name, read in the rank) name
    every rank's device and host across nodes: `hosts` (in the order of their first rank), `nodes`
    (the distinct host and node index pairs), `rank_hosts`, `rank_nodes`; without them every rank
    is on this host, rank r on GPU r % count.
    `topology` is this host's (rank 0's) `nvidia-smi topo -m`."""
    host = socket.gethostname().split(".")[0]
    if places:
        devices = [p["device_name"] for p in places]
        rank_hosts, rank_nodes = [p["host"] for p in places], [p["node"] for p in places]
    elif device == "cuda":
        names = gpu_names(max(1, cuda_device_count()))  # NVML: no CUDA context in the launching process
        devices, rank_hosts = [names[r % len(names)] for r in range(world_size)], [host] * world_size
    else:
        devices, rank_hosts = [f"cpu: {cpu_name()}"] * world_size, [host] * world_size
    if not places:
        rank_nodes = [0] * world_size
    hosts = list(dict.fromkeys(rank_hosts))
    nodes = len(set(zip(rank_hosts, rank_nodes)))  # node ids tell apart "nodes" faked on one host
    return {"host": rank_hosts[0] if rank_hosts else host, "hosts": hosts, "nodes": nodes,
            "rank_hosts": rank_hosts, "rank_nodes": rank_nodes, "devices": devices, "backend": backend,
            "device": device,
            "world_size": world_size, **_versions(), "topology": topology_text() if device == "cuda" else None,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "backend_reason": reason, "python": platform.python_version(), **settings}


def check_memory(max_bytes: int, nproc: int, device: str, ranks_here: int, free_bytes: int | None = None) -> None:
    """LabInputError when the largest size cannot fit: each rank holds about 3 buffers of it
    (timed, checked, expected); on the CPU all local ranks share one memory, on CUDA the ranks
    that share a GPU share its memory. The message names the parameter that is too large: the
    size when one rank's buffers alone do not fit, else the rank count."""
    sharing = ranks_here if device == "cpu" else max(1, ranks_per_gpu(ranks_here, cuda_device_count()))
    need = 3 * max_bytes * sharing
    free = free_memory_bytes(device, nproc) if free_bytes is None else free_bytes
    if need <= free:
        return
    if 3 * max_bytes > free:
        raise LabInputError(f"max_bytes={format_size(max_bytes)} needs about {format_size(3 * max_bytes)} of {device} "
                            f"memory per rank (3 buffers) but only {format_size(free)} is free; lower --max-bytes")
    fits = max(1, free // (3 * max_bytes))
    raise LabInputError(f"nproc={ranks_here} ranks x 3 buffers of max_bytes={format_size(max_bytes)} need about "
                        f"{format_size(need)} of {device} memory but only {format_size(free)} is free; lower --nproc "
                        f"(about {fits} rank(s) fit{' per GPU' if device == 'cuda' else ''}) or --max-bytes")


MAX_BUDGET_MS = 60_000.0  # a minute of timed calls per size
MAX_WARMUP = 10_000


def check_sizes_hold_elements(op: str, sizes: list[int], dtype: str, world: int) -> None:
    """LabInputError naming min_bytes when the smallest size holds no element per rank (nothing
    would be measured there): all_gather and reduce_scatter need world x element bytes."""
    if layout(op, sizes[0], dtype, world) is None:
        need = element_bytes(dtype) * (world if op in ("all_gather", "reduce_scatter") else 1)
        per_rank = " per rank" if need > element_bytes(dtype) else ""
        raise LabInputError(f"min_bytes={sizes[0]} holds no {dtype} element{per_rank} "
                            f"for {op} on {world} rank(s); the allowed range is [{need}, max_bytes] bytes")


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep is asked to do: which collective(s) over which sizes (min_bytes..max_bytes,
    x factor; K/M/G are 1024-based), how each size is timed (warm-up calls, then about `budget_ms` of
    timed calls, between min_iters and max_iters), and where it runs (`nproc` local ranks, backend
    and device, "auto" picks NCCL on CUDA when there is a GPU per rank, else gloo on CPU).
    `timeout_s` None: a minute plus 3 budgets and 2 s per size. `oversubscribe` lifts the bound on
    local ranks (placement.check_local_ranks)."""

    nproc: int = 2
    backend: str = "auto"
    device: str = "auto"
    op: str | tuple[str, ...] = "all_reduce"
    min_bytes: int | str = "1K"
    max_bytes: int | str = "64M"
    factor: int = 2
    dtype: str = "float32"
    warmup: int = 5
    budget_ms: float = 100.0
    min_iters: int = 3
    max_iters: int = 1000
    check: bool = True
    timeout_s: float | None = None
    oversubscribe: bool | None = None


@dataclass(frozen=True)
class SweepPlan:
    """A SweepConfig checked and resolved: the ops and sizes, the ranks (`world` in all, `local` on
    this machine), the backend chosen, the timeout; `torchrun` holds the job's variables when this
    process is one rank of a job launched from outside (launch.job_env: torchrun's or srun's), else None."""

    config: SweepConfig
    ops: tuple[str, ...]
    sizes: list[int]
    dtype: str
    world: int
    local: int
    choice: BackendChoice
    timeout_s: float
    torchrun: dict | None

    def worker_kwargs(self) -> dict:
        c = self.config
        return dict(ops=self.ops, sizes=self.sizes, dtype=self.dtype, warmup=c.warmup, budget_ms=c.budget_ms,
                    min_iters=c.min_iters, max_iters=c.max_iters, check=c.check)


def plan_sweep(config: SweepConfig) -> SweepPlan:
    """Check every input of `config` before a rank starts (LabInputError naming the parameter) and
    resolve the ranks, the backend and the timeout. Under torchrun or srun (`job_env`) the world is
    the job's and `local` its ranks on this node; `config.nproc` is then not used (no rank spawns more)."""
    ops = (config.op,) if isinstance(config.op, str) else tuple(config.op)
    for name in ops:
        check_choice("op", name, OPS)
    dtype = canonical_dtype(config.dtype)
    sizes = sweep_sizes(config.min_bytes, config.max_bytes, config.factor)
    check_range("budget_ms", config.budget_ms, low=0, low_open=True, high=MAX_BUDGET_MS, unit="ms")
    if config.timeout_s is not None:
        check_range("timeout_s", config.timeout_s, low=0, low_open=True, high=MAX_TIMEOUT_S, high_open=True,
                    unit="s")
    min_iters = check_int("min_iters", config.min_iters, low=1)
    config = replace(config, warmup=check_int("warmup", config.warmup, low=0, high=MAX_WARMUP), min_iters=min_iters,
                     max_iters=check_int("max_iters", config.max_iters, low=min_iters))
    env = job_env()
    if env:
        world, local = env["world_size"], env["local_world_size"]
        check_local_ranks(local, oversubscribe=config.oversubscribe,
                          name="LOCAL_WORLD_SIZE" if env["launcher"] == "torchrun" else "SLURM tasks per node")
    else:
        world = local = check_local_ranks(config.nproc, oversubscribe=config.oversubscribe)
    for name in ops:
        check_sizes_hold_elements(name, sizes, dtype, world)
    choice = resolve_backend(config.backend, config.device, local)
    check_memory(sizes[-1], local, choice.device, local)
    timeout_s = config.timeout_s
    if timeout_s is None:
        timeout_s = min(60.0 + len(ops) * len(sizes) * (3 * config.budget_ms / 1e3 + 2.0), MAX_TIMEOUT_S / 2)
    return SweepPlan(config, ops, sizes, dtype, world, local, choice, timeout_s, env)


def run_sweep(config: SweepConfig | None = None, *, progress: bool = True, raise_on_wrong: bool = True,
              on_start=None, **settings) -> SweepResult:
    """Run the sweep `config` (SweepConfig's defaults, changed by `settings`, its field names:
    `run_sweep(nproc=2, max_bytes="4M", budget_ms=30)`).

    Runs on the kernel's local ranks (labutils.measure.pool.shared_pool), or, when torchrun set
    RANK/WORLD_SIZE/MASTER_* or srun SLURM_PROCID/NTASKS/LOCALID (launch.job_env), runs as this
    process's rank of that world; every rank runs `harness.sweep_worker`.
    meta["backend_reason"] says why the backend was chosen. Raises LabInputError on bad input
    (`plan_sweep`, before a rank starts), RankError naming the rank when one fails or hangs, and
    WrongResultError (after the whole sweep) when any element was wrong and `raise_on_wrong`.
    `on_start(choice)` is called once everything is checked, just before the ranks start.
    """
    plan = plan_sweep(replace(config or SweepConfig(), **settings))
    if on_start is not None:
        on_start(plan.choice)
    started = time.perf_counter()
    rows, places = _run_ranks(plan, progress)
    result = _sweep_result(plan, rows, wall_s=time.perf_counter() - started, places=places)
    if raise_on_wrong and result.wrong:
        bad = result.frame[result.frame["wrong"] > 0]
        where = ", ".join(f"{o} {format_size(s)}: {w}" for o, s, w in zip(bad["op"], bad["size_bytes"], bad["wrong"]))
        raise WrongResultError(f"{result.wrong} wrong element(s) in the results ({where}); "
                               "the measurement is not trustworthy", result)
    return result


def _run_ranks(plan: SweepPlan, progress: bool) -> tuple[list[dict], list[dict]]:
    """The rows of `sweep_worker` run in every rank (rank 0's copy) and every rank's place
    (launch.with_places), with a progress bar on rank 0."""
    choice, env = plan.choice, plan.torchrun
    is_main = env is None or env["rank"] == 0
    with rank_progress(len(plan.ops) * len(plan.sizes), f"{'+'.join(plan.ops)} sweep ({choice.backend}, "
                       f"{plan.world} ranks)", progress and is_main, unit="size") as report:
        if env:
            out = run_this_rank(with_places, args=(sweep_worker,), kwargs=plan.worker_kwargs(),
                                backend=choice.backend, device=choice.device, timeout_s=plan.timeout_s,
                                on_report=report, env=env)
        else:
            pool = shared_pool(plan.world, choice.backend, choice.device, oversubscribe=plan.config.oversubscribe)
            out = pool.run(with_places, args=(sweep_worker,), kwargs=plan.worker_kwargs(), timeout_s=plan.timeout_s,
                           on_report=report)[0]
    return out["result"], out["places"]


def _sweep_result(plan: SweepPlan, rows: list[dict], wall_s: float, places: list[dict] | None = None) -> SweepResult:
    """The rows as a frame (COLUMNS + SWEEP_EXTRA) and the metadata: where, how and with what settings."""
    c, choice, env = plan.config, plan.choice, plan.torchrun
    frame = pd.DataFrame(rows, columns=COLUMNS + SWEEP_EXTRA)
    job = {"slurm_job_id": env["job_id"]} if env and env.get("job_id") is not None else {}
    meta = sweep_meta(choice.backend, choice.device, plan.world, choice.reason, places=places, ops=list(plan.ops),
                      dtype=plan.dtype, min_bytes=plan.sizes[0], max_bytes=plan.sizes[-1], factor=c.factor,
                      warmup=c.warmup, budget_ms=c.budget_ms, min_iters=c.min_iters, max_iters=c.max_iters,
                      launcher=env["launcher"] if env else "spawn", local_world_size=plan.local, **job,
                      cpu_placement=machine_placement(plan.local).explanation, wall_s=round(wall_s, 3),
                      avg_busbw_GBps=float(frame["busbw_GBps"].mean()) if len(frame) else math.nan)
    return SweepResult(frame, meta)


def covers(frame: pd.DataFrame, min_bytes: float, max_bytes: float, slack: float = 2.0) -> bool:
    """Whether a sweep measured sizes from at most `slack` x `min_bytes` up to at least
    `max_bytes` / `slack`: close enough that reading the range off it extrapolates by no more than
    a factor `slack` at either end."""
    sizes = frame["size_bytes"]
    return bool(len(sizes)) and sizes.min() <= slack * min_bytes and sizes.max() * slack >= max_bytes


def ensure_sweep(min_bytes: float, max_bytes: float, nproc: int = 2, backend: str = "auto", device: str = "auto",
                 quick: bool = True, progress: bool = False) -> SweepResult:
    """An all_reduce sweep of this route over the range [min_bytes, max_bytes]: the newest saved one
    of this backend, device and rank count that `covers` it (notebook 02's), else a new sweep over
    that range (doubling sizes, 30 ms per size quick, 100 ms otherwise), saved."""
    choice = resolve_backend(backend, device, nproc)
    lo, hi = int(min(min_bytes, max_bytes)), int(max(min_bytes, max_bytes))
    found = load_sweep("all_reduce", nproc, choice.backend, choice.device)
    if found is not None and covers(found.frame, lo, hi):
        return found
    low = 1 << max(10, int(math.floor(math.log2(max(lo, 1)))))
    high = 1 << max(int(math.ceil(math.log2(max(hi, 1)))), int(math.log2(low)))
    result = run_sweep(nproc=nproc, backend=choice.backend, device=choice.device, min_bytes=low, max_bytes=high,
                       budget_ms=30 if quick else 100, progress=progress)
    save_sweep(result)
    return result



def ensure_link(nproc: int = 2, backend: str = "auto", device: str = "auto", quick: bool = True) -> LinkFit:
    """The newest saved link for this backend, device and `nproc`; else measure, fit, save it.

    Measuring runs an all_reduce sweep (1 KiB..4 MiB quick, ..64 MiB otherwise) on `nproc`
    local ranks, which takes seconds on a CPU and less on GPUs.
    """
    choice = resolve_backend(backend, device, nproc)
    found = load_link(nproc, choice.backend, choice.device)
    if found is not None:
        return found
    result = run_sweep(nproc=nproc, backend=choice.backend, device=choice.device, min_bytes="1K",
                       max_bytes="4M" if quick else "64M", budget_ms=30 if quick else 100, progress=False)
    fit = fit_alpha_beta(result.frame)
    save_link(fit)
    return fit

def compare_sweeps(frames: dict) -> pd.DataFrame:
    """busbw of two or more labelled sweeps side by side, by size, and first / others ratios."""
    labels = list(frames)
    table = None
    for label in labels:
        part = frames[label][["size_bytes", "busbw_GBps"]].rename(columns={"busbw_GBps": f"busbw_GBps {label}"})
        table = part if table is None else table.merge(part, on="size_bytes")
    for label in labels[1:]:
        table[f"ratio {labels[0]} / {label}"] = table[f"busbw_GBps {labels[0]}"] / table[f"busbw_GBps {label}"]
    return table


def compare_sentence(first: str, first_GBps: float, second: str, second_GBps: float, at: str = "") -> str:
    """One sentence comparing two busbw figures (GB/s), built from them: ratio = first / second.

    "first reached 2.30x the busbw of second (...)", or 0.43x when below; "the same busbw" when the
    ratio prints as 1.00 (one ratio, said once).
    `at` opens the sentence ("at 64 MiB").
    """
    ratio = first_GBps / second_GBps
    where = f"{at}, " if at else ""
    figures = f"({first_GBps:.3g} against {second_GBps:.3g} GB/s)"
    if f"{ratio:.2f}" == "1.00":
        return f"{where}{first} and {second} reached the same busbw {figures}"
    return f"{where}{first} reached {ratio:.2f}x the busbw of {second} {figures}"


def ceiling_sentence(label: str, peak_GBps: float, ceiling_GBps: float) -> str:
    """One sentence placing a sweep's peak busbw against the pinned host<->GPU copy (GB/s), from the
    numbers: share = peak / ceiling, "x% of it" below, "at the ceiling" when it prints as 100%, and
    above it a ceiling measured low (the copy ran once, while something else used the bus)."""
    share = peak_GBps / ceiling_GBps
    head = f"{label} peaks at {peak_GBps:.3g} GB/s busbw; the pinned host<->GPU copy ran at {ceiling_GBps:.3g} GB/s"
    if f"{share:.0%}" == "100%":
        return f"{head}: the sweep reached the ceiling"
    if share < 1:
        return f"{head}: the sweep reached {share:.0%} of that ceiling"
    return f"{head}: the sweep ran {share:.0%} of it, above a ceiling that was measured low (run the copy again)"


# --- command line ------------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="measure a collective over message sizes (nccl-tests style)",
                              description="Sweep a collective over message sizes and print the nccl-tests table. "
                                          "Under torchrun or srun, runs as the rank the environment names "
                                          "(rank 0 prints and saves).")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--nproc", type=int, default=2,
                   help="local ranks to spawn (ignored under torchrun and srun); at most 2 per core (8 on any machine)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow up to 16 ranks per core (they queue behind each other; times mean little)")
    p.add_argument("--op", default="all_reduce", choices=OPS)
    p.add_argument("--min-bytes", "-b", default="1K", help="smallest size, K/M/G are 1024-based (default 1K)")
    p.add_argument("--max-bytes", "-e", default="64M", help="largest size (default 64M)")
    p.add_argument("--factor", "-f", type=int, default=2, help="size multiplier between steps (default 2)")
    p.add_argument("--dtype", "-d", default="float32", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--warmup", "-w", type=int, default=5, help="untimed warm-up calls per size (default 5)")
    p.add_argument("--budget-ms", type=float, default=100.0, help="timed milliseconds per size (default 100)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before a stuck run is stopped")
    p.add_argument("--no-save", action="store_true", help="do not write a result file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV")
    p.set_defaults(func=_cli_sweep)


def _cli_sweep(args) -> int:
    env = job_env()
    is_main = env is None or env["rank"] == 0

    def announce(choice) -> None:
        if is_main:
            print(f"backend: {choice.backend} on {choice.device} ({choice.reason})", file=sys.stderr)

    try:
        config = SweepConfig(nproc=args.nproc, backend=args.backend, device=args.device, op=args.op,
                             min_bytes=args.min_bytes, max_bytes=args.max_bytes, factor=args.factor, dtype=args.dtype,
                             warmup=args.warmup, budget_ms=args.budget_ms, timeout_s=args.timeout,
                             oversubscribe=args.oversubscribe or None)
        result = run_sweep(config, progress=not args.no_progress, raise_on_wrong=False, on_start=announce)
    except RankError as exc:
        if is_main:
            print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    if not is_main:
        return 1 if result.wrong else 0
    print_rows(result.frame, result.meta, args.json, args.csv)
    if not args.no_save:
        print(f"saved: {save_sweep(result)}", file=sys.stderr)
    if result.wrong:
        print(f"error: {result.wrong} wrong element(s) in the results; see the #wrong column", file=sys.stderr)
        return 1
    return 0
