"""Where each rank runs on the CPU: a set of cores of its own, and one torch thread per core.

`plan_placement(layout, nranks)` is a pure function of the machine's layout (its logical CPUs,
their physical cores and NUMA nodes: `cpu_layout`, read from /sys at the end of this module) and the number of local
ranks; the launcher applies the plan in every rank (`set_rank_threads`, then `pin_rank` once the
process group is up). The rules, in order:

1. **Physical cores are the unit.** SMT siblings (Hyper-Threading) stay together and go to one
   rank; a rank runs one intra-op thread per physical core it gets, and its CPU set holds all
   their logical CPUs (so with SMT the set is twice the thread count, never smaller than it).
2. **Usable cores** are the physical cores of the CPUs this process may run on (its affinity
   mask), at most the cgroup CPU quota (rounded down, at least 1).
3. **Fewer usable cores than ranks:** the ranks cannot have a core each, so nothing is pinned
   and every rank runs 1 thread; the explanation says so.
4. **Headroom:** with 8 or more usable cores, `RESERVE_CORES` (1) core goes to no rank: gloo's
   I/O threads, the launcher and the notebook kernel run there instead of on a rank's cores.
   It is never kept at the cost of a rank without a core; `reserve_cores` overrides it.
5. **Threads per rank** = (usable - reserve) // ranks, capped at `MAX_THREADS_PER_RANK` (8).
   The lab's CPU layers are small (hidden <= 1024, 09 and 10's models): an elementwise op is
   split over threads only above torch's grain of 32768 elements, and the largest matmul, a
   (64 x 1024) @ (1024 x 4096) of 0.54 GFLOP, took 6 ms on one core of the 2-core test machine
   (89 GFLOP/s): under a millisecond on 8 cores even at perfect scaling, where fork/join and
   memory traffic weigh as much as the arithmetic. 8 is also one L3 slice (core complex) of
   current AMD EPYC parts, so a rank's threads share one cache. Beyond that extra threads add
   jitter rather than speed, so a 96-core machine still runs 2 ranks of 8 threads. Asking for a
   count (`threads_per_rank`, or `LAB_THREADS_PER_RANK` for the launcher) replaces the default
   and the cap; it is used when it fits (the headroom gives way first), else the most that fits,
   and the explanation says so.
6. **NUMA: the GPU's node, then packed.** A rank whose GPU's NUMA node is known (`gpu_nodes`:
   NVML's, else sysfs; the launcher reads it) takes its cores from that node while it has room;
   the other ranks, in order, take theirs from the lowest NUMA node that still has enough free
   cores; a rank spans two nodes only when no node has room. Packed, not
   round-robin: in this lab the ranks' link is host memory (gloo over TCP on the loopback
   interface, through host memory), which stays inside one socket's cache and memory controller when the ranks do, and
   rank 0, whose set the one-rank baseline also gets, sits in the same place in every run.
7. **`pin=False`** (`LAB_PIN_CPU=0`): the same thread count, no affinity; every rank may run on
   every CPU.

GPU ranks are placed the same way (their host-side work, gloo's staging copies and reductions
included, runs on these cores), on their GPU's node (rule 6): on a two-socket machine with GPUs
on both sockets a rank's kernel launches, host copies and NCCL's proxy thread then stay on the
socket its GPU's PCIe root sits on, instead of crossing the socket link. With the node unknown
(-1: one-node machines, a driver that does not say) the plan is the packed one.

Why pin at all: unpinned ranks migrate between cores and queue behind each other; on a 2-core
VM pinning cut gloo's small-message time from about 1.5 ms to 0.35 ms, and its jitter with it.
Every job is placed the same way, so the link a sweep measures is the link a split layer or a
training step later meets.

Why the launcher does not pin the whole process to the rank's set: the threads alive when the
group is up are torch.distributed's (gloo's `pt_gloo_runloop` workers run a collective's
reduction, `gloo_tcp_loop` its socket I/O; rank 0 also serves the TCP store), and a collective
hands work between them and the rank's own thread. Squeezed onto the rank's one core they take
turns: on a 2-core machine a 1 KiB gloo all-reduce between 2 ranks took 1.2 ms (fastest of 6
rounds) with each rank's gloo threads on its own core, against 0.37 ms with them free to run on
either core. Left free on a big machine, they land on other ranks' cores. So the calling thread,
which computes (and whose OpenMP workers, started later, inherit its mask), gets the rank's
CPUs; the threads already running get the rank's CPUs plus the spare ones (rule 4), and every
CPU of the process when that would still be a single CPU (a one-core rank, no spare core).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import torch

from labutils.core.inputs import LabInputError, check_int, check_range

MAX_THREADS_PER_RANK = 8
RESERVE_CORES = 1
RESERVE_FROM_CORES = 8  # headroom is kept from this many usable cores up
# How many local ranks a machine holds (`max_local_ranks`): every rank is a process with its own
# torch (~300 MB) and gloo threads, so beyond two per core they only queue behind each other;
# any machine holds 8 (notebook 04's 4 ranks and a 5-rank test run on 2 cores). Asking to
# oversubscribe (--oversubscribe, LAB_OVERSUBSCRIBE=1) lifts the bound to 16 per core.
RANKS_PER_CORE = 2
MIN_RANK_LIMIT = 8
OVERSUBSCRIBED_RANKS_PER_CORE = 16


@dataclass(frozen=True)
class Placement:
    """Where `len(rank_cpus)` local ranks run. `rank_cpus[r]`: the logical CPUs rank r may use
    (every allowed CPU when not pinned); `rank_nodes[r]`: the NUMA node(s) they lie in;
    `threads_per_rank`: torch intra-op threads of every rank (<= each set's size);
    `spare_cpus`: allowed CPUs no rank got (headroom); `explanation`: one line for people."""

    threads_per_rank: int
    rank_cpus: tuple[tuple[int, ...], ...]
    rank_nodes: tuple[tuple[int, ...], ...]
    spare_cpus: tuple[int, ...]
    pinned: bool
    explanation: str

    @property
    def nranks(self) -> int:
        return len(self.rank_cpus)

    def cpus_for(self, local_rank: int) -> set[int]:
        """The CPU set of local rank `local_rank`."""
        local_rank = check_int("local_rank", local_rank, low=0, high=self.nranks - 1)
        return set(self.rank_cpus[local_rank])


def _cores(layout) -> list[tuple[int, int, tuple[int, ...]]]:
    """(node, core, logical CPUs) per physical core of `layout.logical`, by node then core."""
    by_core: dict[int, list] = {}
    for c in layout.logical:
        by_core.setdefault(c.core, []).append(c)
    cores = [(min(c.node for c in cpus), core, tuple(sorted(c.cpu for c in cpus))) for core, cpus in by_core.items()]
    return sorted(cores)


def _check_layout(layout) -> list[tuple[int, int, tuple[int, ...]]]:
    """The physical cores of `layout` (`_cores`), or LabInputError when it is not a CPU layout
    (None, a number: give `cpu_layout()`) or lists no CPU this process may use."""
    logical = getattr(layout, "logical", None)
    if not isinstance(logical, (list, tuple)) or not all(isinstance(c, LogicalCpu) for c in logical):
        raise LabInputError(f"layout={layout!r:.60} is not a CPU layout: give cpu_layout() (a CpuLayout)")
    quota = getattr(layout, "quota_cpus", None)
    if quota is not None:
        check_range("layout.quota_cpus", quota, low=0, low_open=True, high=math.inf, high_open=True, unit="CPUs")
    cores = _cores(layout)
    if not cores:
        raise LabInputError("the CPU layout lists no CPU this process may use")
    return cores


def usable_cores(layout) -> int:
    """Physical cores this process may use: those of its affinity mask, at most the cgroup quota
    (rounded down, at least 1); rule 2 of the module docstring."""
    cores = len(_cores(layout))
    quota = getattr(layout, "quota_cpus", None)
    return min(cores, max(1, int(quota))) if quota else cores


def max_local_ranks(cores: int, oversubscribe: bool = False) -> int:
    """Local ranks a machine with `cores` usable cores holds: max(MIN_RANK_LIMIT, RANKS_PER_CORE x
    cores), OVERSUBSCRIBED_RANKS_PER_CORE x cores when asked to oversubscribe (2 cores: 8 or 32;
    16 cores: 32 or 256; 96 cores: 192 or 1536). A pure function."""
    cores = check_int("cores", cores, low=1)
    per_core = OVERSUBSCRIBED_RANKS_PER_CORE if oversubscribe else RANKS_PER_CORE
    return max(MIN_RANK_LIMIT, per_core * cores)


def _env_oversubscribe() -> bool:
    return os.environ.get("LAB_OVERSUBSCRIBE", "").strip().lower() in ("1", "true", "yes")


def check_local_ranks(nproc, layout=None, oversubscribe: bool | None = None, name: str = "nproc") -> int:
    """`nproc` as an int when this machine (`layout`, default `cpu_layout()`) holds that many local
    ranks (`max_local_ranks`); else LabInputError naming `name`, the limit and the way round it.
    `oversubscribe` None reads LAB_OVERSUBSCRIBE=1."""
    nproc = check_int(name, nproc, low=1)
    if oversubscribe is None:
        oversubscribe = _env_oversubscribe()
    cores = usable_cores(layout or cpu_layout())
    limit = max_local_ranks(cores, oversubscribe)
    if nproc > limit:
        more = ("" if oversubscribe else
                f"; --oversubscribe (LAB_OVERSUBSCRIBE=1) allows up to {max_local_ranks(cores, True)}")
        raise LabInputError(f"{name}={nproc} is outside the allowed range [1, {limit}]: this machine has "
                            f"{cores} usable core(s), and every local rank is a process{more}")
    return nproc


def _assign(cores, nranks: int, threads: int,
            gpu_nodes: tuple[int, ...] = ()) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """Each rank takes `threads` cores: from its GPU's node `gpu_nodes[r]` when that node is known
    and has room (these ranks choose first), else packed first fit from the lowest node with room."""
    free: dict[int, list] = {}
    for core in cores:
        free.setdefault(core[0], []).append(core)
    wanted = [gpu_nodes[r] if r < len(gpu_nodes) else -1 for r in range(nranks)]
    order = sorted(range(nranks), key=lambda r: wanted[r] not in free)  # stable: ranks in order within each
    ranks: list = [None] * nranks
    for r in order:
        node = wanted[r] if len(free.get(wanted[r], ())) >= threads else None
        if node is None:
            node = next((n for n in sorted(free) if len(free[n]) >= threads), None)
        if node is not None:
            taken, free[node] = free[node][:threads], free[node][threads:]
        else:  # no node has room: fill from the fullest nodes, spanning as few as possible
            taken = []
            for n in sorted(free, key=lambda n: (-len(free[n]), n)):
                need = threads - len(taken)
                taken, free[n] = taken + free[n][:need], free[n][need:]
        ranks[r] = taken
    return ranks


def _short(ranks: list[str], keep: int = 4) -> str:
    return ", ".join(ranks if len(ranks) <= keep else ranks[:keep - 1] + ["...", ranks[-1]])


def plan_placement(layout, nranks: int, threads_per_rank: int | None = None, reserve_cores: int | None = None,
                   max_threads: int = MAX_THREADS_PER_RANK, pin: bool = True,
                   gpu_nodes: tuple[int, ...] | None = None) -> Placement:
    """Plan CPU sets and thread counts for `nranks` local ranks on `layout` (see the module's
    rules). `layout` needs `.logical` (LogicalCpu: cpu, core, node) and `.quota_cpus`.
    gpu_nodes: the NUMA node of rank r's GPU at [r], -1 unknown (rule 6); None or () = none known.

    threads_per_rank: None = planned (capped at `max_threads`); a number = asked for.
    reserve_cores: cores kept for no rank; None = 1 from 8 usable cores up, else 0.
    """
    cores = _check_layout(layout)
    usable = usable_cores(layout)
    # no more ranks than an oversubscribed machine holds: a plan lists every rank's CPUs
    nranks = check_int("nranks", nranks, low=1, high=max_local_ranks(usable, oversubscribe=True))
    max_threads = check_int("max_threads", max_threads, low=1)
    if threads_per_rank is not None:
        threads_per_rank = check_int("threads_per_rank", threads_per_rank, low=1)
    if reserve_cores is not None:  # kept only beside a core for every rank: more is refused, not dropped
        reserve_cores = check_int("reserve_cores", reserve_cores, low=0, high=max(0, usable - nranks))
    if gpu_nodes is not None and not isinstance(gpu_nodes, (list, tuple)):
        raise LabInputError(f"gpu_nodes={gpu_nodes!r:.60} must be a tuple of NUMA nodes, one per rank (-1: unknown)")
    gpu_nodes = tuple(check_int(f"gpu_nodes[{r}]", n, low=-1) for r, n in enumerate(gpu_nodes or ()))
    every = tuple(sorted(c for _, _, cpus in cores for c in cpus))
    quota = getattr(layout, "quota_cpus", None)
    smt = len(every) > len(cores)
    where = (f"{usable} usable core(s)" + (f" (cgroup quota {quota:g} CPUs)" if quota and usable < len(cores) else "")
             + (", SMT siblings kept together" if smt else ""))
    if usable < nranks:
        return Placement(1, (every,) * nranks, (tuple(sorted({n for n, _, _ in cores})),) * nranks, (), False,
                         f"{nranks} ranks on {where}: fewer cores than ranks, so ranks share cores; "
                         f"not pinned, 1 thread each")
    reserve = RESERVE_CORES if usable >= RESERVE_FROM_CORES else 0
    reserve = reserve if reserve_cores is None else reserve_cores
    if usable - reserve < nranks:
        reserve = 0  # headroom never costs a rank its core
    notes = []
    if threads_per_rank is None:
        threads = min(max_threads, (usable - reserve) // nranks)
        if (usable - reserve) // nranks > max_threads:
            notes.append(f"capped at {max_threads} threads per rank (the lab's layers gain nothing from more; "
                         "LAB_THREADS_PER_RANK overrides)")
    elif threads_per_rank * nranks <= usable:
        threads = threads_per_rank
    else:
        threads = usable // nranks
        notes.append(f"{threads_per_rank} threads per rank were asked for, {threads} fit")
    ranks = _assign(cores, nranks, threads, gpu_nodes)
    near = [r for r, rank in enumerate(ranks) if r < len(gpu_nodes) and {n for n, _, _ in rank} == {gpu_nodes[r]}]
    if near:
        notes.append(f"{len(near)} rank(s) on their GPU's NUMA node")
    taken = {c for rank in ranks for _, _, cpus in rank for c in cpus}
    spare = tuple(c for c in every if c not in taken)
    nodes = tuple(tuple(sorted({n for n, _, _ in rank})) for rank in ranks)
    if not pin:
        return Placement(threads, (every,) * nranks, (tuple(sorted({n for n, _, _ in cores})),) * nranks, (), False,
                         f"{nranks} rank(s) x {threads} thread(s) on {where}; not pinned (LAB_PIN_CPU=0)"
                         + "".join(f"; {n}" for n in notes))
    rank_cpus = tuple(tuple(sorted(c for _, _, cpus in rank for c in cpus)) for rank in ranks)
    shown = [f"rank {r} CPUs {format_cpulist(cpus)} (node {','.join(map(str, ns))})"
             for r, (cpus, ns) in enumerate(zip(rank_cpus, nodes))]
    free_cores = usable - threads * nranks
    text = (f"{nranks} rank(s) x {threads} thread(s) on {where}, pinned: {_short(shown)}; "
            + (f"{free_cores} core(s) left to gloo's threads and the notebook" if free_cores else "no core left over")
            + "".join(f"; {n}" for n in notes))
    return Placement(threads, rank_cpus, nodes, spare, True, text)


def _env_threads() -> int | None:
    raw = os.environ.get("LAB_THREADS_PER_RANK", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise LabInputError(f"LAB_THREADS_PER_RANK={raw!r} must be a whole number >= 1")
    return int(raw)


def machine_placement(nranks: int, threads_per_rank: int | None = None, layout=None,
                      gpu_nodes: tuple[int, ...] | None = None) -> Placement:
    """`plan_placement` for this machine (`cpu_layout()`, this process's CPUs), with the
    environment's settings: LAB_PIN_CPU=0 turns pinning off, LAB_THREADS_PER_RANK=N replaces
    the planned thread count when `threads_per_rank` is None. `gpu_nodes`: each rank's GPU's
    NUMA node (the launcher reads them from NVML)."""
    if threads_per_rank is None:
        threads_per_rank = _env_threads()
    return plan_placement(layout or cpu_layout(), nranks, threads_per_rank,
                          pin=os.environ.get("LAB_PIN_CPU", "1") != "0", gpu_nodes=gpu_nodes)


def set_rank_threads(placement: Placement) -> None:
    """torch's intra-op thread count for this rank (call before any parallel work)."""
    torch.set_num_threads(placement.threads_per_rank)


def pin_rank(placement: Placement, local_rank: int) -> None:
    """Pin this rank as planned (no-op when not pinned). Call it after the process group is up,
    from the thread that will compute: it gets the rank's CPUs (so do the OpenMP workers it
    starts later); the threads already running (torch.distributed's) get the rank's CPUs plus
    the spare ones, or every CPU when that is one CPU (see the module docstring)."""
    if not placement.pinned or not hasattr(os, "sched_setaffinity"):
        return
    own = placement.cpus_for(local_rank)
    helpers = own | set(placement.spare_cpus)
    if len(helpers) < 2:
        helpers = os.sched_getaffinity(0)
    me = threading.get_native_id()
    try:
        others = [int(t) for t in os.listdir("/proc/self/task") if int(t) != me]
    except OSError:
        others = []
    for tid in others:
        try:
            os.sched_setaffinity(tid, helpers)
        except OSError:  # the thread ended meanwhile
            pass
    os.sched_setaffinity(0, own)


# --- this machine's CPUs, read from /sys and cgroups (lscpu as a fallback) -------------------------
# This machine's CPUs: logical CPUs, physical cores, NUMA nodes and the CPU quota, read from /sys
# and cgroups (lscpu as a fallback). What labutils.measure.placement divides between ranks; notebooks 00
# and 01 print it.

@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id, its CPUs as the kernel lists them ("0-23,48-71") and their count."""

    node: int
    cpulist: str
    cpus: int


@dataclass(frozen=True)
class LogicalCpu:
    """One logical CPU (what `os.sched_setaffinity` takes): its physical core, named by the lowest
    CPU id among its SMT siblings (thread_siblings_list), its NUMA node and its socket."""

    cpu: int
    core: int
    node: int
    socket: int


@dataclass(frozen=True)
class CpuLayout:
    """Cores, sockets and NUMA nodes of this machine; `source` says where it was read.

    `cpus`, `sockets` and `numa_nodes` describe the whole machine. `logical` lists the CPUs this
    process may run on (its affinity mask; a container often gets a few of the host's), one
    entry each, with core and node: what `labutils.measure.placement` divides between ranks.
    `quota_cpus` is the cgroup CPU quota in CPUs (`cpu.max` quota / period; None when unlimited):
    a container may see every CPU of the host yet be allowed the time of only a few.
    """

    cpus: int
    sockets: int
    numa_nodes: tuple[NumaNode, ...]
    source: str
    logical: tuple[LogicalCpu, ...] = ()
    quota_cpus: float | None = None

    @property
    def physical_cores(self) -> int:
        """Physical cores among `logical` (SMT siblings counted once)."""
        return len({c.core for c in self.logical})

    @property
    def smt(self) -> bool:
        """Whether some core of `logical` runs more than one logical CPU (Hyper-Threading, SMT)."""
        return self.physical_cores < len(self.logical)


def count_cpulist(cpulist: str) -> int:
    """Number of CPUs in a kernel cpulist: "0-3,8-11" -> 8, "" -> 0."""
    return len(parse_cpulist(cpulist))


def parse_cpulist(cpulist: str) -> list[int]:
    """The CPU ids of a kernel cpulist, ascending: "0-2,8" -> [0, 1, 2, 8]; LabInputError for text
    the kernel does not write ("a-b", "3-1", "0 0")."""
    cpus: set[int] = set()
    for part in filter(None, str(cpulist).strip().split(",")):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
            raise LabInputError(f"cpulist={cpulist!r:.60} is not a kernel CPU list such as '0-3,8'")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def format_cpulist(cpus) -> str:
    """The kernel's short form of a set of CPU ids: [0, 1, 2, 8] -> "0-2,8"."""
    ids, parts = sorted(set(cpus)), []
    for i in ids:
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _read(path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def cpu_quota(sys_root: str = "/sys", cgroup_text: str | None = None) -> float | None:
    """The cgroup CPU quota in CPUs (quota / period), or None when there is none.

    cgroup v2: `<sys_root>/fs/cgroup/<own path>/cpu.max` ("max 100000" or "400000 100000");
    cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 = none). The own path comes from
    /proc/self/cgroup (`cgroup_text`; read only for the real /sys), else the root is tried.
    """
    from pathlib import Path

    if cgroup_text is None:
        cgroup_text = _read(Path("/proc/self/cgroup")) if sys_root == "/sys" else ""
    v2, v1 = "", ""
    for line in cgroup_text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path.strip("/")
        elif "cpu" in controllers.split(","):
            v1 = path.strip("/")
    root = Path(sys_root) / "fs" / "cgroup"
    for d in dict.fromkeys([root / v2, root]):
        quota, _, period = _read(d / "cpu.max").partition(" ")
        if quota and quota != "max" and period:
            return int(quota) / int(period)
    for base in (root / "cpu", root / "cpu,cpuacct"):
        for d in dict.fromkeys([base / v1, base]):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0:
                return int(quota) / int(period)
    return None


def cpu_layout(sys_root: str = "/sys", allowed=None) -> CpuLayout:
    """Read NUMA nodes from <sys_root>/devices/system/node, each CPU's physical core from
    cpu*/topology/thread_siblings_list and its socket from physical_package_id; fall back to
    `lscpu -p` where /sys is not there, and to one node with os.cpu_count().

    `allowed`: the CPUs this process may use; default its affinity mask for the real /sys and
    every CPU listed for any other `sys_root` (a faked tree in tests).
    """
    import os
    from pathlib import Path

    root = Path(sys_root) / "devices" / "system"
    if allowed is None and sys_root == "/sys" and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
    nodes, node_of = [], {}
    for d in sorted((root / "node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = _read(d / "cpulist")
        nodes.append(NumaNode(int(d.name[4:]), cpulist, count_cpulist(cpulist)))
        node_of.update({cpu: int(d.name[4:]) for cpu in parse_cpulist(cpulist)})
    if not nodes:
        return _lscpu_layout(allowed)
    logical = []
    for d in sorted((root / "cpu").glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        cpu = int(d.name[3:])
        if cpu not in node_of and not (d / "topology").is_dir():
            continue  # offline or absent
        siblings = parse_cpulist(_read(d / "topology" / "thread_siblings_list")) or [cpu]
        socket = _read(d / "topology" / "physical_package_id")
        logical.append(LogicalCpu(cpu, min(siblings), node_of.get(cpu, 0), int(socket) if socket.lstrip("-").isdigit()
                                  else 0))
    if not logical:  # node lists but no cpu directories: one core per listed CPU
        logical = [LogicalCpu(cpu, cpu, node, 0) for cpu, node in sorted(node_of.items())]
    if allowed is not None:
        logical = [c for c in logical if c.cpu in set(allowed)]
    cpus = sum(n.cpus for n in nodes) or (os.cpu_count() or 1)
    packages = {_read(p) for p in (root / "cpu").glob("cpu[0-9]*/topology/physical_package_id")}
    return CpuLayout(cpus, max(1, len(packages)), tuple(n for n in nodes if n.cpus), f"{root}",
                     tuple(logical), cpu_quota(sys_root))


def _lscpu_layout(allowed=None) -> CpuLayout:
    import os
    import subprocess

    try:
        out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    rows = [line.split(",") for line in out.splitlines() if line and not line.startswith("#")]
    if not rows:
        n = os.cpu_count() or 1
        logical = tuple(LogicalCpu(c, c, 0, 0) for c in range(n) if allowed is None or c in set(allowed))
        return CpuLayout(n, 1, (NumaNode(0, f"0-{n - 1}", n),), "os.cpu_count()", logical)
    by_node: dict[int, list[int]] = {}
    logical = []
    for cpu, core, socket, node in rows:
        by_node.setdefault(int(node or 0), []).append(int(cpu))
        # CORE is numbered per machine by lscpu; key it by socket too, named by its first CPU below
        logical.append((int(cpu), (int(socket or 0), int(core or cpu)), int(node or 0), int(socket or 0)))
    first = {}
    for cpu, key, _, _ in logical:
        first.setdefault(key, cpu)
    cpus = tuple(LogicalCpu(cpu, first[key], node, socket) for cpu, key, node, socket in logical
                 if allowed is None or cpu in set(allowed))
    nodes = tuple(NumaNode(k, format_cpulist(v), len(v)) for k, v in sorted(by_node.items()))
    return CpuLayout(len(rows), len({r[2] for r in rows}), nodes, "lscpu -p", cpus)
