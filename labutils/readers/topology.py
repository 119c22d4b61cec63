"""What joins the devices: `nvidia-smi topo -m` read into a frozen Topology (`parse_topology`, the
shipped samples in data/topologies/), each GPU pair's path classified in plain words (`classify`,
`pair_path`), the route its bytes take (`path_route` for a copy, `nccl_route` for NCCL: peer-to-peer,
or through host memory), the bandwidth that path can carry from `data/link_table.csv`
(`expected_figure`), the pair or group a ring should use (`choose_pair`, `group_bottleneck`), the
live machine (nvidia-smi, NVML: `live_topology`, `nvml_facts`, a GPU's own PCIe link `host_link`)
and the `topo` command.

Link codes of `nvidia-smi topo -m`, fastest first:
    NV#  a bonded set of # NVLinks (directly or through NVSwitch)
    PIX  at most one PCIe bridge (the same PCIe switch)
    PXB  several PCIe bridges, not through the CPU's host bridge
    PHB  through a PCIe host bridge (the CPU's root complex)
    NODE between PCIe host bridges within one NUMA node
    SYS  across NUMA nodes: PCIe plus the socket-to-socket link (QPI/UPI); older drivers say SOC
A ring all-reduce moves every byte over every link of the ring, so its busbw is bounded by the
slowest path in the ring: pick GPUs whose paths are all fast.

When NCCL goes peer-to-peer (NCCL 2.30.7, src/graph/paths.cc, `ncclTopoCheckP2p`; `nccl_route`):
the default level `p2pLevel` is PATH_PXB (one or several PCIe switches, never a CPU), raised to
PATH_SYS on an x86 AMD CPU when the machine has at most two GPUs; NCCL_P2P_LEVEL (LOC, NVL, PIX,
PXB, PHB, SYS, ...; legacy integers 0-5) replaces the default and NCCL_P2P_DISABLE=1 sets it to LOC
(no peer-to-peer at all). A pair whose path is no further than the level goes peer-to-peer only if
the driver allows it: NVML's peer status, read and write (nvmlDeviceGetP2PStatus), must be OK, and
the P2P transport (src/transport/p2p.cc, `p2pCanConnect`) checks cudaDeviceCanAccessPeer too.
GeForce cards get no PCIe peer access from the driver, so they never go peer-to-peer over PCIe
whatever the level. Every other pair is diverted through the CPU (`addInterStep`): NCCL's SHM
transport copies GPU -> host memory -> GPU. nvidia-smi's PHB and NODE are both NCCL's PATH_PHB.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import pandas as pd

from labutils.core.inputs import LabInputError, check_choice
from labutils.core.results import DATA_DIR
from labutils.readers.links import LinkFigure, link_figure, link_figures, nvlink_figure, pcie_figure, range_kind
from labutils.readers.nvml import GpuFacts, nvml_facts
from labutils.readers.pcie import GT_PER_LANE, WIDTHS, pcie_band, scale_to_pcie
from labutils.readers.sources import read_text, run_nvidia_smi

# ---- the matrix ------------------------------------------------------------------------------

SAMPLES_DIR = DATA_DIR / "topologies"
DEFAULT_PCIE_GEN = 4
ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CODE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
MAX_NVLINKS = 64  # bonded NVLinks between two GPUs: 18 on today's largest parts; more is a corrupt file
# GPUs one `nvidia-smi topo -m` can show: the GPUs of one host (8 on HGX/DGX boards, 16 on a DGX-2, up to
# 20-32 on the largest PCIe-switch and composable hosts; an NVL72 rack's node shows its own 4). More than
# 64 is no machine's matrix (a generated or pasted-together file), and would take minutes to classify.
MAX_GPUS = 64
MAX_DEVICES = 256  # GPU and NIC columns together (a DGX H100 prints 8 GPUs and 10-12 NICs)
_DEVICE = re.compile(r"^[A-Za-z][\w.:-]*\d$")  # GPU0, NIC3, mlx5_0: a device name ends in a digit
_P2P_STATUS = ("OK", "CNS", "GNS", "TNS", "NS", "DR", "U")  # the codes of `nvidia-smi topo -p2p r|w|rw|n|a`
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")

class TopologyParseError(LabInputError):
    """`nvidia-smi topo -m` text that cannot be read; the message names the line and why."""

    def __init__(self, line_no: int | None, why: str):
        where = f"line {line_no}: " if line_no is not None else ""
        super().__init__(f"topology text, {where}{why}")
        self.line_no = line_no


@dataclass(frozen=True)
class Topology:
    """The matrix of `nvidia-smi topo -m`.

    `devices` are the header's columns in order (GPUs first, then NICs); `matrix[i][j]` is the
    link code between devices i and j. The per-GPU tuples hold CPU affinity ("0-23,48-71"),
    NUMA affinity and GPU NUMA ID as printed (None where absent or "N/A"). `nic_names` pairs
    NIC columns with the NIC legend's device names (("NIC0", "mlx5_0"), ...).
    """

    devices: tuple[str, ...]
    matrix: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str | None, ...]
    numa_affinity: tuple[str | None, ...]
    gpu_numa_id: tuple[str | None, ...]
    nic_names: tuple[tuple[str, str], ...] = ()
    attributes: tuple[str, ...] = ()
    source: str = ""

    @cached_property
    def gpus(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if re.fullmatch(r"GPU\d+", d))

    @cached_property
    def _index(self) -> dict[str, int]:
        """Device name -> its row, built once (a link is looked up for every pair)."""
        return {d: i for i, d in enumerate(self.devices)}

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if d not in self.gpus)

    def link(self, a: str | int, b: str | int) -> str:
        """The code between two devices, given as names ("GPU0") or GPU indices."""
        return self.matrix[self._index[device_name(self, a)]][self._index[device_name(self, b)]]

    def gpu_links(self) -> dict[str, dict[str, str]]:
        """{"GPU0": {"GPU1": "PHB", ...}, ...} without the diagonal."""
        return {a: {b: self.link(a, b) for b in self.gpus if b != a} for a in self.gpus}

    def nic_name(self, nic: str) -> str:
        return dict(self.nic_names).get(nic, nic)


def device_name(topo: Topology, device: str | int) -> str:
    """The name of a device given as a name ("GPU0") or a GPU index; LabInputError if absent."""
    name = f"GPU{device}" if isinstance(device, int) else str(device)
    if name not in topo._index:
        raise LabInputError(f"device={device!r} is not one of: {', '.join(topo.devices)}")
    return name


def strip_ansi(text: str) -> str:
    """Remove terminal colour/underline/bold codes (nvidia-smi underlines its header)."""
    return _ANSI.sub("", text)


def _header(line: str, line_no: int) -> tuple[list[str], list[str]]:
    """Device columns and attribute columns of the header line."""
    cut = min([line.find(a) for a in ATTRIBUTES if a in line] or [len(line)])
    devices = line[:cut].split()
    attrs = sorted((a for a in ATTRIBUTES if a in line), key=line.find)
    leftover = line[cut:]
    for a in attrs:
        leftover = leftover.replace(a, "", 1)
    if leftover.strip():
        raise TopologyParseError(line_no, f"unknown header column(s) {leftover.split()} after the devices")
    gpus = [d for d in devices if d.startswith("GPU")]
    if len(gpus) > MAX_GPUS:
        raise TopologyParseError(line_no, f"the header names {len(gpus)} GPUs, more than one machine's "
                                          f"`nvidia-smi topo -m` shows (one host's GPUs; this reader takes at most "
                                          f"{MAX_GPUS})")
    if len(devices) > MAX_DEVICES:
        raise TopologyParseError(line_no, f"the header names {len(devices)} devices, more than one machine's "
                                          f"`nvidia-smi topo -m` shows (this reader takes at most {MAX_DEVICES})")
    bad = [i for i, d in enumerate(devices) if not _DEVICE.match(d)]
    if bad and not any(_DEVICE.match(d) for d in devices[bad[0]:]):  # words where the attributes belong
        raise TopologyParseError(line_no, f"header column(s) {' '.join(devices[bad[0]:])!r} after the devices are "
                                          f"not nvidia-smi's ({', '.join(ATTRIBUTES)}): renamed or cut")
    if bad:
        raise TopologyParseError(line_no, f"header column {devices[bad[0]]!r} is not a device name (a matrix "
                                          "abbreviated or quoted? give the output as nvidia-smi printed it)")
    if gpus != [f"GPU{i}" for i in range(len(gpus))] or devices[:len(gpus)] != gpus:
        raise TopologyParseError(line_no, f"GPU columns must come first as GPU0, GPU1, ... in order, got {gpus}")
    return devices, attrs


def _find_header(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        tokens = line.split()
        if "GPU0" in tokens and not any(_CODE.match(t) for t in tokens):
            return i
    raise TopologyParseError(None, "no header line naming GPU0 (is this `nvidia-smi topo -m` output?)")


def parse_topology(text: str, source: str = "text") -> Topology:
    """Read `nvidia-smi topo -m` output: tab- or space-separated, with or without ANSI codes,
    NIC rows, NUMA columns or NIC legend. Raises TopologyParseError naming the line and why."""
    lines = strip_ansi(text).replace("\r", "").splitlines()
    h = _find_header(lines)
    devices, attrs = _header(lines[h], h + 1)
    n = len(devices)
    rows: dict[str, tuple[list[str], list[str], int]] = {}
    end = h + 1
    for end in range(h + 1, len(lines) + 1):
        if end == len(lines) or not lines[end].strip() or lines[end].strip().startswith("Legend"):
            break
        line_no, tokens = end + 1, lines[end].split()
        name = tokens[0]
        if name not in devices:
            raise TopologyParseError(line_no, f"row {name!r} is not one of the header's columns {devices}")
        if name in rows:
            raise TopologyParseError(line_no, f"row {name} appears twice")
        cells, rest = tokens[1:1 + n], tokens[1 + n:]
        if len(cells) < n:
            raise TopologyParseError(line_no, f"row {name} has {len(cells)} link cell(s); the header names {n} devices")
        for col, code in zip(devices, cells):
            if not _CODE.match(code):
                p2p = " (this looks like `nvidia-smi topo -p2p` peer status, not `topo -m`)" * (code in _P2P_STATUS)
                raise TopologyParseError(line_no, f"unknown link code {code!r} in row {name}, column {col} "
                                                  f"(expected X, NV#, PIX, PXB, PHB, NODE or SYS){p2p}")
            if code.startswith("NV") and not 1 <= int(code[2:]) <= MAX_NVLINKS:
                raise TopologyParseError(line_no, f"link code {code!r} in row {name}, column {col} names "
                                                  f"{int(code[2:])} NVLinks; "
                                                  f"the allowed range is NV1 to NV{MAX_NVLINKS}")
        if len(rest) > len(attrs):
            raise TopologyParseError(line_no, f"row {name} has {len(rest)} cell(s) after the link columns "
                                              f"but the header names {len(attrs)}: {list(attrs)}")
        rows[name] = (cells, rest, line_no)
    gpus = [d for d in devices if d.startswith("GPU")]
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise TopologyParseError(end + 1, f"the matrix ends before the row(s) of {missing}")
    matrix = _square(devices, rows)
    info = {g: dict(zip(attrs, [None if v == "N/A" else v for v in rows[g][1]])) for g in gpus}
    legend = tuple((m.group(1), m.group(2)) for m in map(_NIC_LEGEND.match, lines[end:]) if m)
    return Topology(
        devices=tuple(devices), matrix=matrix,
        cpu_affinity=tuple(info[g].get("CPU Affinity") for g in gpus),
        numa_affinity=tuple(info[g].get("NUMA Affinity") for g in gpus),
        gpu_numa_id=tuple(info[g].get("GPU NUMA ID") for g in gpus),
        nic_names=legend, attributes=tuple(attrs), source=source)


def _square(devices: list[str], rows: dict) -> tuple[tuple[str, ...], ...]:
    """The full matrix; a NIC row that is absent is read from its column ("?" between two such
    NICs). Checks the diagonal and symmetry."""
    n = len(devices)
    grid = [[rows[d][0][j] if d in rows else None for j in range(n)] for d in devices]
    for i, j in itertools.product(range(n), range(n)):
        if grid[i][j] is None:
            grid[i][j] = "X" if i == j else rows[devices[j]][0][i] if devices[j] in rows else "?"
    for i, d in enumerate(devices):
        line_no = rows[d][2] if d in rows else None
        if grid[i][i] != "X":
            raise TopologyParseError(line_no, f"row {d} must read X against itself, got {grid[i][i]!r}")
        for j in range(i):
            if grid[i][j] == "X":
                raise TopologyParseError(line_no, f"row {d} reads X against {devices[j]} (X means the device itself)")
            if grid[i][j] != grid[j][i]:
                raise TopologyParseError(line_no, f"{d}-{devices[j]} reads {grid[i][j]} but {devices[j]}-{d} "
                                                  f"reads {grid[j][i]}; the matrix must be symmetric")
    return tuple(tuple(r) for r in grid)


# ---- the shipped samples --------------------------------------------------------------------

def list_samples() -> list[str]:
    """Names of the shipped samples in data/topologies/ (file stems)."""
    return sorted(p.stem for p in SAMPLES_DIR.glob("*.txt"))


def sample_facts() -> pd.DataFrame:
    """data/topologies/samples.csv: name, title, gpu, pcie_gen, modelled_on."""
    return pd.read_csv(SAMPLES_DIR / "samples.csv")


def sample_pcie_gen(name: str) -> int:
    facts = sample_facts().set_index("name")
    return int(facts.loc[name, "pcie_gen"]) if name in facts.index else DEFAULT_PCIE_GEN


def read_topology_file(path: str | Path) -> Topology:
    """Parse a saved `nvidia-smi topo -m` output; a bare sample name (e.g. "two_gpu_sys") also works."""
    if str(path) in list_samples() and not Path(str(path)).exists():
        path = SAMPLES_DIR / f"{path}.txt"
    hint = f"; give a saved `nvidia-smi topo -m` or a sample: {', '.join(list_samples())}"
    return parse_topology(read_text(path, "file", hint), source=str(path))


def load_sample(name: str) -> Topology:
    check_choice("sample", name, list_samples())
    return read_topology_file(SAMPLES_DIR / f"{name}.txt")


# ---- paths: what each code means and carries ----------------------------------------------

# code -> (speed rank, higher is faster; the short name of the path; the path in plain words)
PATHS = {
    "PIX": (5, "same PCIe switch", "at most one PCIe bridge between them: peer traffic turns round "
            "inside one PCIe switch and never reaches the CPU"),
    "PXB": (4, "across PCIe switches", "several PCIe bridges (a tree of switches) between them, "
            "still without passing through the CPU's host bridge"),
    "PHB": (3, "through the host bridge", "traffic climbs to the CPU's PCIe root complex (host "
            "bridge) and back down to the other GPU"),
    "NODE": (2, "across host bridges, one NUMA node", "traffic crosses from one PCIe host bridge to "
             "another inside the same CPU socket"),
    "SYS": (1, "across NUMA nodes / sockets", "traffic crosses PCIe and the socket-to-socket link "
            "(QPI/UPI/Infinity Fabric): the slowest path inside one machine"),
}


@dataclass(frozen=True)
class PairPath:
    """One GPU pair: its code, path class, plain-language description, expected range (decimal
    GB/s per direction) with the table row it came from, and its route ("NVLink", "peer-to-peer"
    or "through host memory", see `path_route`)."""

    a: str
    b: str
    code: str
    path_class: str
    rank: int
    nvlinks: int
    description: str
    low_GBps: float
    high_GBps: float
    reference: str
    route: str = ""


P2P_BY_DEFAULT = ("PIX", "PXB")  # NCCL's default P2P level is PXB (src/graph/paths.cc)
HOST_MEMORY = "through host memory"
# NCCL's path types in order (src/graph/topo.h topoPathTypeStr); NCCL_P2P_LEVEL names one of them
NCCL_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS")
NCCL_LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # NCCL_P2P_LEVEL=0..5 (levelsOldToNew)


def nccl_level_of(code: str) -> str:
    """NCCL's path type for a `nvidia-smi topo -m` code: NV# is NVL, NODE is PHB (NCCL joins a
    NUMA node's PCIe trees at one CPU node), SOC is SYS, the others are their own names."""
    code = _code(code)
    return "NVL" if code.startswith("NV") else "PHB" if code == "NODE" else code


def nccl_p2p_level(cpu_vendor: str | None = None, n_gpus: int | None = None, env: dict | None = None) -> str | None:
    """The furthest path NCCL lets go peer-to-peer (`ncclTopoCheckP2p`, NCCL 2.30.7): NCCL_P2P_DISABLE=1
    gives "LOC"; else NCCL_P2P_LEVEL (a name of NCCL_LEVELS or a legacy integer, clamped to 5); else
    "SYS" on an AMD CPU with at most two GPUs, "PXB" otherwise. None when the default depends on
    what is not known (`cpu_vendor` or `n_gpus` None)."""
    env = env or {}
    if str(env.get("NCCL_P2P_DISABLE", "")).strip() == "1":
        return "LOC"
    level = str(env.get("NCCL_P2P_LEVEL", "")).strip().upper()
    if level in NCCL_LEVELS:
        return level
    if level[:1].isdigit():
        digits = re.match(r"\d+", level).group()
        return NCCL_LEGACY_LEVELS[min(int(digits), len(NCCL_LEGACY_LEVELS) - 1)]
    if cpu_vendor is None or n_gpus is None:
        return None
    return "SYS" if cpu_vendor.strip().lower() in ("amd", "authenticamd") and n_gpus <= 2 else "PXB"


def nccl_route(code: str, peer_access: bool | None = None, cpu_vendor: str | None = None,
               n_gpus: int | None = None, env: dict | None = None) -> str:
    """The route NCCL gives a GPU pair's bytes: "NVLink", "peer-to-peer", "through host memory", or
    "peer-to-peer or through host memory" when it depends on what is not known.

    Peer-to-peer when the path is no further than `nccl_p2p_level(cpu_vendor, n_gpus, env)` and the
    driver offers peer access (`peer_access`: torch.cuda.can_device_access_peer or the p2p matrix;
    None: not known); through host memory (SHM) otherwise. See the module docstring."""
    level = nccl_p2p_level(cpu_vendor, n_gpus, env)
    mine = NCCL_LEVELS.index(nccl_level_of(code))
    if level is None:  # the default depends on the CPU: PXB everywhere, SYS on AMD with two GPUs
        near = True if mine <= NCCL_LEVELS.index("PXB") else None
    else:
        near = mine <= NCCL_LEVELS.index(level)
    if near is False or peer_access is False:
        return HOST_MEMORY
    if near is None or peer_access is None:
        return "peer-to-peer or " + HOST_MEMORY
    return "NVLink" if _code(code).startswith("NV") else "peer-to-peer"


def _code(code) -> str:
    """A link code as a string, SOC read as SYS; LabInputError naming it when it is no string."""
    if not isinstance(code, str) or not code.strip():
        raise LabInputError(f"code={code!r} is not a link code (NV#, PIX, PXB, PHB, NODE or SYS)")
    code = code.strip()
    return "SYS" if code == "SOC" else code


def _nvlinks(code) -> int:
    """The # of an NV# code, or LabInputError naming the code (NV1 to NV{MAX_NVLINKS})."""
    digits = str(code)[2:]
    if not digits.isdigit() or not 1 <= int(digits) <= MAX_NVLINKS:
        raise LabInputError(f"code={code!r} is not an NVLink code NV1 to NV{MAX_NVLINKS}")
    return int(digits)


def path_route(code: str, p2p: bool | None = None) -> str:
    """How a copy between two GPUs travels: "NVLink", "peer-to-peer" or "through host memory".

    `p2p` is whether the driver gives the two GPUs peer access (torch.cuda.can_device_access_peer
    on a live machine): with it a copy goes GPU to GPU, without it every byte is copied GPU -> host
    memory -> GPU. None means unknown, and then the route is NCCL's default on a machine that does
    not raise its level (`nccl_route`): peer-to-peer up to PXB (one or several PCIe switches),
    through host memory beyond (PHB, NODE, SYS). NCCL's own choice needs more than `p2p`: `nccl_route`.
    """
    code = _code(code)
    if code.startswith("NV"):
        return "NVLink"
    if p2p is None:
        p2p = code in P2P_BY_DEFAULT
    return "peer-to-peer" if p2p else HOST_MEMORY


def expected_figure(code: str, pcie_gen: int = DEFAULT_PCIE_GEN, p2p: bool | None = None,
                    width: int = 16) -> LinkFigure:
    """The table's range (GB/s per direction) for one link code on PCIe `pcie_gen` x`width`.

    NV#: `nvlink_figure(#)`. PIX, PXB, PHB, NODE: their own rows (the PCIe link's rate) when the
    pair goes peer-to-peer, the "through host memory" row (half to all of a clean link's typical
    figure) when it does not (`path_route`); the figure's name says the route. SYS, either route:
    low = the source article's measured 22 GB/s on PCIe 5.0 x16 (two GeForce cards, so through host
    memory; 22 of 63, carried to other links by the specification's ratio), high = a clean link's
    typical figure (~50 GB/s on PCIe 5.0 x16). Rows stated for PCIe 5.0 x16 are carried over by
    `pcie.scale_to_pcie`.
    """
    code = _code(code)
    try:
        return _expected_figure(code, pcie_gen, p2p, width)
    except TypeError:  # an unhashable argument: computed without the cache, to fail or succeed as it would
        return _expected_figure.__wrapped__(code, pcie_gen, p2p, width)


@lru_cache(maxsize=1024, typed=True)
def _expected_figure(code: str, pcie_gen: int, p2p: bool | None, width: int) -> LinkFigure:
    """`expected_figure`, computed once per argument set (a matrix asks for it once per GPU pair,
    and the link table's rows are read anew on every call)."""
    pcie_band(pcie_gen, width)  # checks both; a whole float (4.0) is that generation, named "PCIe 4.0"
    pcie_gen, width = int(pcie_gen), int(width)
    if code.startswith("NV"):
        return nvlink_figure(_nvlinks(code))
    if code not in PATHS:
        raise LabInputError(f"code={code!r} is not a GPU-to-GPU link code (X excluded)")
    way = path_route(code, p2p)
    if code == "SYS":

        row = link_figure("PCIe 5.0 x16 across sockets (SYS)")
        this = pcie_band(pcie_gen, width)
        low = round(this.high_GBps * row.low_GBps / pcie_figure(5).high_GBps, 3)
        return LinkFigure(f"SYS across sockets (PCIe {pcie_gen}.0 x{width})", "SYS", low, this.low_GBps,
                          range_kind("measured busbw", this.low_kind),
                          f"{row.source}; carried to PCIe {pcie_gen}.0 x{width} by its specification's ratio "
                          f"(22 of 63 GB/s); high end: the low end of {this.name} ({this.low_kind})",
                          "measured busbw")
    if way == HOST_MEMORY:
        host = next(f for f in link_figures("HOST"))
        fig = scale_to_pcie(host, pcie_gen, width)
        return LinkFigure(f"{code} {fig.name}", code, fig.low_GBps, fig.high_GBps, fig.kind, fig.source, fig.low_kind)
    return scale_to_pcie(next(f for f in link_figures(code)), pcie_gen, width)


def path_table(pcie_gen: int = DEFAULT_PCIE_GEN, width: int = 16) -> pd.DataFrame:
    """The legend with its expectations: per code (NV#, PIX, PXB, PHB, NODE, SYS) the path in
    words, the route NCCL takes by default (`nccl_route` with the CPU not known), the range (GB/s
    per direction on PCIe `pcie_gen` x `width`; NV# for a pair of consumer cards bridged by 4
    links) and where the figures come from."""
    rows = []
    for code in ("NV4", *PATHS):
        rank, short, words, _ = classify(code)
        fig = expected_figure(code, pcie_gen, None, width)
        rows.append({"code": "NV#" if code.startswith("NV") else code, "path": short, "what the bytes cross": words,
                     "route by default": _default_route(code), "low_GBps": fig.low_GBps, "high_GBps": fig.high_GBps,
                     "from": fig.name, "source": fig.source})
    return pd.DataFrame(rows).set_index("code")


def _default_route(code: str) -> str:
    """NCCL's route with peer access offered and the CPU not known, in words."""
    route = nccl_route(code, True)
    amd = f"{HOST_MEMORY}; peer-to-peer on an AMD CPU with 2 GPUs"
    return amd if route == "peer-to-peer or " + HOST_MEMORY else route


def classify(code: str) -> tuple[int, str, str, int]:
    """(speed rank, class name, plain-language description, NVLink count) for one code."""
    code = _code(code)
    if code.startswith("NV"):
        links = _nvlinks(code)
        return (100 + links, f"NVLink x{links}", f"{links} bonded NVLink(s) joining the two GPUs directly "
                f"(or through NVSwitch): traffic never touches PCIe or the CPU", links)
    if code not in PATHS:
        raise LabInputError(f"code={code!r} is not a GPU-to-GPU link code (X excluded)")
    rank, short, words = PATHS[code]
    return rank, short, words, 0


def pair_path(topo: Topology, a: str | int, b: str | int, pcie_gen: int = DEFAULT_PCIE_GEN,
              p2p: bool | None = None, width: int = 16) -> PairPath:
    """The path between GPUs `a` and `b`; `p2p` is their peer access when known (see `path_route`)."""
    a, b = device_name(topo, a), device_name(topo, b)
    code = topo.link(a, b)
    if code == "X":
        raise LabInputError(f"pair=({a}, {b}) names the same device twice")
    rank, short, words, links = classify(code)
    fig = expected_figure(code, pcie_gen, p2p, width)
    way = path_route(code, p2p)
    if way == HOST_MEMORY:
        words += "; without peer-to-peer the bytes are copied through host memory on the way"
    return PairPath(a, b, code, short, rank, links, words, fig.low_GBps, fig.high_GBps, fig.name, way)


def pair_paths(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN) -> list[PairPath]:
    """Every GPU pair (a < b), in matrix order."""
    return [pair_path(topo, a, b, pcie_gen) for a, b in itertools.combinations(topo.gpus, 2)]


@dataclass(frozen=True)
class PairChoice:
    """The pair to pick for a 2-GPU job, the slowest pair in the group, and why."""

    best: PairPath
    worst: PairPath
    reason: str


def choose_pair(topo: Topology, among=None, pcie_gen: int = DEFAULT_PCIE_GEN) -> PairChoice:
    """The fastest-joined pair among `among` (GPU indices or names; all GPUs by default).

    Ties go to the lowest indices. A 2-GPU all-reduce runs over exactly this one path, so its
    busbw is bounded by the path's range.
    """
    names = [device_name(topo, g) for g in (among if among is not None else topo.gpus)]
    if len(set(names)) < 2:
        raise LabInputError(f"among={among!r} must name at least two different GPUs")
    paths = [pair_path(topo, a, b, pcie_gen) for a, b in itertools.combinations(names, 2)]
    best = max(paths, key=lambda p: p.rank)
    worst = min(paths, key=lambda p: p.rank)
    reason = (f"{best.a} and {best.b} are joined by {best.code} ({best.path_class}): {best.description}. "
              f"Expect about {best.low_GBps:g}-{best.high_GBps:g} GB/s per direction ({best.reference}).")
    if worst.rank < best.rank:
        reason += (f" Avoid pairs like {worst.a}-{worst.b} ({worst.code}, {worst.path_class}, "
                   f"{worst.low_GBps:g}-{worst.high_GBps:g} GB/s).")
    return PairChoice(best, worst, reason)


def group_bottleneck(topo: Topology, gpus, pcie_gen: int = DEFAULT_PCIE_GEN) -> PairPath:
    """The slowest path between two members of `gpus`. A ring that spans the group must cross
    from one side of such a path to the other, so this path bounds the group's all-reduce busbw
    (NCCL may order the ring to cross it as few times as possible, never zero times)."""
    return choose_pair(topo, gpus, pcie_gen).worst


# ---- the live machine ----------------------------------------------------------------------

def live_topology(timeout_s: float = 15.0) -> tuple[Topology | None, str]:
    """This machine's topology, or (None, why not)."""
    text, why = run_nvidia_smi(timeout_s)
    return (None, why) if text is None else (parse_topology(text, source="nvidia-smi topo -m"), "")


# ---- NVML facts (GPU machines) ------------------------------------------------------------

def pcie_gen_of(facts: list[GpuFacts]) -> int:
    """The PCIe generation to assume: the lowest max generation among the GPUs, within 3..5."""
    gens = [f.pcie_gen_max for f in facts if f.pcie_gen_max]
    return min(5, max(3, min(gens))) if gens else DEFAULT_PCIE_GEN


@dataclass(frozen=True)
class HostLink:
    """The PCIe link of one GPU as the expectations use it: generation and width (the link's
    maximum for this GPU in this slot, which it trains up to under load), what NVML read right
    now, and a note when the two differ or a figure had to be assumed."""

    gpu: int
    gen: int
    width: int
    current_gen: int | None
    current_width: int | None
    note: str = ""

    @property
    def label(self) -> str:
        return f"PCIe {self.gen}.0 x{self.width}"


def host_link(facts: GpuFacts | None, gpu: int = 0, default_gen: int = DEFAULT_PCIE_GEN) -> HostLink:
    """GPU `gpu`'s PCIe link from NVML's facts (a pure function: the facts are passed in).

    Generation and width are NVML's maxima for this GPU in this slot (nvmlDeviceGetMaxPcieLink*:
    the lower of what the GPU and the slot support), falling back to the current values, then to
    PCIe `default_gen`.0 x16 when NVML said nothing; any generation 1-6 (`pcie.pcie_band`). The
    current values are shown beside them: an idle link trains down (e.g. to gen 1) to save power
    and back up under load.
    """
    if facts is not None and not isinstance(facts, GpuFacts):
        raise LabInputError(f"facts={facts!r:.60} is not one GPU's NVML facts: give an element of nvml_facts(), "
                            "or None")
    if facts is None:
        return HostLink(gpu, default_gen, 16, None, None,
                        f"NVML gave no PCIe facts: PCIe {default_gen}.0 x16 assumed")
    notes = []
    gen = facts.pcie_gen_max or facts.pcie_gen
    width = facts.pcie_width_max or facts.pcie_width
    if gen not in GT_PER_LANE:
        told = "no PCIe generation" if gen is None else f"PCIe gen {gen}, which is not one of 1-6"
        notes.append(f"NVML gave {told}: gen {default_gen} assumed")
        gen = default_gen
    if width is None or width < 1:
        width = 16
        notes.append("NVML gave no link width: x16 assumed")
    elif width not in WIDTHS:
        width = max(w for w in WIDTHS if w <= width)
    cur_gen, cur_width = facts.pcie_gen, facts.pcie_width
    if (cur_gen and cur_gen < gen) or (cur_width and cur_width < width):
        notes.append(f"NVML reads gen {cur_gen} x{cur_width} right now: an idle link trains down to save power "
                     f"and back up to gen {gen} x{width} under load")
    return HostLink(gpu, int(gen), int(width), cur_gen, cur_width, "; ".join(notes))


# ---- reports: JSON and text ---------------------------------------------------------------

def summary(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN) -> dict:
    """Everything `topo --json` prints: gpus, links, affinities, NICs, pairs and the pick."""
    gpus = topo.gpus
    out = {
        "source": topo.source,
        "gpus": list(gpus),
        "links": topo.gpu_links(),
        "cpu_affinity": dict(zip(gpus, topo.cpu_affinity)),
        "numa_affinity": dict(zip(gpus, topo.numa_affinity)),
        "gpu_numa_id": dict(zip(gpus, topo.gpu_numa_id)),
        "nics": {n: topo.nic_name(n) for n in topo.nics},
        "nic_links": {g: {n: topo.link(g, n) for n in topo.nics} for g in gpus},
        "pcie_gen_assumed": pcie_gen,
        "pairs": [
            {"a": p.a, "b": p.b, "code": p.code, "class": p.path_class, "description": p.description,
             "route": p.route, "expected_low_GBps": p.low_GBps, "expected_high_GBps": p.high_GBps,
             "reference": p.reference}
            for p in pair_paths(topo, pcie_gen)
        ],
    }
    if len(gpus) >= 2:
        pick = choose_pair(topo, pcie_gen=pcie_gen)
        out["best_pair"] = {"gpus": [pick.best.a, pick.best.b], "code": pick.best.code, "reason": pick.reason}
    return out


def format_matrix(topo: Topology, nics: bool = True) -> str:
    """The matrix as aligned text, NIC columns named by the legend."""
    cols = list(topo.gpus) + (list(topo.nics) if nics else [])
    width = max(6, *(len(topo.nic_name(c)) + 1 for c in cols))
    head = " " * width + "".join(topo.nic_name(c).ljust(width) for c in cols)
    lines = [head.rstrip()]
    for r in cols:
        lines.append((topo.nic_name(r).ljust(width) + "".join(topo.link(r, c).ljust(width) for c in cols)).rstrip())
    return "\n".join(lines)


def describe(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN, pairs: bool = True) -> str:
    """A plain-text report: matrix, each GPU's CPU and NUMA affinity, then (with `pairs`) one line
    per pair and the pick for a 2-GPU job."""
    lines = [f"Topology from {topo.source}: {len(topo.gpus)} GPU(s), {len(topo.nics)} NIC(s)", "",
             format_matrix(topo), ""]
    for g, cpu, numa in zip(topo.gpus, topo.cpu_affinity, topo.numa_affinity):
        lines.append(f"{g}: CPU affinity {cpu or 'n/a'}, NUMA node {numa or 'n/a'}")
    if not pairs:
        return "\n".join(lines)
    lines += ["", f"Each pair (expected GB/s per direction, assuming PCIe {pcie_gen}.0 x16 where PCIe is used, and "
                  "peer-to-peer up to PXB, through host memory beyond, NCCL's default on all but AMD CPUs "
                  "with two GPUs):"]
    for p in pair_paths(topo, pcie_gen):
        lines.append(f"  {p.a}-{p.b}  {p.code:5} {p.path_class:36} "
                     f"{p.low_GBps:>7g} - {p.high_GBps:<7g} ({p.reference})")
    if len(topo.gpus) >= 2:
        lines += ["", "For a 2-GPU job: " + choose_pair(topo, pcie_gen=pcie_gen).reason]
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("topo", help="read nvidia-smi topo -m (or a saved file) and classify each GPU pair")
    p.add_argument("--file", help="a saved `nvidia-smi topo -m` output, or a sample name from data/topologies/")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--pcie-gen", type=int, choices=(3, 4, 5), default=None,
                   help="PCIe generation to assume (default: from NVML, a sample's facts, or 4)")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.file is not None:
        topo = read_topology_file(args.file)
        gen = args.pcie_gen or sample_pcie_gen(Path(args.file).stem)
    else:
        topo, why = live_topology()
        if topo is None:
            print(f"No live topology: {why}.")
            print(f"Nothing is wrong with this machine; study a sample instead, e.g. "
                  "`python -m labutils topo --file two_gpu_sys`. "
                  f"Samples in {SAMPLES_DIR}: {', '.join(list_samples())}")
            return 0
        gen = args.pcie_gen or pcie_gen_of(nvml_facts()[0])
    print(json.dumps(summary(topo, gen), indent=2) if args.json else describe(topo, gen))
    return 0
