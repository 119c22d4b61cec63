"""Starting N ranks: spawned local processes (notebook, CLI) or one rank under torchrun.

The same worker runs either way. A worker is a plain function defined in `labutils`,
`worker(ctx: RankContext, *args, **kwargs) -> picklable result`, that calls torch.distributed
collectives; every rank must make the same calls in the same order.

`launch()` guarantees a bounded run: a rank that raises, crashes or hangs ends the whole run
with an error naming the rank, and no child process outlives it (also on Ctrl-C). On NCCL every
rank first makes one small all-reduce (`preflight_all_reduce`) that must finish within
`PREFLIGHT_TIMEOUT_S`: a link that hangs (NCCL's peer-to-peer path, on some machines) then costs
seconds, not the whole run's timeout.

The launching process (the notebook's kernel, the CLI) opens no CUDA context: it reads the GPUs'
names, free memory and NUMA nodes through NVML (`visible_gpus`), and each rank touches only its
own GPU (`init_rank`). A context would pin memory on every GPU in the kernel for as long as it
lives, and CUDA in the launcher is what a forked child cannot inherit.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import inspect
import multiprocessing as mp
import os
import queue as _queue
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from labutils.core.inputs import LabInputError, check_choice, check_int
from labutils.measure.placement import check_local_ranks, machine_placement, pin_rank, set_rank_threads
from labutils.readers.nvml import GpuFacts, nvml_facts

BACKENDS = ("auto", "gloo", "nccl")
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: longer is not a timeout (and overflows the rendezvous' timedelta)
DEVICES = ("auto", "cpu", "cuda")
PREFLIGHT_TIMEOUT_S = 30.0  # one 4-byte all-reduce; NCCL's first call (its connections) takes a few seconds


class RankError(RuntimeError):
    """A rank failed, died or hung; `rank` says which (None when several hung)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class RankContext:
    """What a worker knows about itself. `report(obj)` sends a progress message to the launcher."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    _channel: Any = field(default=None, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def report(self, payload) -> None:
        """Send `payload` to the launcher's `on_report(rank, payload)` (no-op without one)."""
        if self._channel is not None:
            self._channel(payload)


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    device: str
    reason: str


def cuda_device_count() -> int:
    """GPUs this process may use (torch asks NVML first; no CUDA context is made)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover - a broken driver counts as no GPU
        return 0


def visible_gpus() -> list[GpuFacts] | None:
    """NVML's facts for cuda:0, cuda:1, ... of this process, read without a CUDA context; None
    when NVML does not answer or CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance.

    NVML counts in PCI bus order; the ranks count so too (`init_rank` sets CUDA_DEVICE_ORDER=PCI_BUS_ID
    when unset), and CUDA_VISIBLE_DEVICES=2,0 makes cuda:0 NVML's GPU 2 (CUDA stops reading the
    list at the first index that does not exist).
    """
    facts, _ = nvml_facts()
    if not facts:
        return None
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return facts
    picked = []
    for item in (x.strip() for x in raw.split(",") if x.strip()):
        if not item.isdigit():
            return None
        if int(item) >= len(facts):
            break
        picked.append(facts[int(item)])
    return picked


def gpu_names(count: int) -> tuple[str, ...]:
    """The names of cuda:0 .. cuda:count-1 from NVML; where NVML does not answer, the device
    properties (they initialise CUDA in this process but make no context)."""
    gpus = visible_gpus()
    if gpus is not None and len(gpus) >= count:
        return tuple(g.name for g in gpus[:count])
    return tuple(torch.cuda.get_device_properties(i).name for i in range(count))


def gpu_numa_nodes(nproc: int, gpus: list[GpuFacts] | None = None) -> tuple[int, ...]:
    """The NUMA node of the GPU of each of `nproc` local ranks (rank r uses GPU r % count, as
    `rank_plan`), -1 where unknown; () without NVML's answer. `gpus` defaults to `visible_gpus()`."""
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus:
        return ()
    return tuple(gpus[r % len(gpus)].numa_node for r in range(nproc))


def resolve_backend(backend: str = "auto", device: str = "auto", nproc: int = 2,
                    gpu_count: int | None = None) -> BackendChoice:
    """Pick backend and device for `nproc` ranks, and say why (a pure function of its arguments
    once `gpu_count` is given; None reads torch.cuda).

    auto: NCCL with one rank per GPU when there are at least `nproc` GPUs; with fewer GPUs (but
    at least one) gloo on CUDA tensors, the ranks sharing the GPU(s): the compute runs on the GPU
    and every all-reduce crosses host memory (GPU -> host -> socket -> host -> GPU); without a
    GPU, or with device="cpu", gloo across CPU processes. NCCL needs CUDA tensors and one GPU per
    rank; gloo runs on CPU or (slowly) on CUDA tensors.
    """
    check_choice("backend", backend, BACKENDS)
    check_choice("device", device, DEVICES)
    nproc = check_int("nproc", nproc, low=1)
    gpus = cuda_device_count() if gpu_count is None else check_int("gpu_count", gpu_count, low=0)
    if backend == "auto":
        if device != "cpu" and gpus >= nproc:
            return BackendChoice("nccl", "cuda", f"{gpus} GPU(s) visible, {nproc} rank(s): NCCL, one GPU per rank")
        if device != "cpu" and gpus >= 1:
            return BackendChoice("gloo", "cuda", f"only {gpus} GPU(s) for {nproc} ranks: gloo on CUDA tensors, "
                                                 f"{ranks_per_gpu(nproc, gpus)} ranks sharing each GPU")
        if device == "cuda":
            raise LabInputError("device='cuda' but no CUDA GPU is visible")
        why = "no CUDA GPU visible" if gpus == 0 else "device='cpu' requested"
        return BackendChoice("gloo", "cpu", f"{why}: gloo across local CPU processes")
    if backend == "nccl":
        if device == "cpu":
            raise LabInputError("backend='nccl' needs device='cuda' (NCCL moves only GPU memory)")
        if gpus < nproc:
            raise LabInputError(f"nproc={nproc} is larger than the {gpus} GPU(s) visible; NCCL needs one GPU per rank")
        return BackendChoice("nccl", "cuda", "NCCL requested")
    if device == "auto":
        device = "cpu"
    if device == "cuda" and gpus == 0:
        raise LabInputError("device='cuda' but no CUDA GPU is visible")
    return BackendChoice("gloo", device, f"gloo requested on {device} tensors")


def ranks_per_gpu(nproc: int, gpu_count: int) -> int:
    """How many local ranks share the busiest GPU: ceil(nproc / gpu_count); 0 without GPUs."""
    return 0 if gpu_count <= 0 else -(-int(nproc) // int(gpu_count))


@dataclass(frozen=True)
class RankPlan:
    """How one rank joins the job: its backend, its device ("cpu" or "cuda:i"), the GPU it makes
    current (`cuda_index`, None on the CPU) and the extra arguments of `dist.barrier`."""

    backend: str
    device: str
    cuda_index: int | None
    barrier_kwargs: dict


def barrier_kwargs(backend: str, device: str) -> dict:
    """Extra arguments of `dist.barrier` for a rank on `device`: NCCL's `device_ids=[i]` for
    "cuda:i" (NCCL's barrier is an all-reduce on that GPU), none otherwise."""
    device = str(device)
    if backend == "nccl" and device.startswith("cuda:"):
        return {"device_ids": [int(device.split(":", 1)[1])]}
    return {}


def rank_plan(backend: str, device: str, local_rank: int, gpu_count: int) -> RankPlan:
    """The plan of local rank `local_rank` on a machine with `gpu_count` GPUs (a pure function).

    On CUDA every rank uses GPU `local_rank % gpu_count` (gloo: ranks may share a GPU). NCCL
    differs from gloo on CUDA in two things only: it needs one GPU per rank (local_rank <
    gpu_count), and its barrier names the GPU (`device_ids`).
    """
    check_choice("backend", backend, ("gloo", "nccl"))
    check_choice("device", device, ("cpu", "cuda"))
    local_rank = check_int("local_rank", local_rank, low=0)
    gpu_count = check_int("gpu_count", gpu_count, low=0)
    if device == "cpu":
        if backend == "nccl":
            raise LabInputError("backend='nccl' needs device='cuda' (NCCL moves only GPU memory)")
        return RankPlan(backend, "cpu", None, {})
    if gpu_count == 0:
        raise LabInputError("device='cuda' but no CUDA GPU is visible")
    if backend == "nccl" and local_rank >= gpu_count:
        raise LabInputError(f"local_rank={local_rank} has no GPU of its own ({gpu_count} visible); "
                            "NCCL needs one GPU per rank")
    index = local_rank % gpu_count
    return RankPlan(backend, f"cuda:{index}", index, barrier_kwargs(backend, f"cuda:{index}"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_threads(nproc: int) -> int:
    """Torch threads per rank for `nproc` local ranks on this machine: the placement plan's
    (labutils.measure.placement: one per physical core of the rank's own set, capped, headroom kept)."""
    return machine_placement(nproc).threads_per_rank


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass


def group_kwargs(plan: RankPlan) -> dict:
    """Extra arguments of `dist.init_process_group` for a rank: NCCL's `device_id` (the rank's
    GPU, so the group is bound to it and NCCL sets up its communicator there, at once) where the
    installed torch takes one (read from its signature); none for gloo or on the CPU."""
    if plan.backend != "nccl" or plan.cuda_index is None:
        return {}
    if "device_id" not in inspect.signature(dist.init_process_group).parameters:
        return {}
    return {"device_id": torch.device(f"cuda:{plan.cuda_index}")}


def init_rank(backend: str, device: str, rank: int, world_size: int, local_rank: int,
              timeout_s: float, channel=None) -> RankContext:
    """Join the process group described by MASTER_ADDR/MASTER_PORT (env://) and build the context.

    Only this rank's GPU is touched: cuda:`local_rank % count` is made current before the group
    exists (`rank_plan`), and NCCL's group is bound to it (`group_kwargs`).
    """
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # cuda:i is NVML's GPU i (visible_gpus)
    plan = rank_plan(backend, device, local_rank, cuda_device_count() if device == "cuda" else 0)
    if plan.cuda_index is not None:
        torch.cuda.set_device(plan.cuda_index)
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                            timeout=_dt.timedelta(seconds=timeout_s), **group_kwargs(plan))
    return RankContext(rank, world_size, local_rank, backend, plan.device, channel)


def preflight_all_reduce(ctx: RankContext, stage: Callable[[str], None]) -> None:
    """One all-reduce of the rank numbers, checked (sum N(N-1)/2), before the measurements.

    `stage("all_reduce")` tells the launcher this rank has reached the collective: a rank that
    never says so stalled before it; when every rank said so and none finished, the link hangs.
    Reading the sum waits for the GPU (NCCL's call returns before its kernel has run).
    """
    t = torch.tensor([float(ctx.rank)], device=ctx.device)
    stage("all_reduce")
    dist.all_reduce(t)
    got, want = float(t.item()), ctx.world_size * (ctx.world_size - 1) / 2
    if got != want:
        raise RuntimeError(f"preflight all-reduce of the rank numbers gave {got:g}, not {want:g}")


def preflight_for(backend: str, preflight) -> Callable | None:
    """The preflight ranks run: None (the default) = `preflight_all_reduce` on NCCL, none on gloo
    (its all-reduce over sockets does not hang the way a GPU link can); True / False force it on
    or off; a function `fn(ctx, stage)` of one's own replaces the all-reduce (a larger one, say), calling
    `stage("all_reduce")` as it enters its collective."""
    if preflight is None:
        return preflight_all_reduce if backend == "nccl" else None
    if preflight is True:
        return preflight_all_reduce
    if preflight is False:
        return None
    if callable(preflight):
        return preflight
    raise LabInputError(f"preflight={preflight!r} must be None, True, False or a function (ctx, stage)")


def _child(rank, nproc, port, backend, device, placement, deadline_unix, preflight, worker, args, kwargs, out_q,
           parent_pid):
    _die_with_parent()
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it first
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    try:
        set_rank_threads(placement)
        # Collectives give up at 80% of the time left, counted after start-up (slow on a busy
        # machine): the peers of a hung rank then report before the launcher's deadline.
        timeout_s = max(1.0, 0.8 * (deadline_unix - time.time()))

        def stage(name: str) -> None:
            out_q.put(("stage", rank, name))
        stage("joining")
        ctx = init_rank(backend, device, rank, nproc, rank, timeout_s,
                        channel=lambda payload: out_q.put(("report", rank, payload)))
        if preflight is not None:
            stage("preflight")
            preflight(ctx, stage)
            stage("ready")
        pin_rank(placement, rank)  # after init: see labutils.measure.placement on gloo's threads
        out_q.put(("result", rank, worker(ctx, *args, **kwargs)))
        status = 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        # Report before tearing the group down: peers then see a closed connection *after* this.
        out_q.put(("error", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        status = 1
    out_q.close()
    out_q.join_thread()
    if status:
        os._exit(status)
    if dist.is_initialized():
        dist.destroy_process_group()


def _stop_all(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # a failed start leaves some never started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2)


def launch(worker: Callable, nproc: int, *, args: tuple = (), kwargs: dict | None = None,
           backend: str = "gloo", device: str = "cpu", timeout_s: float = 300.0,
           threads_per_rank: int | None = None, like_ranks: int | None = None,
           on_report: Callable[[int, Any], None] | None = None, oversubscribe: bool | None = None,
           preflight=None, preflight_timeout_s: float = PREFLIGHT_TIMEOUT_S) -> list:
    """Run `worker(ctx, *args, **kwargs)` on `nproc` local ranks; return the results by rank.

    `nproc` is bounded by what the machine holds (`placement.check_local_ranks`: two ranks per
    core, at least 8; `oversubscribe=True` or LAB_OVERSUBSCRIBE=1 allows 16 per core), checked
    before any process starts.

    Ranks rendezvous on 127.0.0.1 at a free port. `timeout_s` bounds the whole run (and each
    collective). Raises RankError naming the rank that raised, crashed or hung; every child
    process is stopped before this function returns or raises, Ctrl-C included.

    CPU placement (labutils.measure.placement.machine_placement): every rank gets a set of cores of its
    own and one torch thread per core, `threads_per_rank` of them when given. `like_ranks=N`
    plans as for N ranks and runs the first `nproc` of them: a one-rank baseline then gets the
    same CPUs and threads as rank 0 of the N-rank run it is compared with. On CUDA a rank's cores
    come from its GPU's NUMA node when NVML or sysfs says which (`gpu_numa_nodes`).

    Preflight (`preflight_for`: on by default for NCCL, off for gloo): every rank makes one small
    all-reduce first; when it has not finished on every rank `preflight_timeout_s` after the
    last rank started joining the group (NCCL sets up its communicator there), the run stops
    with a RankError naming the rank(s) that stalled before it, or, when all were waiting in it,
    saying that the link hangs.
    """
    nproc = check_local_ranks(nproc, oversubscribe=oversubscribe)
    for name, value in (("timeout_s", timeout_s), ("preflight_timeout_s", preflight_timeout_s)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < MAX_TIMEOUT_S):
            raise LabInputError(f"{name}={value!r} is outside the allowed range (0, {MAX_TIMEOUT_S:g}) s")
    preflight = preflight_for(backend, preflight)
    plan_ranks = nproc if like_ranks is None else check_int("like_ranks", like_ranks, low=nproc)
    gpu_nodes = gpu_numa_nodes(plan_ranks) if device == "cuda" else ()
    placement = machine_placement(plan_ranks, threads_per_rank, gpu_nodes=gpu_nodes)
    deadline_unix = time.time() + timeout_s
    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, name=f"lab-rank{r}", daemon=True,
                         args=(r, nproc, port, backend, device, placement, deadline_unix, preflight, worker,
                               args, kwargs or {}, out_q, os.getpid()))
             for r in range(nproc)]
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    stages: dict[int, set[str]] = {r: set() for r in range(nproc)}
    deadline = time.monotonic() + timeout_s
    preflight_deadline = None  # set when the last rank starts joining the group (start-up is not timed)
    try:
        for p in procs:
            p.start()
        while len(results) < nproc:
            if (preflight is not None and preflight_deadline is not None and time.monotonic() > preflight_deadline
                    and not all("ready" in s for s in stages.values())):
                _collect_errors(out_q, errors, results, on_report, wait_s=0.2)
                raise (_blame(procs, results, errors, timeout_s) if errors
                       else _preflight_error(stages, preflight_timeout_s))
            try:
                kind, rank, payload = out_q.get(timeout=0.05)
            except _queue.Empty:
                died = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                if died or time.monotonic() > deadline:
                    _collect_errors(out_q, errors, results, on_report, wait_s=0.5)
                    raise _blame(procs, results, errors, timeout_s) from None
                continue
            if kind == "stage":
                stages[rank].add(payload)
                if preflight_deadline is None and all(stages.values()):
                    preflight_deadline = time.monotonic() + preflight_timeout_s
            elif kind == "report":
                if on_report is not None:
                    on_report(rank, payload)
            elif kind == "result":
                results[rank] = payload
            else:
                errors[rank] = payload
                _collect_errors(out_q, errors, results, on_report, wait_s=1.0)
                raise _blame(procs, results, errors, timeout_s)
        return [results[r] for r in range(nproc)]
    finally:
        _stop_all(procs)
        out_q.close()
        out_q.cancel_join_thread()


def _preflight_error(stages: dict[int, set[str]], timeout_s: float) -> RankError:
    """Name the rank(s) that stalled in the preflight: those that never reached its all-reduce
    (their peers waited in it for them); when every late rank was in it, the link hangs."""
    late = [r for r, s in sorted(stages.items()) if "ready" not in s]
    stalled = [r for r in late if "all_reduce" not in stages[r]]
    waiting = [r for r in late if r not in stalled]
    if stalled:
        where = {r: "before the preflight all-reduce" if "preflight" in stages[r] else "joining the process group"
                 for r in stalled}
        said = "; ".join(f"rank {r} stalled {w}" for r, w in where.items())
        peers = f" (rank(s) {', '.join(map(str, waiting))} waited in the all-reduce)" if waiting else ""
        return RankError(f"preflight did not finish within {timeout_s:g} s: {said}{peers}; all ranks were stopped",
                         rank=stalled[0] if len(stalled) == 1 else None)
    ranks = ", ".join(map(str, late))
    return RankError(f"preflight did not finish within {timeout_s:g} s: rank(s) {ranks} entered one small all-reduce "
                     "and it never completed, so the link between the GPUs hangs (on NCCL often its peer-to-peer "
                     "path: rerun with NCCL_P2P_DISABLE=1, and NCCL_DEBUG=INFO shows the path); all ranks were stopped",
                     rank=late[0] if len(late) == 1 else None)


def _collect_errors(out_q, errors: dict, results: dict, on_report, wait_s: float) -> None:
    """Gather the messages still in flight for up to `wait_s` seconds."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            kind, rank, payload = out_q.get(timeout=0.05)
        except _queue.Empty:
            continue
        if kind == "error":
            errors.setdefault(rank, payload)
        elif kind == "result":
            results[rank] = payload
        elif kind == "report" and on_report is not None:
            on_report(rank, payload)


_SECONDARY = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe")


def _is_secondary(text: str) -> bool:
    """An error that reports a peer's trouble (closed socket, time-out) rather than its own."""
    head = text.splitlines()[0].lower() if text else ""
    return any(word in head for word in _SECONDARY)


def _blame(procs, results: dict, errors: dict, timeout_s: float) -> RankError:
    """Name the rank that caused the failure, not the peers that noticed it.

    A rank that died without a message (crash, kill) comes first; then, when the first error is
    a peer's time-out, the ranks still running silently (they hung); else the first error.
    """
    silent_dead = [r for r, p in enumerate(procs)
                   if p.exitcode not in (None, 0) and r not in errors and r not in results]
    if silent_dead:
        r = silent_dead[0]
        also = f"; peers then failed: {sorted(errors)}" if errors else ""
        return RankError(f"rank {r} died with exit code {procs[r].exitcode}{also}", rank=r)
    silent_alive = [r for r, p in enumerate(procs) if p.is_alive() and r not in errors and r not in results]
    primary = [r for r, text in errors.items() if not _is_secondary(text)]
    first = primary[0] if primary else next(iter(errors), None)
    if silent_alive and not primary:
        ranks = ", ".join(map(str, silent_alive))
        return RankError(f"rank(s) {ranks} stopped responding (no result within {timeout_s:g} s); "
                         "all ranks were stopped", rank=silent_alive[0] if len(silent_alive) == 1 else None)
    if first is not None:
        return RankError(f"rank {first} failed: {errors[first]}", rank=first)
    missing = [r for r in range(len(procs)) if r not in results]
    return RankError(f"rank(s) {missing} did not finish within {timeout_s:g} s; all ranks were stopped",
                     rank=missing[0] if len(missing) == 1 else None)


def torchrun_env() -> dict | None:
    """The rank variables torchrun (or any env:// launcher) set, or None outside such a launch."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(k in os.environ for k in needed):
        return None
    world = _env_int("WORLD_SIZE", low=1)
    rank = _env_int("RANK", low=0, high=world - 1)
    local_world = _env_int("LOCAL_WORLD_SIZE", low=1, high=world, default=world)
    local_rank = _env_int("LOCAL_RANK", low=0, high=local_world - 1, default=rank if local_world == world else None)
    return {"rank": rank, "world_size": world, "local_rank": local_rank, "local_world_size": local_world}


def _env_int(name: str, low: int, high: int | None = None, default: int | None = None) -> int:
    """A whole-number environment variable in [low, high]; LabInputError naming it otherwise."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        if default is not None:
            return default
        raise LabInputError(f"{name} is unset; torchrun sets it with RANK and WORLD_SIZE")
    text = raw.strip()
    if not text.lstrip("-").isdigit() or len(text) > 9:
        raise LabInputError(f"{name}={raw!r} is not a whole number (set by torchrun or by hand)")
    return check_int(name, int(text), low=low, high=high)


def run_this_rank(worker: Callable, *, args: tuple = (), kwargs: dict | None = None,
                  backend: str = "gloo", device: str = "cpu", timeout_s: float = 300.0,
                  on_report: Callable[[int, Any], None] | None = None):
    """Under torchrun: join the job as the rank the environment names, run `worker`, return its result.

    Single node or several (`torchrun --nnodes 2 ...`); the rendezvous comes from env://. CPU
    placement as in `launch`, planned for LOCAL_WORLD_SIZE ranks, this one being LOCAL_RANK.
    """
    env = torchrun_env()
    if env is None:
        raise LabInputError("not launched by torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are unset")
    channel = (lambda payload: on_report(env["rank"], payload)) if on_report else None
    gpu_nodes = gpu_numa_nodes(env["local_world_size"]) if device == "cuda" else ()
    placement = machine_placement(env["local_world_size"], gpu_nodes=gpu_nodes)  # same plan on every local rank
    set_rank_threads(placement)
    ctx = init_rank(backend, device, env["rank"], env["world_size"], env["local_rank"], timeout_s, channel)
    pin_rank(placement, env["local_rank"])
    try:
        return worker(ctx, *args, **(kwargs or {}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def ping_worker(ctx: RankContext) -> dict:
    """Smallest real job: all-reduce the rank numbers; sum must be N(N-1)/2 on every rank."""
    t = torch.tensor([float(ctx.rank)], device=ctx.device)
    dist.all_reduce(t)
    ctx.report({"stage": "all_reduce done"})
    return {"rank": ctx.rank, "pid": os.getpid(), "sum": float(t.item()),
            "expected": ctx.world_size * (ctx.world_size - 1) / 2}


def free_memory_bytes(device: str, nproc: int) -> int:
    """Memory free for the buffers: MemAvailable on the CPU; on CUDA the smallest free memory of
    the GPUs `nproc` ranks use, read through NVML (no CUDA context in this process), else (no
    NVML) the smallest total memory from the device properties."""
    if device == "cuda":
        count = min(nproc, cuda_device_count())
        gpus = visible_gpus()
        free = [g.memory_free_bytes for g in (gpus or [])[:count]]
        if count and len(free) == count and None not in free:
            return min(free)
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
