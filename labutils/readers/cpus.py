"""This machine's CPUs: logical CPUs, physical cores, NUMA nodes and the CPU quota, read from /sys
and cgroups (lscpu as a fallback). What labutils.measure.placement divides between ranks; notebooks 00
and 01 print it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """The CPU ids of a kernel cpulist, ascending: "0-2,8" -> [0, 1, 2, 8]."""
    cpus: set[int] = set()
    for part in filter(None, cpulist.strip().split(",")):
        lo, _, hi = part.partition("-")
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
