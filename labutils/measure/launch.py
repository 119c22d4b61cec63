"""The rank side of a job: backend and device, each rank's plan, joining the group, the preflight,
and one rank under torchrun. Spawned local ranks are started by labutils.measure.pool (`launch`,
`RankPool`, `shared_pool`), which runs these pieces in every rank.

The same worker runs either way. A worker is a plain function defined in `labutils`,
`worker(ctx: RankContext, *args, **kwargs) -> picklable result`, that calls torch.distributed
collectives; every rank must make the same calls in the same order.

`pool.launch()` and `RankPool.run()` guarantee a bounded run: a rank that raises, crashes or hangs ends the whole run
with an error naming the rank, and no child process outlives it (also on Ctrl-C). On NCCL every
rank first makes one small all-reduce (`preflight_all_reduce`) that must finish within
`PREFLIGHT_TIMEOUT_S`: a link that hangs (NCCL's peer-to-peer path, on some machines) then costs
seconds, not the whole run's timeout.

A job launched from outside (torchrun, or srun without torchrun: labutils.measure.slurm) runs one
rank per process (`run_this_rank`): it meets its peers at MASTER_ADDR:MASTER_PORT within
`RENDEZVOUS_TIMEOUT_S` (an address that does not resolve is refused at once, a peer that never comes
ends the wait in one line), then runs the collectives under the job's own timeout.

The launching process (the notebook's kernel, the CLI) opens no CUDA context: it reads the GPUs'
names, free memory and NUMA nodes through NVML (`visible_gpus`), and each rank touches only its
own GPU (`init_rank`). A context would pin memory on every GPU in the kernel for as long as it
lives, and CUDA in the launcher is what a forked child cannot inherit.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import platform
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from labutils.core.inputs import LabInputError, check_choice, check_int
from labutils.measure.placement import machine_placement, pin_rank, set_rank_threads
from labutils.readers.nvml import GpuFacts, nvml_facts

BACKENDS = ("auto", "gloo", "nccl")
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: longer is not a timeout (and overflows the rendezvous' timedelta)
DEVICES = ("auto", "cpu", "cuda")
PREFLIGHT_TIMEOUT_S = 30.0  # one 4-byte all-reduce; NCCL's first call (its connections) takes a few seconds
RENDEZVOUS_TIMEOUT_S = 60.0  # every rank of a launched job at MASTER_ADDR:MASTER_PORT: srun and torchrun start
# their processes within seconds of each other; importing torch from a shared file system takes tens of them
RESOLVE_TIMEOUT_S = 10.0  # looking MASTER_ADDR up (a name server that does not answer must not hang the job)


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
            where = "sharing each GPU" if nproc % gpus == 0 else "on the busiest GPU"  # 6 ranks on 4 GPUs: 2, 2, 1, 1
            return BackendChoice("gloo", "cuda", f"only {gpus} GPU(s) for {nproc} ranks: gloo on CUDA tensors, "
                                                 f"{ranks_per_gpu(nproc, gpus)} ranks {where}")
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
              timeout_s: float, channel=None, store=None) -> RankContext:
    """Join the process group described by MASTER_ADDR/MASTER_PORT (env://), or met already in
    `store` (`rendezvous_store`), and build the context.

    Only this rank's GPU is touched: cuda:`local_rank % count` is made current before the group
    exists (`rank_plan`), and NCCL's group is bound to it (`group_kwargs`).
    """
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # cuda:i is NVML's GPU i (visible_gpus)
    plan = rank_plan(backend, device, local_rank, cuda_device_count() if device == "cuda" else 0)
    if plan.cuda_index is not None:
        torch.cuda.set_device(plan.cuda_index)
    meet = {"init_method": "env://"} if store is None else {"store": store}
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                            timeout=_dt.timedelta(seconds=timeout_s), **meet, **group_kwargs(plan))
    return RankContext(rank, world_size, local_rank, backend, plan.device, channel)


def check_master_addr(addr: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> str:
    """`addr` when it resolves to an address within `timeout_s`; LabInputError naming MASTER_ADDR
    otherwise (the rendezvous would retry an unknown name until its timeout)."""
    found: list = []

    def look_up() -> None:
        try:
            found.append(socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:
            found.append(exc)
    worker = threading.Thread(target=look_up, daemon=True)  # getaddrinfo cannot be interrupted
    worker.start()
    worker.join(timeout_s)
    if not found:
        raise LabInputError(f"MASTER_ADDR={addr!r} did not resolve within {timeout_s:g} s (no answer from the "
                            "name server); give the first node's name or IP address")
    if isinstance(found[0], Exception):
        why = getattr(found[0], "strerror", None) or str(found[0])
        raise LabInputError(f"MASTER_ADDR={addr!r} does not resolve to an address ({why}); give the first node's "
                            "name or IP address")
    return addr


def rendezvous_store(rank: int, world_size: int, timeout_s: float = RENDEZVOUS_TIMEOUT_S):
    """The store every rank of a launched job meets in: env://'s own (MASTER_ADDR/MASTER_PORT; rank 0
    serves it, or torchrun's agent), joined within `timeout_s` whatever the collectives' timeout.

    LabInputError in one line when the ranks have not all met by then: a port nobody serves, a host
    that does not answer, or peers that never started (a job run outside srun, say).
    """
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size,
                                           timeout=_dt.timedelta(seconds=timeout_s)))
    except (RuntimeError, ValueError, OSError) as exc:  # torch's DistStoreError / DistNetworkError are RuntimeErrors
        why = " ".join(str(exc).split())[:160]
        hint = ("; outside srun (SLURM_STEP_ID unset) the other tasks never start: launch it with srun"
                if "SLURM_PROCID" in os.environ and not os.environ.get("SLURM_STEP_ID") else "")
        raise LabInputError(f"rank {rank} of {world_size} did not meet the others at MASTER_ADDR={addr} "
                            f"MASTER_PORT={port} within the rendezvous timeout of {timeout_s:g} s ({why}){hint}"
                            ) from None
    return store


_solo = False  # True while a rank pool runs a task on rank 0 alone (labutils.measure.pool, ranks=1)


def group_size() -> int:
    """The ranks taking part in this rank's current work: 1 without a process group or during a
    solo task (`solo()`: rank 0 of an N-rank group working alone), else the group's size. Every
    collective helper (labutils.measure.timing and the workers) asks this, so a solo task never
    calls into the N-rank group."""
    if _solo or not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


@contextmanager
def solo():
    """Within: this rank works alone (`group_size()` is 1), whatever the size of its process group."""
    global _solo
    before, _solo = _solo, True
    try:
        yield
    finally:
        _solo = before


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


def torchrun_env() -> dict | None:
    """The rank variables torchrun (or any env:// launcher) set, or None outside such a launch;
    MASTER_PORT checked ([1, 65535]) and GROUP_RANK (torchrun's node rank) read when set."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(k in os.environ for k in needed):
        return None
    world = _env_int("WORLD_SIZE", low=1)
    rank = _env_int("RANK", low=0, high=world - 1)
    local_world = _env_int("LOCAL_WORLD_SIZE", low=1, high=world, default=world)
    local_rank = _env_int("LOCAL_RANK", low=0, high=local_world - 1, default=rank if local_world == world else None)
    node = _env_int("GROUP_RANK", low=0, default=0) if os.environ.get("GROUP_RANK", "").strip() else 0
    addr = os.environ["MASTER_ADDR"].strip()
    if not addr:
        raise LabInputError("MASTER_ADDR is empty; give the host of rank 0 (torchrun's --master-addr)")
    return {"rank": rank, "world_size": world, "local_rank": local_rank, "local_world_size": local_world,
            "node_rank": node, "nodes": max(1, -(-world // local_world)), "master_addr": addr,
            "master_port": _env_int("MASTER_PORT", low=1, high=65535), "launcher": "torchrun"}


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
                  on_report: Callable[[int, Any], None] | None = None,
                  rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S, env: dict | None = None):
    """Under torchrun or srun: join the job as the rank `env` names (torchrun's variables when None;
    labutils.measure.sweep.job_env reads srun's too), run `worker`, return its result.

    Single node or several (`torchrun --nnodes 2 ...`, `srun -N 2 --ntasks-per-node 4 ...`). The
    ranks meet at MASTER_ADDR:MASTER_PORT (under srun without them: the first node and the job's
    port, exported here for env://) within `rendezvous_timeout_s`, the collectives then get
    `timeout_s`. The local rank picks the GPU; CPU placement as in `launch`, planned for the local
    world, this one being its local rank.
    """
    env = torchrun_env() if env is None else env
    if env is None:
        raise LabInputError("not launched by torchrun or srun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                            "(or SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID) are unset")
    os.environ.update(MASTER_ADDR=check_master_addr(env["master_addr"]), MASTER_PORT=str(env["master_port"]))
    channel = (lambda payload: on_report(env["rank"], payload)) if on_report else None
    gpu_nodes = gpu_numa_nodes(env["local_world_size"]) if device == "cuda" else ()
    placement = machine_placement(env["local_world_size"], gpu_nodes=gpu_nodes)  # same plan on every local rank
    set_rank_threads(placement)
    store = rendezvous_store(env["rank"], env["world_size"], min(rendezvous_timeout_s, timeout_s))
    store.set_timeout(_dt.timedelta(seconds=timeout_s))  # met: from here on the job's own timeout
    ctx = init_rank(backend, device, env["rank"], env["world_size"], env["local_rank"], timeout_s, channel, store)
    pin_rank(placement, env["local_rank"])
    try:
        return worker(ctx, *args, **(kwargs or {}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_place(ctx: RankContext) -> dict:
    """Where this rank runs: host (short name), node index (SLURM_NODEID, torchrun's GROUP_RANK, else
    0), local rank and its device's name (the GPU's own, read in the rank; the CPU's on the CPU)."""
    node = next((os.environ[k] for k in ("SLURM_NODEID", "GROUP_RANK") if os.environ.get(k, "").strip().isdigit()),
                "0")
    name = torch.cuda.get_device_name(ctx.device) if str(ctx.device).startswith("cuda") else f"cpu: {cpu_name()}"
    return {"rank": ctx.rank, "host": socket.gethostname().split(".")[0], "node": int(node),
            "local_rank": ctx.local_rank, "device_name": name}


def with_places(ctx: RankContext, worker: Callable, *args, **kwargs) -> dict:
    """Run `worker(ctx, *args, **kwargs)` after gathering every rank's `rank_place`:
    {"result": the worker's result, "places": [rank_place of rank 0, 1, ...]} (one all_gather_object
    before the worker, so that the result names each rank's host and device, across nodes too)."""
    places = [rank_place(ctx)]
    if group_size() > 1:
        places = [None] * ctx.world_size
        dist.all_gather_object(places, rank_place(ctx))
    return {"result": worker(ctx, *args, **kwargs), "places": places}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
