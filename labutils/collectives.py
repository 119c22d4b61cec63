"""Collectives as nccl-tests measures them: algbw, busbw, a sweep over message sizes, a check.

Bandwidths (nccl-tests' doc/PERFORMANCE.md), GB/s = 1e9 bytes/s, time t in seconds:

    algbw = S / t
    busbw = algbw * factor,  factor = 2(N-1)/N  all_reduce
                                      (N-1)/N   all_gather, reduce_scatter
                                      1         broadcast

S is nccl-tests' "size": the whole buffer. For all_reduce and broadcast that is count * elem
bytes; for all_gather it is the gathered output (N * per-rank count * elem bytes) and for
reduce_scatter the input being reduced (likewise N * per-rank count). The "count" column of
all_gather and reduce_scatter is the per-rank count, as nccl-tests prints it.

The sweep (`run_sweep`) runs `sweep_worker` in every rank. Per size: warm-up calls (never
timed), a short probe from which rank 0 picks the iteration count that fills a time budget
and broadcasts it (every rank must make the same calls), the timed loop (CUDA events on GPU,
barrier + perf_counter on CPU, see labutils.timing), the mean time over ranks and the slowest
rank, and then a correctness check on freshly filled buffers: every element of the result is
compared with the exact expected value and mismatches are summed over ranks (`#wrong`).
The table nccl-tests prints is written (and read back) by labutils.nccl_tests.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labutils.launch import RankError, launch, resolve_backend, run_this_rank, torchrun_env
from labutils.placement import machine_placement
from labutils.progress import rank_progress
from labutils.units import format_size, parse_size
from labutils.validate import LabInputError, check_choice, check_int, check_range

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
REDOPS = {"all_reduce": "sum", "all_gather": "none", "reduce_scatter": "sum", "broadcast": "none"}
ROOTS = {"all_reduce": -1, "all_gather": -1, "reduce_scatter": -1, "broadcast": 0}

# canonical name -> (nccl-tests type name, bytes per element)
DTYPES = {"float32": ("float", 4), "float16": ("half", 2), "bfloat16": ("bfloat16", 2), "float64": ("double", 8),
          "int32": ("int32", 4), "int64": ("int64", 8), "int8": ("int8", 1), "uint8": ("uint8", 1)}
DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "fp32": "float32",
                 "fp16": "float16", "bf16": "bfloat16", "int": "int32", "char": "int8"}

# Row keys shared by the sweep and the nccl-tests parser (the --json/--csv columns).
COLUMNS = ["op", "size_bytes", "count", "dtype", "redop", "root", "time_us", "algbw_GBps", "busbw_GBps",
           "wrong", "world_size", "backend", "in_place"]
SWEEP_EXTRA = ["device", "time_max_us", "busbw_slowest_GBps", "iters", "warmup"]


# --- the arithmetic ----------------------------------------------------------------------------

def canonical_dtype(name: str) -> str:
    """'float' -> 'float32', 'half' -> 'float16', ...; LabInputError for an unknown type."""
    name = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    return check_choice("dtype", name, tuple(DTYPES))


def element_bytes(dtype: str) -> int:
    """Bytes per element: float32 4, bfloat16 and float16 2, float64 8, ... (aliases accepted)."""
    return DTYPES[canonical_dtype(dtype)][1]


def torch_dtype(name: str):
    """The torch dtype for a name of DTYPES or an alias ('half' -> torch.float16)."""
    import torch

    return getattr(torch, canonical_dtype(name))


def bus_factor(op: str, world_size):
    """busbw / algbw for `op` on N ranks: 2(N-1)/N all_reduce, (N-1)/N all_gather and
    reduce_scatter, 1 broadcast (nccl-tests). N=1 gives 0 for all but broadcast.

    For all_reduce, 2(N-1)/N is also the share of the buffer each rank sends (and receives) in a
    ring. A float for one N; numpy-vectorised over an array of N.
    """
    check_choice("op", op, OPS)
    if np.ndim(world_size) == 0:
        n = float(check_int("world_size", np.asarray(world_size).item(), low=1))
    else:
        check_range("world_size", world_size, low=1)
        n = np.asarray(world_size, dtype=float)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0 if np.ndim(n) == 0 else np.ones_like(n)


def bandwidths_GBps(op: str, size_bytes: float, time_us: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in decimal GB/s: algbw = size_bytes / time_us / 1e3; busbw = algbw * factor."""
    if not time_us > 0:
        return math.nan, math.nan
    algbw = size_bytes / time_us / 1e3
    return algbw, algbw * bus_factor(op, world_size)


@dataclass(frozen=True)
class Layout:
    """Buffers of one collective call. `size_bytes` and `count` follow nccl-tests' columns;
    `per_rank` is the element count each rank contributes (all_gather) or keeps (reduce_scatter)."""

    op: str
    dtype: str
    world_size: int
    count: int
    per_rank: int
    size_bytes: int


def layout(op: str, size_bytes: int, dtype: str, world_size: int) -> Layout | None:
    """The buffers nccl-tests uses for a requested size (rounded down to whole elements per rank).

    None when the size holds no element per rank (e.g. 4 bytes of float across 3 ranks).
    """
    elem = element_bytes(dtype)
    total = int(size_bytes) // elem
    if op in ("all_gather", "reduce_scatter"):
        per_rank = total // world_size
        if per_rank == 0:
            return None
        return Layout(op, dtype, world_size, per_rank, per_rank, per_rank * world_size * elem)
    if total == 0:
        return None
    return Layout(op, dtype, world_size, total, total, total * elem)


def sweep_sizes(min_bytes, max_bytes, factor: int = 2) -> list[int]:
    """min, min*f, min*f^2, ... <= max (nccl-tests' -b -e -f); sizes accept K/M/G (1024-based)."""
    lo = parse_size(min_bytes, "min_bytes")
    hi = parse_size(max_bytes, "max_bytes")
    factor = check_int("factor", factor, low=2)
    if lo < 1:
        raise LabInputError(f"min_bytes={lo} is outside the allowed range [1, inf) bytes")
    if lo > hi:
        raise LabInputError(f"min_bytes={format_size(lo)} is larger than max_bytes={format_size(hi)}")
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    return sizes


# --- what runs in every rank ---------------------------------------------------------------------

def fill(rank: int, count: int, dtype: str, device: str = "cpu", offset: int = 0):
    """Deterministic input of `rank`: element i holds (offset + i) % 8 + rank + 1.

    Small integers, so sums over up to 8 ranks (at most 7*8 + 36 = 92) are exact in every
    dtype here, bfloat16 and int8 included: the expected result is known exactly.
    """
    import torch

    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return (idx % 8 + rank + 1).to(torch_dtype(dtype))


def expected(lay: Layout, rank: int, device: str = "cpu"):
    """The exact result `rank` must hold after the collective on `fill`ed inputs."""
    import torch

    n, dtype = lay.world_size, lay.dtype
    if lay.op == "all_reduce":
        idx = torch.arange(lay.count, device=device, dtype=torch.int64)
        return (n * (idx % 8) + n * (n + 1) // 2).to(torch_dtype(dtype))
    if lay.op == "reduce_scatter":
        idx = torch.arange(rank * lay.per_rank, (rank + 1) * lay.per_rank, device=device, dtype=torch.int64)
        return (n * (idx % 8) + n * (n + 1) // 2).to(torch_dtype(dtype))
    if lay.op == "all_gather":
        return torch.cat([fill(r, lay.per_rank, dtype, device) for r in range(n)])
    return fill(ROOTS["broadcast"], lay.count, dtype, device)


def _buffers(lay: Layout, rank: int, device: str, filled: bool):
    """(input, output) tensors for one call; zeros when not `filled` (timing: sums stay finite)."""
    import torch

    make = (lambda c: fill(rank, c, lay.dtype, device)) if filled else \
        (lambda c: torch.zeros(c, dtype=torch_dtype(lay.dtype), device=device))
    if lay.op == "all_gather":
        return make(lay.per_rank), torch.empty(lay.per_rank * lay.world_size, dtype=torch_dtype(lay.dtype),
                                               device=device)
    if lay.op == "reduce_scatter":
        return make(lay.per_rank * lay.world_size), torch.empty(lay.per_rank, dtype=torch_dtype(lay.dtype),
                                                                device=device)
    buf = make(lay.count)
    return buf, buf  # all_reduce and broadcast work in place


def _call(lay: Layout, inp, out):
    """A zero-argument function making one collective call of `lay.op` on these buffers."""
    import torch.distributed as dist

    if lay.op == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if lay.op == "all_gather":  # torch >= 2.13 names it all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    if lay.op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp)
    return lambda: dist.broadcast(inp, src=ROOTS["broadcast"])


def warmup_iters(size_bytes: int, warmup: int) -> int:
    """Warm-up calls for a size: `warmup` up to 4 MiB, fewer (at least 1) above.

    A pure function of the size, so every rank agrees without asking.
    """
    if warmup <= 0:
        return 0
    return max(1, min(warmup, warmup * (4 << 20) // max(1, size_bytes)))


def agree_iters(probe_ms: float, budget_ms: float, min_iters: int, max_iters: int, device: str) -> int:
    """Rank 0 turns its probe time into an iteration count and broadcasts it to every rank."""
    import torch
    import torch.distributed as dist

    want = budget_ms / probe_ms if probe_ms > 0 else max_iters
    iters = torch.tensor([int(min(max_iters, max(min_iters, math.ceil(want))))], dtype=torch.int64, device=device)
    dist.broadcast(iters, src=0)
    return int(iters.item())


def count_wrong(lay: Layout, ctx, corrupt: bool = False) -> int:
    """Fill, run the collective once, compare with `expected`; mismatches summed over ranks.

    `corrupt` adds 1 to this rank's first (up to) 3 result elements before the comparison:
    the fault injection that shows a wrong result is counted and fails the run.
    """
    import torch
    import torch.distributed as dist

    inp, out = _buffers(lay, ctx.rank, ctx.device, filled=True)
    _call(lay, inp, out)()
    if corrupt:
        out.view(-1)[:3] += 1
    wrong = torch.tensor([int((out != expected(lay, ctx.rank, ctx.device)).sum().item())],
                         dtype=torch.int64, device=ctx.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


BLOCKS = 5  # timed blocks per size; the median block is kept


def measure(lay: Layout, ctx, warmup: int, budget_ms: float, min_iters: int, max_iters: int) -> dict:
    """Time one size: warm-up, probe, agreed iterations, timed blocks; mean and slowest rank.

    The agreed iterations run as up to BLOCKS back-to-back blocks, each timed between
    synchronised clocks; a rank's time per call is its median block (one block stretched by
    another program on a shared machine does not move it). `time_us` is the mean of that over
    ranks (nccl-tests' default), `time_max_us` the slowest rank.
    """
    import statistics

    from labutils.timing import across_ranks, time_loop

    inp, out = _buffers(lay, ctx.rank, ctx.device, filled=False)
    call = _call(lay, inp, out)
    for _ in range(warmup_iters(lay.size_bytes, warmup)):
        call()
    probe_ms = time_loop(call, 2, ctx.device)
    iters = agree_iters(probe_ms, budget_ms, min_iters, max_iters, ctx.device)
    blocks = min(BLOCKS, iters)
    per_block = math.ceil(iters / blocks)
    ms = statistics.median(time_loop(call, per_block, ctx.device) for _ in range(blocks))
    stats = across_ranks(ms, ctx.device)
    return {"time_us": stats.mean * 1e3, "time_max_us": stats.max * 1e3, "iters": blocks * per_block}


def _row(lay: Layout, timing: dict, wrong: int, ctx, warmup: int) -> dict:
    algbw, busbw = bandwidths_GBps(lay.op, lay.size_bytes, timing["time_us"], lay.world_size)
    _, slowest = bandwidths_GBps(lay.op, lay.size_bytes, timing["time_max_us"], lay.world_size)
    return {"op": lay.op, "size_bytes": lay.size_bytes, "count": lay.count, "dtype": lay.dtype,
            "redop": REDOPS[lay.op], "root": ROOTS[lay.op], "time_us": timing["time_us"],
            "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": wrong, "world_size": lay.world_size,
            "backend": ctx.backend, "in_place": lay.op in ("all_reduce", "broadcast"),
            "device": "cuda" if ctx.device.startswith("cuda") else "cpu", "time_max_us": timing["time_max_us"],
            "busbw_slowest_GBps": slowest, "iters": timing["iters"], "warmup": warmup_iters(lay.size_bytes, warmup)}


def warm_up_op(op: str, sizes, dtype: str, ctx, warmup: int) -> None:
    """Untimed calls at the largest then the smallest size before an op's sweep, as nccl-tests
    does: connections, buffers and code paths are set up before the first size is timed."""
    for size in (sizes[-1], sizes[0]):
        lay = layout(op, size, dtype, ctx.world_size)
        if lay is None:
            continue
        inp, out = _buffers(lay, ctx.rank, ctx.device, filled=False)
        call = _call(lay, inp, out)
        for _ in range(warmup_iters(size, warmup)):
            call()


def sweep_worker(ctx, ops, sizes, dtype="float32", warmup=5, budget_ms=100.0, min_iters=3, max_iters=1000,
                 check=True, fault_rank=-1, fault="none") -> list[dict]:
    """Run in every rank: for each op and size, measure then check; returns the rows (same on all ranks).

    `fault` on rank `fault_rank`: "corrupt" (wrong result elements), "hang" or "crash" (at the
    first size), to show that the run fails loudly and names the rank.
    """
    rows = []
    plan = [(op, s) for op in ops for s in sizes]
    for i, (op, size) in enumerate(plan):
        if size == sizes[0]:
            warm_up_op(op, sizes, dtype, ctx, warmup)
        lay = layout(op, size, dtype, ctx.world_size)
        if lay is not None:
            if ctx.rank == fault_rank and fault == "hang":
                time.sleep(3600)
            if ctx.rank == fault_rank and fault == "crash":
                os._exit(17)
            timing = measure(lay, ctx, warmup, budget_ms, min_iters, max_iters)
            wrong = count_wrong(lay, ctx, corrupt=(ctx.rank == fault_rank and fault == "corrupt")) if check else 0
            rows.append(_row(lay, timing, wrong, ctx, warmup))
        if ctx.rank == 0:
            ctx.report({"done": i + 1, "of": len(plan), "op": op, "size_bytes": size})
    return rows


def overhead_worker(ctx, sizes, budget_ms=100.0, rounds=3, warmup=5) -> list[dict]:
    """Run in every rank: the harness's `measure` against a bare `dist.all_reduce` loop, per size.

    Both run `rounds` times, alternating which goes first, with the same iteration count; each
    keeps its fastest round (as timeit does: noise from other work only ever adds time, so the
    minimum is the steadiest estimate of what each loop costs). Returns size_bytes, harness_us,
    bare_us (mean over ranks), iters.
    """
    import torch
    import torch.distributed as dist

    from labutils.timing import across_ranks, barrier

    rows = []
    for size in sizes:
        lay = layout("all_reduce", size, "float32", ctx.world_size)
        harness, bare, iters = [], [], 1
        buf = torch.zeros(lay.count, device=ctx.device)
        for r in range(rounds):
            for which in (("harness", "bare") if r % 2 == 0 else ("bare", "harness")):
                if which == "harness":
                    timing = measure(lay, ctx, warmup, budget_ms, 3, 1000)
                    harness.append(timing["time_us"])
                    iters = timing["iters"]
                    continue
                for _ in range(warmup_iters(size, warmup)):
                    dist.all_reduce(buf)
                barrier(ctx.device)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(buf)
                bare.append(across_ranks((time.perf_counter() - start) / iters * 1e6, ctx.device).mean)
        rows.append({"size_bytes": lay.size_bytes, "harness_us": min(harness), "bare_us": min(bare),
                     "iters": iters})
        if ctx.rank == 0:
            ctx.report({"done": len(rows), "of": len(sizes)})
    return rows


# --- launching a sweep ---------------------------------------------------------------------------

class WrongResultError(RuntimeError):
    """Some elements of a collective's result were wrong; `result` still holds the whole sweep."""

    def __init__(self, message: str, result: "SweepResult"):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: `frame` (one row per op and size, COLUMNS + SWEEP_EXTRA) and `meta`."""

    frame: pd.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def wrong(self) -> int:
        return int(self.frame["wrong"].fillna(0).sum()) if len(self.frame) else 0

    @property
    def avg_busbw_GBps(self) -> float:
        """nccl-tests' "Avg bus bandwidth": the plain mean of busbw over the rows."""
        return float(self.frame["busbw_GBps"].mean()) if len(self.frame) else math.nan

    @property
    def peak_busbw_GBps(self) -> float:
        return float(self.frame["busbw_GBps"].max()) if len(self.frame) else math.nan


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def topology_text() -> str | None:
    """`nvidia-smi topo -m` output when nvidia-smi is there and answers, else None."""
    from labutils.topology import run_nvidia_smi

    return run_nvidia_smi(timeout_s=10.0)[0]


def _versions() -> dict:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a torch built without NCCL
            nccl = None
    return {"torch_version": torch.__version__, "nccl_version": nccl}


def sweep_meta(backend: str, device: str, world_size: int, reason: str = "", **settings) -> dict:
    """Where and how a sweep ran: host, devices, versions, topology when known, UTC date, settings."""
    if device == "cuda":
        import torch

        count = max(1, torch.cuda.device_count())
        devices = [torch.cuda.get_device_name(r % count) for r in range(world_size)]
    else:
        devices = [f"cpu: {_cpu_name()}"] * world_size
    return {"host": socket.gethostname().split(".")[0], "devices": devices, "backend": backend, "device": device,
            "world_size": world_size, **_versions(), "topology": topology_text() if device == "cuda" else None,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "backend_reason": reason, "python": platform.python_version(), **settings}


def _free_bytes(device: str, nproc: int) -> int:
    """Memory free for the buffers: MemAvailable on the CPU, the smallest GPU's free memory on CUDA."""
    if device == "cuda":
        import torch

        return min(torch.cuda.mem_get_info(i)[0] for i in range(min(nproc, torch.cuda.device_count())))
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_memory(max_bytes: int, nproc: int, device: str, ranks_here: int) -> None:
    """LabInputError when the largest size cannot fit: each rank holds about 3 buffers of it
    (timed, checked, expected); on the CPU all local ranks share one memory, on CUDA the ranks
    that share a GPU share its memory."""
    from labutils.launch import cuda_device_count, ranks_per_gpu

    sharing = ranks_here if device == "cpu" else max(1, ranks_per_gpu(ranks_here, cuda_device_count()))
    need = 3 * max_bytes * sharing
    free = _free_bytes(device, nproc)
    if need > free:
        raise LabInputError(f"max_bytes={format_size(max_bytes)} needs about {format_size(need)} of {device} memory "
                            f"(3 buffers x {sharing} rank(s)) but only {format_size(free)} is free; lower --max-bytes")


def run_sweep(nproc: int = 2, backend: str = "auto", device: str = "auto", op="all_reduce", min_bytes="1K",
              max_bytes="64M", factor: int = 2, dtype: str = "float32", warmup: int = 5, budget_ms: float = 100.0,
              min_iters: int = 3, max_iters: int = 1000, check: bool = True, timeout_s: float | None = None,
              progress: bool = True, raise_on_wrong: bool = True, fault_rank: int = -1,
              fault: str = "none") -> SweepResult:
    """Sweep `op` (one name or several) over sizes min_bytes..max_bytes (x factor) on `nproc` ranks.

    Spawns local ranks (labutils.launch), or, when torchrun set RANK/WORLD_SIZE/MASTER_*, runs as
    this process's rank with WORLD_SIZE ranks. `backend="auto"` picks NCCL when there is a GPU per
    rank, else gloo on CPU; meta["backend_reason"] says why. `budget_ms` is the timed time per
    size the iteration count aims at (between min_iters and max_iters). Raises
    WrongResultError (after the whole sweep) when any element was wrong, RankError naming the rank
    when one fails or hangs, LabInputError on bad input.
    """
    ops = (op,) if isinstance(op, str) else tuple(op)
    for name in ops:
        check_choice("op", name, OPS)
    dtype = canonical_dtype(dtype)
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    warmup = check_int("warmup", warmup, low=0)
    check_range("budget_ms", budget_ms, low=0, low_open=True, unit="ms")
    min_iters = check_int("min_iters", min_iters, low=1)
    max_iters = check_int("max_iters", max_iters, low=min_iters)
    check_choice("fault", fault, ("none", "corrupt", "hang", "crash"))
    env = torchrun_env()
    world = env["world_size"] if env else check_int("nproc", nproc, low=1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if env else world
    choice = resolve_backend(backend, device, local)
    check_memory(sizes[-1], local, choice.device, local)
    if timeout_s is None:
        timeout_s = 60.0 + len(ops) * len(sizes) * (3 * budget_ms / 1e3 + 2.0)
    kwargs = dict(ops=ops, sizes=sizes, dtype=dtype, warmup=warmup, budget_ms=budget_ms, min_iters=min_iters,
                  max_iters=max_iters, check=check, fault_rank=fault_rank, fault=fault)
    is_main = env is None or env["rank"] == 0
    started = time.perf_counter()
    with rank_progress(len(ops) * len(sizes), f"{'+'.join(ops)} sweep ({choice.backend}, {world} ranks)",
                       progress and is_main, unit="size") as report:
        if env:
            rows = run_this_rank(sweep_worker, kwargs=kwargs, backend=choice.backend, device=choice.device,
                                 timeout_s=timeout_s, on_report=report)
        else:
            rows = launch(sweep_worker, world, kwargs=kwargs, backend=choice.backend, device=choice.device,
                          timeout_s=timeout_s, on_report=report)[0]
    frame = pd.DataFrame(rows, columns=COLUMNS + SWEEP_EXTRA)
    meta = sweep_meta(choice.backend, choice.device, world, choice.reason, ops=list(ops), dtype=dtype,
                      min_bytes=sizes[0], max_bytes=sizes[-1], factor=factor, warmup=warmup, budget_ms=budget_ms,
                      min_iters=min_iters, max_iters=max_iters, launcher="torchrun" if env else "spawn",
                      cpu_placement=machine_placement(local).explanation,
                      wall_s=round(time.perf_counter() - started, 3),
                      avg_busbw_GBps=float(frame["busbw_GBps"].mean()) if len(frame) else math.nan)
    result = SweepResult(frame, meta)
    if raise_on_wrong and result.wrong:
        bad = frame[frame["wrong"] > 0]
        where = ", ".join(f"{o} {format_size(s)}: {w}" for o, s, w in zip(bad["op"], bad["size_bytes"], bad["wrong"]))
        raise WrongResultError(f"{result.wrong} wrong element(s) in the results ({where}); "
                               "the measurement is not trustworthy", result)
    return result


def save_sweep(result: SweepResult):
    """Save a sweep as a result of kind "sweep" (CSV + JSON metadata, atomic, never overwriting)."""
    from labutils.results import save_result

    return save_result("sweep", result.frame, result.meta)


def load_sweep(op: str = "all_reduce", world_size: int | None = None, backend: str | None = None,
               device: str | None = None) -> SweepResult | None:
    """The newest saved sweep that measured `op` (and matches world size, backend and device
    ("cpu" or "cuda") when given)."""
    from labutils.results import list_results, load_result

    for path in reversed(list_results("sweep")):
        record, frame = load_result(path)
        meta = record.get("meta", {})
        if frame is None or op not in set(frame["op"]):
            continue
        wanted = {"world_size": world_size, "backend": backend, "device": device}
        if all(v is None or meta.get(k) == v for k, v in wanted.items()):
            return SweepResult(frame[frame["op"] == op].reset_index(drop=True), meta)
    return None


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


# --- command line ------------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="measure a collective over message sizes (nccl-tests style)",
                              description="Sweep a collective over message sizes and print the nccl-tests table. "
                                          "Under torchrun, runs as the rank the environment names (rank 0 prints).")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--nproc", type=int, default=2, help="local ranks to spawn (ignored under torchrun)")
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
    p.add_argument("--fault-rank", type=int, default=-1, help="(testing) rank that misbehaves")
    p.add_argument("--fault", default="none", choices=("none", "corrupt", "hang", "crash"),
                   help="(testing) how --fault-rank misbehaves")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV")
    p.set_defaults(func=_cli_sweep)


def _cli_sweep(args) -> int:
    env = torchrun_env()
    is_main = env is None or env["rank"] == 0
    choice = resolve_backend(args.backend, args.device, int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or args.nproc)
    if is_main:
        print(f"backend: {choice.backend} on {choice.device} ({choice.reason})", file=sys.stderr)
    try:
        result = run_sweep(nproc=args.nproc, backend=args.backend, device=args.device, op=args.op,
                           min_bytes=args.min_bytes, max_bytes=args.max_bytes, factor=args.factor, dtype=args.dtype,
                           warmup=args.warmup, budget_ms=args.budget_ms, timeout_s=args.timeout,
                           progress=not args.no_progress, raise_on_wrong=False, fault_rank=args.fault_rank,
                           fault=args.fault)
    except RankError as exc:
        if is_main:
            print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    if not is_main:
        return 1 if result.wrong else 0
    from labutils.nccl_tests import emit  # nccl_tests reads collectives' tables: import it here, not above

    emit(result.frame, result.meta, args.json, args.csv)
    if not args.no_save:
        print(f"saved: {save_sweep(result)}", file=sys.stderr)
    if result.wrong:
        print(f"error: {result.wrong} wrong element(s) in the results; see the #wrong column", file=sys.stderr)
        return 1
    return 0
